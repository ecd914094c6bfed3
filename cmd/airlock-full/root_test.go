package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/internal/cli"
)

// Every command is registered under the name and aliases it answers to: run builds only the
// command its arguments name, found by these names, not by building every command.
func TestCommandNames(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range commands {
		cmd := c.New(&cli.Globals{})
		want := append([]string{cmd.Name()}, cmd.Aliases...)
		if !slices.Equal(c.Names, want) {
			t.Errorf("command %s is registered as %q, answers to %q", cmd.Name(), c.Names, want)
		}
		for _, n := range c.Names {
			if seen[n] {
				t.Errorf("two commands registered as %q", n)
			}
			seen[n] = true
		}
	}
}

// The root with only the named command behaves as the root with them all: same status, same
// output, for help, usage errors, global flags and aliases; anything that may need the other
// commands (help, suggestions, a flag cobra would skip with its value) builds them all.
func TestRunBuildsOnlyTheNamedCommand(t *testing.T) {
	exec := func(cmds []func(*cli.Globals) *cobra.Command, args []string) (int, string, string) {
		var out, errb bytes.Buffer
		code := cli.Run(cli.NewRoot("airlock", cmds), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	all := len(commands)
	for _, tt := range []struct {
		args  []string
		built int
	}{
		{[]string{"run"}, 1},
		{[]string{"run", "--help"}, 1},
		{[]string{"run", "-c", "1", "--timeout", "1.5s"}, 1},
		{[]string{"run", "--bogus"}, 1},
		{[]string{"-o", "json", "run", "-c", "1", "--max-output", "0"}, 1},
		{[]string{"--output", "yaml", "run", "-c", "1"}, 1},
		{[]string{"--output=json", "run", "--help"}, 1},
		{[]string{"-ojson", "run", "--spares", "-1", "-c", "1"}, 1},
		{[]string{"-o=json", "run", "--help"}, 1},
		{[]string{"sb", "--help"}, 1},
		{[]string{"sandbox", "ls", "--help"}, 1},
		{[]string{"sandbox", "bogus"}, 1},
		{[]string{"egress"}, 1},
		{[]string{"gc", "--help"}, 1},
		{[]string{"plan"}, 1},
		{[]string{"capabilities", "--platform", "bogus"}, 1},
		{[]string{"__spares-fill", "--help"}, 1},
		{[]string{"help", "run"}, all},
		{[]string{"help"}, all},
		{[]string{"--help"}, all},
		{[]string{"-h", "run"}, all},
		{[]string{"--bogus", "run"}, all},
		{[]string{"runn"}, all},
		{[]string{"-o"}, all},
		{[]string{"-o", "json"}, all},
		{[]string{}, all},
		{[]string{"__complete", "r"}, all},
	} {
		lazy := cli.Constructors(commands, tt.args)
		if len(lazy) != tt.built {
			t.Errorf("%q: builds %d commands, want %d", tt.args, len(lazy), tt.built)
		}
		code, out, errs := exec(lazy, tt.args)
		wcode, wout, werrs := exec(cli.Constructors(commands, nil), tt.args)
		if code != wcode || out != wout || errs != werrs {
			t.Errorf("%q: with %d commands: exit %d\nstdout %q\nstderr %q\nwith all: exit %d\nstdout %q\nstderr %q", tt.args, len(lazy), code, out, errs, wcode, wout, werrs)
		}
	}
}

// TestShorthandsMeanOneThing: a one-letter flag names the same long flag in every command that
// has it (-t is --tty, as in docker exec -it; run's --timeout has no letter).
func TestShorthandsMeanOneThing(t *testing.T) {
	seen := map[string]string{} // shorthand → "long (first command)"
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Shorthand == "" {
				return
			}
			if prev, ok := seen[f.Shorthand]; ok && !strings.HasPrefix(prev, f.Name+" ") {
				t.Errorf("-%s is --%s in %q but %s", f.Shorthand, f.Name, c.CommandPath(), prev)
				return
			}
			seen[f.Shorthand] = f.Name + " (" + c.CommandPath() + ")"
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if got := seen["t"]; !strings.HasPrefix(got, "tty ") {
		t.Errorf("-t is %q, want --tty", got)
	}
}
