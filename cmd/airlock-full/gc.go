//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/gc"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/platform"
)

func init() { commands = append(commands, cli.Command{Names: []string{"gc"}, New: newGCCmd}) }

// newGCCmd reaps what killed runs leave: stale session records and empty airlock-* cgroups.
func newGCCmd(g *cli.Globals) *cobra.Command {
	var stateDirs []string
	var dryRun, verbose, pool, removedSpares bool
	var minAge time.Duration
	cmd := &cobra.Command{
		Use:   "gc [--dry-run] [--state-dir DIR]... [--min-age 1m] [--pool]",
		Short: "Remove what killed airlock processes left: stale session records and empty airlock-* cgroups (local runtime)",
		Long: `Reap leftovers of airlock processes that were killed (a crashed daemon, an interrupted test).
It looks after the local runtime only, whatever $AIRLOCK_PLATFORM or the config file say: a
container engine and a cluster clean up after themselves.

  - session records in each --state-dir whose sandbox is gone, by the local runtime's own
    reconcile (live sandboxes there are adopted and left running);
  - cgroups named airlock-* in every hierarchy under ` + kernfile.CgroupRoot + `, child by child: a child tree
    goes when no process is in it (in any hierarchy), it is not a session of a state dir,
    and it has not changed for --min-age; the airlock-* cgroup itself once it is empty.

A live sandbox is never touched: its processes keep its cgroups (the kernel refuses to
remove a cgroup with tasks). Cgroups not named airlock-* are never looked at. As root it looks
at every airlock-* cgroup; as another user (rootless mode, docs/rootless.md) only at what is
delegated to that user: on cgroup v2 the airlock-* children of the subtree it runs in (e.g.
under user@<uid>.service), else airlock-user-<uid>, which stays (root's).

With --pool it also terminates the sandboxes airlock run parked for later runs (docs/pool.md):
live sandboxes nobody uses yet, which otherwise end by themselves within 11 minutes.`,
		Example: `  sudo airlock gc --dry-run
  sudo airlock gc --state-dir /run/airlock --state-dir /var/tmp/airlock-ci`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if minAge < 0 {
				return cli.UsageError("--min-age %s must not be negative", minAge)
			}
			if removedSpares {
				return cli.UsageError("--spares is now --pool (also terminate the sandboxes parked for later airlock runs)")
			}
			var retired []string
			var serr error
			if pool {
				retired, serr = retireParked(cmd, stateDirs, dryRun)
			}
			opts := gc.Options{StateDirs: stateDirs, MinAge: minAge, DryRun: dryRun}
			if uid := os.Geteuid(); uid != 0 {
				if tree, ok := local.RootlessCgroupTree(); ok {
					opts.CgroupRoot = tree // v2: the airlock-* children of the user's delegation
				} else {
					own := local.RootlessCgroupParent(uid)
					opts.Match, opts.KeepTops = func(name string) bool { return name == own }, true
				}
			}
			rep, err := gc.Run(cmd.Context(), opts)
			err = errors.Join(serr, err)
			out := cmd.OutOrStdout()
			if g.Output == cli.OutputJSON {
				if perr := printJSON(out, gcOutput{Report: rep, Parked: retired}); perr != nil {
					return perr
				}
			} else {
				verb := "removed"
				if dryRun {
					verb = "would remove"
				}
				for _, s := range rep.Sessions {
					fmt.Fprintf(out, "%s session record %s\n", verb, s)
				}
				for _, c := range rep.Cgroups {
					fmt.Fprintf(out, "%s cgroup %s\n", verb, c)
				}
				if pool {
					for _, id := range retired {
						fmt.Fprintf(out, "%s parked sandbox %s\n", map[bool]string{false: "terminated", true: "would terminate"}[dryRun], id)
					}
					fmt.Fprintf(out, "%s %d parked sandboxes\n", map[bool]string{false: "terminated", true: "would terminate"}[dryRun], len(retired))
				}
				if verbose {
					for _, k := range rep.Kept {
						fmt.Fprintf(out, "kept %s\n", k)
					}
				}
				fmt.Fprintf(out, "%s %d session records, %d cgroup directories\n", verb, len(rep.Sessions), len(rep.Cgroups))
			}
			return err
		},
	}
	cmd.Flags().StringArrayVar(&stateDirs, "state-dir", []string{local.DefaultStateDirForUser()}, "a local runtime state dir to reconcile and whose sessions keep their cgroups; repeatable")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be removed; change nothing")
	cmd.Flags().DurationVar(&minAge, "min-age", time.Minute, "spare cgroup trees changed more recently than this")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also list the airlock-* cgroups kept, and why")
	cmd.Flags().BoolVar(&pool, runcli.PoolFlag, false, "also terminate the sandboxes parked for later airlock runs")
	cmd.Flags().BoolVar(&removedSpares, "spares", false, "renamed --"+runcli.PoolFlag)
	_ = cmd.Flags().MarkHidden("spares")
	return cmd
}

// gcOutput is gc's JSON: the report, and the parked sandboxes terminated (--pool).
type gcOutput struct {
	gc.Report
	Parked []string `json:"parked,omitempty"`
}

// retireParked terminates (or lists) the parked sandboxes of every state dir.
func retireParked(cmd *cobra.Command, stateDirs []string, dryRun bool) ([]string, error) {
	var ids []string
	var errs []error
	for _, dir := range stateDirs {
		b, err := platform.Local(cmd.Context(), platform.LocalConfig{StateDir: dir}, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dir, err))
			continue
		}
		got, err := b.RetireParked(cmd.Context(), dryRun)
		b.Close()
		ids = append(ids, got...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dir, err))
		}
	}
	return ids, errors.Join(errs...)
}
