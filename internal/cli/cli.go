// Package cli is what the airlock and airlock-server commands share: the root command, exit statuses, and the local runtime's flags.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cliexit"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/spec"
)

// Exit statuses every command shares (cliexit's: the lean front uses them too).
const (
	ExitOK      = cliexit.ExitOK
	ExitRefused = cliexit.ExitRefused
	ExitUsage   = cliexit.ExitUsage
)

// Output formats for -o/--output.
const (
	OutputText = runcli.OutputText
	OutputJSON = runcli.OutputJSON
)

// Globals are the persistent flags of the root command.
type Globals struct {
	Output string
}

// ExitError carries a command's exit status; Err, when set, is printed on stderr.
type ExitError = cliexit.ExitError

// UsageError is a bad flag, argument or input: exit status 2.
func UsageError(format string, a ...any) error { return cliexit.UsageError(format, a...) }

// NoArgs refuses positional arguments as a usage error.
func NoArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return UsageError("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

// NewRoot builds the root command named name with the commands cmds construct. A command
// returns UsageError for bad flags, arguments or input (exit 2), &ExitError{Code: 1} for a
// refusal, and any other error for a failure (exit 1).
func NewRoot(name string, cmds []func(*Globals) *cobra.Command) *cobra.Command {
	g := &Globals{}
	root := &cobra.Command{
		Use:           name,
		Short:         "Run code an LLM just wrote, in real isolation",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.Output != OutputText && g.Output != OutputJSON {
				return UsageError("-o/--output %q: allowed are %s, %s", g.Output, OutputText, OutputJSON)
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.PersistentFlags().StringVarP(&g.Output, "output", "o", OutputText, "output format: text or json")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%w\nsee '%s --help'", err, cmd.CommandPath())}
	})
	for _, c := range cmds {
		root.AddCommand(c(g))
	}
	return root
}

// Command is a subcommand: its name, then its aliases, and its constructor.
type Command struct {
	Names []string
	New   func(*Globals) *cobra.Command
}

// Constructors returns the constructors NewRoot needs to run args: only the named command's
// when args name one (after the root's own flags) and all of them otherwise (help, completion,
// an unknown command, an unknown flag first). Building every command's flags cost each start
// about as much as the largest package inits, and a command's behaviour does not depend on its
// siblings: help and suggestions that list them are asked of the root, which then has them all.
func Constructors(cmds []Command, args []string) []func(*Globals) *cobra.Command {
	all := make([]func(*Globals) *cobra.Command, len(cmds))
	for i, c := range cmds {
		all[i] = c.New
	}
	name, ok := commandName(args)
	if !ok {
		return all
	}
	for _, c := range cmds {
		if slices.Contains(c.Names, name) {
			return []func(*Globals) *cobra.Command{c.New}
		}
	}
	return all
}

// commandName returns the first argument when it follows only the root's -o/--output flag
// (the only persistent flag): the command cobra would find. Anything else, ok is false.
func commandName(args []string) (string, bool) {
	_, at, ok := runcli.RootFlags(args)
	if !ok || at == len(args) || strings.HasPrefix(args[at], "-") || args[at] == "help" {
		return "", false
	}
	return args[at], true
}

// Run executes root with args and returns the exit status: 0 success, 1 refused or failed,
// 2 usage or input error.
func Run(root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	name := root.Name()
	// An unknown command is a usage error; Find reports it before anything runs.
	if _, _, err := root.Find(args); err != nil {
		fmt.Fprintf(stderr, "%s: %v\nsee '%s --help'\n", name, err, name)
		return ExitUsage
	}
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(stderr, name+":", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(stderr, name+":", err)
	return ExitRefused
}

// BackendFlags choose the platform and place the local runtime (shared by run, mcp and serve).
type BackendFlags struct {
	Platform     string
	StateDir     string
	CgroupParent string
	// OneShot is local.Options': set by a command that starts, as it ends, a process that does
	// the state dir's upkeep (airlock run with parked sandboxes), not a flag.
	OneShot bool
	flags   *pflag.FlagSet
}

// Add declares the flags on cmd (runcli's: the lean front reads them too).
func (b *BackendFlags) Add(cmd *cobra.Command) {
	b.flags = cmd.Flags()
	runcli.AddBackend(b.flags, &b.StateDir, &b.CgroupParent)
	AddPlatform(b.flags, &b.Platform)
}

// PlatformFlag is --platform's name.
const PlatformFlag = runcli.PlatformFlag

// AddPlatform declares --platform.
func AddPlatform(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, runcli.PlatformFlag, platform.Auto, "where sandboxes run: auto, local, docker, kubernetes, aws, azure, gcp (inside a launcher-enabled Cloud Run container); default $"+
		platform.EnvPlatform+", else the config file's ($"+platform.EnvConfig+", else "+platform.DefaultConfigFile+"), else auto")
}

// PlatformSettings is the platform configuration --platform (when given), the environment
// and the config file say, as a usage error when one of them is wrong.
func PlatformSettings(fs *pflag.FlagSet, flag string) (platform.Config, error) {
	c, err := platform.Settings(flag, fs.Changed(runcli.PlatformFlag))
	if err != nil {
		return c, &ExitError{Code: ExitUsage, Err: err}
	}
	return c, nil
}

// Config is the platform configuration the flags, the environment and the config file give.
func (b *BackendFlags) Config(progress io.Writer, log *slog.Logger) (platform.Config, error) {
	c, err := PlatformSettings(b.flags, b.Platform)
	if err != nil {
		return c, err
	}
	c.Logger = log
	c.Local = platform.LocalConfig{StateDir: b.StateDir, CgroupParent: b.CgroupParent, OneShot: b.OneShot}
	if isTerminal(progress) {
		c.Local.ImageProgress = progressBar(progress)
	}
	// --state-dir is the runtime's on this machine: the docker backend's too when given.
	if b.flags.Changed("state-dir") {
		c.Docker.StateDir = b.StateDir
	}
	switch c.Platform {
	case platform.Auto, string(capability.Local):
	case string(capability.Docker):
		if b.flags.Changed("cgroup-parent") {
			return c, UsageError("--cgroup-parent is the local runtime's; the platform is %s (from %s)", c.Platform, c.From)
		}
	default:
		for _, f := range []string{"state-dir", "cgroup-parent"} {
			if b.flags.Changed(f) {
				return c, UsageError("--%s is the local runtime's; the platform is %s (from %s), which keeps no state on this machine", f, c.Platform, c.From)
			}
		}
	}
	return c, nil
}

// Local reports whether the settings can only mean the local runtime, or auto: commands whose
// local-only shortcuts (parked sandboxes) apply then; else it names the platform and where it came from.
func (b *BackendFlags) Local() (ok bool, other string, err error) {
	c, err := PlatformSettings(b.flags, b.Platform)
	if err != nil {
		return false, "", err
	}
	if c.Platform == platform.Auto || c.Platform == string(capability.Local) {
		return true, "", nil
	}
	return false, c.Platform + " (from " + c.From + ")", nil
}

// Open constructs the backend the settings choose, and says once on stderr when auto passed
// the local runtime over.
func (b *BackendFlags) Open(ctx context.Context, progress, stderr io.Writer, log *slog.Logger) (platform.Backend, platform.Choice, error) {
	c, err := b.Config(progress, log)
	if err != nil {
		return nil, platform.Choice{}, err
	}
	be, ch, err := platform.Open(ctx, c)
	if err != nil {
		return nil, ch, err
	}
	if n := ch.Notice(); n != "" {
		fmt.Fprintln(stderr, n)
	}
	return be, ch, nil
}

// ParseImage reads --image; local paths are made absolute, since the sandbox is built
// from them by this process but may be looked at from elsewhere (logs, state records).
func ParseImage(s string) (spec.Image, error) {
	img, err := spec.ImageFromString(s)
	if err != nil {
		return img, err
	}
	if img == (spec.Image{}) {
		return img, errors.New(`empty: give "host", a directory, an OCI layout ("oci:DIR"), a tarball, or an image reference`)
	}
	for _, p := range []*string{&img.Dir, &img.OCILayout, &img.Tarball} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return img, err
			}
			*p = abs
		}
	}
	return img, nil
}

// CheckImage refuses the image flag's default, the host image, on a platform other than the
// local runtime, which assembles a root from the host's /usr, and gcp, whose sandboxes' root
// is the hosting container's own: elsewhere the image must be given (a reference the engine
// has or pulls, an OCI layout, a tarball).
func CheckImage(fs *pflag.FlagSet, flag string, img spec.Image, ch platform.Choice) error {
	if fs.Changed(flag) || !img.Host || ch.Platform == capability.Local || ch.Platform == capability.GCP {
		return nil
	}
	return UsageError("--%s: the default image, host, is the local runtime's (a root from this host's /usr; %s has no %s); on %s give an image: a reference (e.g. python:3.12-slim), an OCI layout (oci:DIR) or a tarball",
		flag, ch.Platform, capability.ImageHost, ch.Platform)
}

// CheckLoopback refuses an address other clients on the network could reach.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %v (want host:port, e.g. 127.0.0.1:8765)", addr, err)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address: the MCP HTTP transport has no authentication, so it serves 127.0.0.1 or [::1] only", addr)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	return term.IsTerminal(int(f.Fd()))
}

// progressBar draws image-unpack progress on one terminal line.
func progressBar(w io.Writer) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		finished := total > 0 && done >= total
		if !finished && time.Since(last) < 100*time.Millisecond {
			return
		}
		last = time.Now()
		const width = 30
		mib := func(n int64) float64 { return float64(n) / (1 << 20) }
		if total <= 0 {
			fmt.Fprintf(w, "\runpacking image: %.1f MiB", mib(done))
			return
		}
		n := int(done * width / total)
		fmt.Fprintf(w, "\runpacking image [%s%s] %3d%% %.1f/%.1f MiB", strings.Repeat("=", n), strings.Repeat(" ", width-n), done*100/total, mib(done), mib(total))
		if finished {
			fmt.Fprintln(w)
		}
	}
}

// Short descriptions of the daemon commands, shown by airlock's help too (they run in
// airlock-server).
const (
	ServeShort = "Run the daemon: the sandbox HTTP API on a unix socket (and optionally TCP)"
	MCPShort   = "Serve run_code and sandbox session tools to an MCP client (stdio or HTTP)"
)
