package main

import (
	"io"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/servercmd"
)

func TestMCPCommandPrestartUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		has  string
	}{
		{[]string{"--pool", "1", "--pool-prestart", "bash"}, `language "bash" cannot be pre-started`},
		{[]string{"--pool", "1", "--pool-prestart", "python,ruby"}, `language "ruby" is not supported`},
		{[]string{"--pool", "0", "--pool-prestart", "node"}, "--pool-prestart needs --pool"},
	} {
		cmd := servercmd.NewMCPCmd(&cli.Globals{Output: cli.OutputText})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		code, err := execCmd(t, cmd, tt.args)
		if code != cli.ExitUsage || err == nil || !strings.Contains(err.Error(), tt.has) {
			t.Errorf("%v: exit %d, %v; want exit %d mentioning %q", tt.args, code, err, cli.ExitUsage, tt.has)
		}
	}
}
