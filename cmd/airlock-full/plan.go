package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/spec"
)

func init() { commands = append(commands, cli.Command{Names: []string{"plan"}, New: newPlanCmd}) }

func newPlanCmd(g *cli.Globals) *cobra.Command {
	var file, plat, capsFile string
	cmd := &cobra.Command{
		Use:   "plan -f STACK [--platform P]",
		Short: "Check a stack against a platform and print every refusal",
		Long: `Check every sandbox of a stack file against what a platform enforces, and print every
refusal (field, and the capability or rule it needs) in a stable order.

A declared value the platform cannot hold is refused. An undeclared one takes airlock's default
where the platform holds it, else the platform's own value (printed as UNDECLARED rows, with
its source), else it is refused like a declared one. Exit status: 0 nothing refused,
1 something refused, 2 usage or input error.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return cli.UsageError("plan needs a stack file: -f STACK")
			}
			st, err := spec.LoadStack(file)
			if err != nil {
				return &cli.ExitError{Code: cli.ExitUsage, Err: err}
			}
			set, err := planSet(cmd, plat, capsFile)
			if err != nil {
				return err
			}
			p := set.Platform
			res := plan.Check(st, p, set)
			if err := printPlan(cmd.OutOrStdout(), g.Output, res, len(st.Sandboxes)); err != nil {
				return err
			}
			if res.Refused() {
				return &cli.ExitError{Code: cli.ExitRefused}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "stack file (YAML or JSON)")
	cli.AddPlatform(cmd.Flags(), &plat)
	// A captured capability set instead of the platform's: for tests (a fixed local probe) and for
	// planning against another host's probed set.
	cmd.Flags().StringVar(&capsFile, "capabilities-file", "", "JSON capability set to plan against instead of the platform's own")
	_ = cmd.Flags().MarkHidden("capabilities-file")
	return cmd
}

// planSet is the set to plan against: the file's when given, else the platform's as
// 'airlock capabilities' reads it (platform.Capabilities: an opened backend's, else the
// published one). A platform named by --platform that does not exist yields an empty set of
// that name, which plan refuses by rule.
func planSet(cmd *cobra.Command, flag, capsFile string) (capability.Set, error) {
	if cmd.Flags().Changed(cli.PlatformFlag) && flag != platform.Auto {
		if _, err := capability.ParsePlatform(flag); err != nil {
			return capability.Set{Platform: capability.Platform(flag)}, nil
		}
	}
	c, err := cli.PlatformSettings(cmd.Flags(), flag)
	if err != nil {
		return capability.Set{}, err
	}
	c.Local.StateDir = statedir.DefaultDirForUser()
	if capsFile != "" {
		b, err := os.ReadFile(capsFile)
		if err != nil {
			return capability.Set{}, cli.UsageError("--capabilities-file: %v", err)
		}
		var set capability.Set
		if err := json.Unmarshal(b, &set); err != nil {
			return capability.Set{}, cli.UsageError("--capabilities-file %s: %v", capsFile, err)
		}
		p := capability.Platform(c.Platform)
		if c.Platform == platform.Auto {
			// The file stands for a backend's set; auto names the platform it would open.
			_, src, err := platform.Capabilities(cmd.Context(), c)
			if err != nil {
				return capability.Set{}, err
			}
			p = src.Choice.Platform
		}
		if set.Platform != p {
			return capability.Set{}, cli.UsageError("--capabilities-file %s is for platform %q, not %q", capsFile, set.Platform, p)
		}
		return set, nil
	}
	set, _, err := platform.Capabilities(cmd.Context(), c)
	return set, err
}

func printPlan(w io.Writer, output string, res plan.Result, sandboxes int) error {
	if output == cli.OutputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	refused := map[int]bool{}
	rows := make([][]string, 0, len(res.Refusals))
	for _, r := range res.Refusals {
		id := r.SandboxID
		if id == "" {
			id = "-"
		}
		if i := r.SandboxIndex(); i >= 0 {
			refused[i] = true
		}
		rows = append(rows, []string{"REFUSED", "sandbox=" + id, "field=" + r.Field, "needs=" + r.Needs(), r.Message})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	if err := printUndeclared(w, res); err != nil {
		return err
	}
	var err error
	switch n := len(res.Refusals); {
	case n == 0:
		_, err = fmt.Fprintf(w, "OK  %s can run on %s as declared\n", plural(sandboxes, "sandbox", "sandboxes"), res.Platform)
	default:
		_, err = fmt.Fprintf(w, "%s on %s (%d of %s refused)\n", plural(n, "refusal", "refusals"), res.Platform,
			len(refused), plural(sandboxes, "sandbox", "sandboxes"))
	}
	return err
}

// printUndeclared prints, per sandbox, what each property it leaves undeclared becomes on the
// platform: airlock's default, or the platform's own value where it cannot hold the default.
func printUndeclared(w io.Writer, res plan.Result) error {
	var rows [][]string
	for _, sb := range res.Sandboxes {
		for _, v := range sb.Undeclared {
			rows = append(rows, []string{"UNDECLARED", "sandbox=" + sb.ID, string(v.Field), v.Source.Words(), v.Value})
		}
		for _, n := range sb.Notes {
			rows = append(rows, []string{"NOTE", "sandbox=" + sb.ID, string(n.Field), n.Note})
		}
	}
	return writeTable(w, rows)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
