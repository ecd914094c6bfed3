package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
)

// envServer names the airlock-server binary that airlock serve and airlock mcp run.
const envServer = "AIRLOCK_SERVER"

// serverBinary is the daemon's binary: serve and mcp link the HTTP server, prometheus and
// the MCP SDK, whose package inits cost every one-shot call ~3 ms, so they live there and this
// binary hands those two commands over to it (DESIGN.md, "Start-up is on the hot path").
const serverBinary = "airlock-server"

func init() {
	commands = append(commands,
		cli.Command{Names: []string{"serve"}, New: serverCmd("serve", cli.ServeShort)},
		cli.Command{Names: []string{"mcp"}, New: serverCmd("mcp", cli.MCPShort)})
}

// serverCmd is a command of airlock-server, run by replacing this process with it: its
// flags, --help, stdio, signals and exit status are airlock-server's own.
func serverCmd(name, short string) func(*cli.Globals) *cobra.Command {
	return func(*cli.Globals) *cobra.Command {
		return &cobra.Command{
			Use:                name,
			Short:              short,
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				path, err := findServer()
				if err == nil {
					err = notSelf(path)
				}
				if err != nil {
					return &cli.ExitError{Code: cli.ExitRefused, Err: fmt.Errorf("airlock %s: %w", name, err)}
				}
				// argv[0] "airlock": its messages and usage name the command that was typed.
				err = syscall.Exec(path, append([]string{"airlock", name}, args...), os.Environ())
				return fmt.Errorf("airlock %s: running %s: %w", name, path, err)
			},
		}
	}
}

// findServer looks for airlock-server as $AIRLOCK_SERVER, next to this executable, then on
// PATH, as the agent binary is found.
func findServer() (string, error) {
	if env := os.Getenv(envServer); env != "" {
		if err := isExecutable(env); err != nil {
			return "", fmt.Errorf("$%s: %w", envServer, err)
		}
		return env, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	next := filepath.Join(filepath.Dir(self), serverBinary)
	if err := isExecutable(next); err == nil {
		return next, nil
	}
	if p, err := exec.LookPath(serverBinary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("the %s binary was not found as $%s, next to %s, or on PATH; install it beside airlock: CGO_ENABLED=0 go build -o %s/ ./cmd/%s (in a source tree, go run ./cmd/%s works too)",
		serverBinary, envServer, self, filepath.Dir(self), serverBinary, serverBinary)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return errors.New(p + " is not an executable file")
	}
	return nil
}

// notSelf refuses an airlock-server that is this binary (say $AIRLOCK_SERVER naming airlock):
// it would hand the command to itself forever.
func notSelf(p string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	a, errA := os.Stat(self)
	b, errB := os.Stat(p)
	if errA == nil && errB == nil && os.SameFile(a, b) {
		return fmt.Errorf("%s is this airlock binary, not %s", p, serverBinary)
	}
	return nil
}
