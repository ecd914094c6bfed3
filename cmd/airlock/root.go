package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Exit statuses every command shares.
const (
	exitOK      = 0
	exitRefused = 1 // the command ran and found something refused (or failed)
	exitUsage   = 2 // bad flags, arguments or input files
)

// Output formats for -o/--output.
const (
	outputText = "text"
	outputJSON = "json"
)

// globals are the persistent flags of the root command.
type globals struct {
	output string
}

// exitError carries a command's exit status; err, when set, is printed on stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func usageError(format string, a ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, a...)}
}

// commands lists the constructors of the subcommands; each command's file appends its own in
// init, so commands are added without editing this file. A command returns usageError for bad
// flags, arguments or input (exit 2), &exitError{code: 1} for a refusal, and any other error
// for a failure (exit 1).
var commands []func(*globals) *cobra.Command

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "airlock",
		Short:         "Run code an LLM just wrote, in real isolation",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.output != outputText && g.output != outputJSON {
				return usageError("-o/--output %q: allowed are %s, %s", g.output, outputText, outputJSON)
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.PersistentFlags().StringVarP(&g.output, "output", "o", outputText, "output format: text or json")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &exitError{code: exitUsage, err: fmt.Errorf("%w\nsee '%s --help'", err, cmd.CommandPath())}
	})
	for _, c := range commands {
		root.AddCommand(c(g))
	}
	return root
}

// run executes the CLI with args and returns the exit status: 0 success, 1 refused or
// failed, 2 usage or input error.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// An unknown command is a usage error; Find reports it before anything runs.
	if _, _, err := root.Find(args); err != nil {
		fmt.Fprintf(stderr, "airlock: %v\nsee 'airlock --help'\n", err)
		return exitUsage
	}
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "airlock:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "airlock:", err)
	return exitRefused
}
