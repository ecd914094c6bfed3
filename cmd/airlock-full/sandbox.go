package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

func init() {
	commands = append(commands, cli.Command{Names: []string{"sandbox", "sb"}, New: newSandboxCmd})
}

// daemonFlags say how to reach the daemon. Secrets come from the environment only, never a
// flag (flags show in ps).
type daemonFlags struct {
	socket string
	url    string
	tlsCA  string
}

func (d *daemonFlags) add(cmd *cobra.Command) {
	fl := cmd.PersistentFlags()
	fl.StringVar(&d.socket, "socket", "", "the daemon's unix socket (default $"+client.EnvSocket+", else "+api.DefaultSocket+")")
	fl.StringVar(&d.url, "url", "", "the daemon's TCP address, e.g. https://host:7443 (default $"+client.EnvURL+"); credentials from $"+client.EnvAPIKey+" or $"+client.EnvToken)
	fl.StringVar(&d.tlsCA, "tls-ca", "", "PEM file of the CA that signed the daemon's certificate")
}

func (d *daemonFlags) client() (*client.Client, error) {
	o := client.Options{Socket: d.socket, BaseURL: d.url, APIKey: os.Getenv(client.EnvAPIKey), Token: os.Getenv(client.EnvToken)}
	if o.Socket == "" && o.BaseURL == "" {
		o.Socket, o.BaseURL = os.Getenv(client.EnvSocket), os.Getenv(client.EnvURL)
	}
	if d.tlsCA != "" {
		pem, err := os.ReadFile(d.tlsCA)
		if err != nil {
			return nil, cli.UsageError("--tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, cli.UsageError("--tls-ca %s: no PEM certificate in it", d.tlsCA)
		}
		o.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c, err := client.New(o)
	if err != nil {
		return nil, cli.UsageError("%v", err)
	}
	return c, nil
}

// each calls do on every argument with one daemon client, printing each argument it did when
// print is set; the failures are joined, each naming op and its argument.
func (d *daemonFlags) each(cmd *cobra.Command, op string, args []string, print bool, do func(ctx context.Context, c *client.Client, arg string) error) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	defer c.Close()
	var errs []error
	for _, arg := range args {
		if err := do(cmd.Context(), c, arg); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", op, arg, daemonError(err)))
			continue
		}
		if print {
			fmt.Fprintln(cmd.OutOrStdout(), arg)
		}
	}
	return errors.Join(errs...)
}

// daemonError adds what to do to the errors a person can act on.
func daemonError(err error) error {
	var ce *client.Error
	switch {
	case errors.Is(err, sandbox.ErrUnreachable) && !errors.As(err, &ce):
		return fmt.Errorf("%w\nis the daemon running? start it with 'sudo airlock serve' (or point --socket/--url at it)", err)
	case errors.Is(err, sandbox.ErrRefused) && errors.As(err, &ce) && len(ce.Problems) > 0:
		var b strings.Builder
		b.WriteString("the daemon's platform cannot enforce this declaration:")
		for _, p := range ce.Problems {
			needs := p.Rule
			if p.Capability != "" {
				needs = string(p.Capability)
			}
			fmt.Fprintf(&b, "\n  %s: %s (needs %s)", p.Field, p.Message, needs)
		}
		b.WriteString("\nsee 'airlock capabilities' for what this host enforces")
		return errors.New(b.String())
	case errors.Is(err, sandbox.ErrUnauthenticated):
		return fmt.Errorf("%w\nset $%s (or $%s for a delegated token)", err, client.EnvAPIKey, client.EnvToken)
	}
	return err
}

func newSandboxCmd(g *cli.Globals) *cobra.Command {
	d := &daemonFlags{}
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, list, exec in, copy to and from, pause, resume, preview, snapshot, fork and remove sandboxes on the daemon",
		Long: `Drive sandboxes held by the daemon ('airlock serve'). The daemon is reached on its unix
socket by default, or over TCP with --url and $` + client.EnvAPIKey + ` (or a delegated token in $` + client.EnvToken + `).

Pause, stats, preview, snapshots and fork are capabilities of the daemon's platform ('airlock
capabilities'); where it lacks one, the command fails naming it. A running sandbox's egress is
changed with 'airlock egress SESSION'.`,
	}
	d.add(cmd)
	cmd.AddCommand(newSandboxCreateCmd(g, d), newSandboxLsCmd(g, d), newSandboxExecCmd(d), newSandboxCpCmd(d),
		newSandboxStateCmd(g, d, "pause"), newSandboxStateCmd(g, d, "resume"), newSandboxRmCmd(d), newSandboxTokenCmd(g, d),
		newSandboxStatsCmd(g, d), newSandboxPreviewCmd(g, d), newSandboxSnapshotCmd(g, d), newSandboxSnapshotsCmd(g, d),
		newSandboxForkCmd(g, d), newSandboxCapabilitiesCmd(g, d))
	return cmd
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseLabels reads k=v pairs.
func parseLabels(flag string, kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, cli.UsageError("--%s %q: want key=value", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}

type createFlags struct {
	file, template, image, id string
	labels, env               []string
	memory, cpu               string
	lifetime, idle            time.Duration
}

func newSandboxCreateCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	f := &createFlags{}
	cmd := &cobra.Command{
		Use:   "create [-f FILE | --template NAME | --image IMG] [--label k=v]...",
		Short: "Create a sandbox and print its session id",
		Long: `Create a sandbox from a declaration file (-f, YAML or JSON; - reads stdin), one of the
daemon's templates (--template), or flags (--image and the rest). A declaration the daemon's
platform cannot enforce is refused with every reason.

Built from flags, the sandbox has no idle timeout beyond its lifetime unless --idle-timeout
says otherwise (the local runtime has no separate idle timer yet).`,
		Example: `  airlock sandbox create --image host --label team=ml
  airlock sandbox create -f sandbox.yaml
  airlock sandbox create --template python -o json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			labels, err := parseLabels("label", f.labels)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var sb *client.Sandbox
			switch {
			case f.file != "" && f.template != "":
				return cli.UsageError("-f and --template exclude each other")
			case f.template != "":
				if cmd.Flags().Changed("image") || f.id != "" || len(f.env) > 0 || f.memory != "" || f.cpu != "" || f.lifetime != 0 || f.idle != 0 {
					return cli.UsageError("--template takes only --label")
				}
				sb, err = c.CreateFromTemplate(ctx, f.template, labels)
			default:
				decl, derr := f.declaration(cmd, labels)
				if derr != nil {
					return derr
				}
				sb, err = c.Create(ctx, decl)
			}
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(cmd.OutOrStdout(), sb.Session)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "declaration file (YAML or JSON); - reads stdin")
	fl.StringVar(&f.template, "template", "", "one of the daemon's templates")
	fl.StringVar(&f.image, "image", "host", `root filesystem: "host", an absolute directory, "oci:DIR", a tarball, or an image reference`)
	fl.StringVar(&f.id, "id", "sandbox", "the sandbox id (names the declaration; sessions get their own ids)")
	fl.StringArrayVar(&f.labels, "label", nil, "label key=value (repeatable; with -f, added over the file's)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment KEY=VALUE of every process (repeatable)")
	fl.StringVar(&f.memory, "memory", "", `memory limit, e.g. "512Mi" (default 512Mi)`)
	fl.StringVar(&f.cpu, "cpu", "", `CPU limit in cores, e.g. "0.5" (default 1)`)
	fl.DurationVar(&f.lifetime, "lifetime", 0, "longest life of the sandbox (default 1h)")
	fl.DurationVar(&f.idle, "idle-timeout", 0, "end the sandbox after this long without activity (default: the lifetime)")
	return cmd
}

// declaration builds the sandbox to create from -f or the flags.
func (f *createFlags) declaration(cmd *cobra.Command, labels map[string]string) (spec.Sandbox, error) {
	if f.file != "" {
		for _, name := range []string{"image", "id", "env", "memory", "cpu", "lifetime", "idle-timeout"} {
			if cmd.Flags().Changed(name) {
				return spec.Sandbox{}, cli.UsageError("-f takes only --label; --%s belongs in the file", name)
			}
		}
		var data []byte
		var err error
		if f.file == "-" {
			data, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), spec.MaxDocumentBytes+1))
		} else {
			data, err = os.ReadFile(f.file)
		}
		if err != nil {
			return spec.Sandbox{}, cli.UsageError("-f: %v", err)
		}
		d, err := spec.ParseSandbox(data)
		if err != nil {
			return spec.Sandbox{}, cli.UsageError("-f %s: %v", f.file, err)
		}
		// Paths in the file mean the file's directory, as for a stack file.
		if f.file != "-" {
			dir, _ := filepath.Abs(filepath.Dir(f.file))
			for _, p := range []*string{&d.Image.Dir, &d.Image.OCILayout, &d.Image.Tarball} {
				if *p != "" && !filepath.IsAbs(*p) {
					*p = filepath.Join(dir, *p)
				}
			}
		}
		if len(labels) > 0 && d.Labels == nil {
			d.Labels = map[string]string{}
		}
		maps.Copy(d.Labels, labels)
		return *d, nil
	}
	img, err := cli.ParseImage(f.image)
	if err != nil {
		return spec.Sandbox{}, cli.UsageError("--image: %v", err)
	}
	env, err := parseLabels("env", f.env)
	if err != nil {
		return spec.Sandbox{}, err
	}
	d := spec.Sandbox{ID: f.id, Image: img, Labels: labels, Limits: spec.Limits{Memory: spec.Quantity(f.memory), CPU: spec.Quantity(f.cpu)}}
	if len(env) > 0 {
		d.Env = env
	}
	if len(d.Labels) == 0 {
		d.Labels = nil
	}
	life := int64(spec.DefaultMaxLifetimeSeconds)
	if f.lifetime != 0 {
		life = int64(f.lifetime / time.Second)
		d.Session.MaxLifetimeSeconds = &life
	}
	idle := life
	if f.idle != 0 {
		idle = int64(f.idle / time.Second)
	}
	d.Session.IdleTimeoutSeconds = &idle
	return d, nil
}

func newSandboxLsCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:     "ls [--label k=v]...",
		Aliases: []string{"list"},
		Short:   "List sandboxes (those carrying every --label)",
		Args:    cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseLabels("label", labels)
			if err != nil {
				return err
			}
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sbs, err := c.List(cmd.Context(), sel)
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(cmd.OutOrStdout(), sessionsOf(sbs))
			}
			rows := [][]string{{"SESSION", "SANDBOX", "STATE", "AGE", "EXPIRES", "LABELS"}}
			now := time.Now()
			for _, sb := range sbs {
				keys := slices.Sorted(maps.Keys(sb.Labels))
				ls := make([]string, len(keys))
				for i, k := range keys {
					ls[i] = k + "=" + sb.Labels[k]
				}
				exp := "-"
				if !sb.ExpiresAt.IsZero() {
					exp = "in " + sb.ExpiresAt.Sub(now).Round(time.Second).String()
				}
				rows = append(rows, []string{sb.ID, sb.SandboxID, string(sb.State), now.Sub(sb.CreatedAt).Round(time.Second).String(), exp, strings.Join(ls, ",")})
			}
			return writeTable(cmd.OutOrStdout(), rows)
		},
	}
	cmd.Flags().StringArrayVar(&labels, "label", nil, "only sandboxes with label key=value (repeatable: all must match)")
	return cmd
}

type execFlags struct {
	timeout     time.Duration
	interactive bool
	tty         bool
	env         []string
	cwd         string
	shell       string
}

func newSandboxExecCmd(d *daemonFlags) *cobra.Command {
	f := &execFlags{}
	cmd := &cobra.Command{
		Use:   "exec SESSION [flags] -- COMMAND [ARG...] | exec SESSION --sh 'SCRIPT'",
		Short: "Run a command in a sandbox, streaming its output; exits with the command's status",
		Long: `Run a command in a sandbox. Output streams as the command produces it. The exit status is
the command's; 124 when it ran past --timeout, 137 when it was killed for memory, 125 when
airlock itself failed.`,
		Example: `  airlock sandbox exec s-0123456789abcdef -- python3 -c 'print(2+2)'
  echo hi | airlock sandbox exec -i s-0123456789abcdef -- cat
  airlock sandbox exec s-0123456789abcdef --sh 'ls -la /workspace'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSandboxExec(cmd, d, f, args)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.timeout, "timeout", api.DefaultExecTimeout, "deadline of the command; past it the command and all it started are killed")
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "stream this terminal's stdin to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal (its stdout and stderr merge)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment KEY=VALUE (repeatable)")
	fl.StringVarP(&f.cwd, "workdir", "w", "", "working directory (default the sandbox's)")
	fl.StringVar(&f.shell, "sh", "", "run this script with /bin/sh -c instead of COMMAND")
	return cmd
}

func runSandboxExec(cmd *cobra.Command, d *daemonFlags, f *execFlags, args []string) error {
	id, argv := args[0], args[1:]
	if (f.shell == "") == (len(argv) == 0) {
		return cli.UsageError("give either COMMAND after -- or --sh 'SCRIPT'")
	}
	if f.timeout <= 0 {
		return cli.UsageError("--timeout %s must be positive", f.timeout)
	}
	env, err := parseLabels("env", f.env)
	if err != nil {
		return err
	}
	req := sandbox.ExecRequest{Argv: argv, Shell: f.shell, Cwd: f.cwd, Timeout: f.timeout, TTY: f.tty}
	if len(env) > 0 {
		req.Env = env
	}
	if f.interactive {
		req.Stdin = cmd.InOrStdin()
	}
	c, err := d.client()
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Sandbox(id).Exec(cmd.Context(), req, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return &cli.ExitError{Code: exitRunFailed, Err: daemonError(err)}
	}
	status := res.ExitCode
	switch {
	case res.TimedOut:
		fmt.Fprintf(cmd.ErrOrStderr(), "airlock: timed out after %s: the command and everything it started were killed\n", f.timeout)
		status = 124
	case res.OOMKilled:
		fmt.Fprintln(cmd.ErrOrStderr(), "airlock: killed: out of memory")
		status = 137
	case res.Signal != "":
		fmt.Fprintf(cmd.ErrOrStderr(), "airlock: killed by signal %s\n", res.Signal)
	}
	if res.Truncated {
		fmt.Fprintln(cmd.ErrOrStderr(), "airlock: output truncated at the agent's per-stream cap")
	}
	if status < 0 || status > 255 {
		status = 1
	}
	if status != 0 {
		return &cli.ExitError{Code: status}
	}
	return nil
}

// sandboxPath splits "SESSION:/path"; ok is false for a local path.
func sandboxPath(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || id == "" || path == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return id, path, true
}

func newSandboxCpCmd(d *daemonFlags) *cobra.Command {
	var mode uint32
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (SESSION:/path on one side; - is stdin or stdout)",
		Example: `  airlock sandbox cp main.py s-0123456789abcdef:/workspace/main.py
  airlock sandbox cp s-0123456789abcdef:/workspace/out.csv ./out.csv
  airlock sandbox cp s-0123456789abcdef:/etc/os-release -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcIn := sandboxPath(args[0])
			dstID, dstPath, dstIn := sandboxPath(args[1])
			if srcIn == dstIn {
				return cli.UsageError("cp: exactly one of SRC and DST is SESSION:/path (got %q, %q)", args[0], args[1])
			}
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if dstIn {
				return copyIn(ctx, cmd, c.Sandbox(dstID), args[0], dstPath, mode)
			}
			return copyOut(ctx, cmd, c.Sandbox(srcID), srcPath, args[1])
		},
	}
	cmd.Flags().Uint32Var(&mode, "mode", 0, "permission bits of a file copied in, octal as 0o644 or decimal (default: the local file's, else 0644)")
	return cmd
}

func copyIn(ctx context.Context, cmd *cobra.Command, sb *client.Sandbox, src, dst string, mode uint32) error {
	var r io.Reader = cmd.InOrStdin()
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return cli.UsageError("cp: %v", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return cli.UsageError("cp: %s is not a regular file (directories are not copied yet)", src)
		}
		if mode == 0 {
			mode = uint32(fi.Mode().Perm())
		}
		r = f
	}
	if err := sb.WriteFile(ctx, dst, r, mode); err != nil {
		return daemonError(err)
	}
	return nil
}

func copyOut(ctx context.Context, cmd *cobra.Command, sb *client.Sandbox, src, dst string) error {
	rc, err := sb.ReadFile(ctx, src)
	if err != nil {
		return daemonError(err)
	}
	defer rc.Close()
	if dst == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, filepath.Base(src))
	}
	// Written beside the target and renamed: a broken transfer leaves no half file behind.
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".airlock-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, rc); err != nil {
		tmp.Close()
		return fmt.Errorf("cp: %s: %w", src, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

func newSandboxStateCmd(g *cli.Globals, d *daemonFlags, op string) *cobra.Command {
	return &cobra.Command{
		Use:   op + " SESSION...",
		Short: strings.ToUpper(op[:1]) + op[1:] + " sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return d.each(cmd, op, args, g.Output == cli.OutputText, func(ctx context.Context, c *client.Client, id string) error {
				if op == "resume" {
					return c.Sandbox(id).Resume(ctx)
				}
				return c.Sandbox(id).Pause(ctx)
			})
		},
	}
}

func newSandboxRmCmd(d *daemonFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SESSION...",
		Aliases: []string{"terminate"},
		Short:   "Terminate sandboxes (done when the command returns)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return d.each(cmd, "rm", args, true, func(ctx context.Context, c *client.Client, id string) error {
				return c.Sandbox(id).Terminate(ctx)
			})
		},
	}
}

func newSandboxTokenCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	var class string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "token SESSION [--class execute|manage] [--ttl 10m]",
		Short: "Mint a delegated capability token for one sandbox",
		Long: `Mint a capability token that lets a less trusted caller use this one sandbox directly
against the daemon's API ("Authorization: Bearer <token>", or $` + client.EnvToken + ` for this CLI):
execute (exec, files, processes) or manage (pause, resume, terminate), until it expires.`,
		Example: `  AIRLOCK_TOKEN=$(airlock sandbox token s-0123456789abcdef --ttl 10m)`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if class != string(token.Execute) && class != string(token.Manage) {
				return cli.UsageError("--class %q: allowed are execute and manage", class)
			}
			if ttl < 0 {
				return cli.UsageError("--ttl %s must be positive", ttl)
			}
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			t, err := c.Sandbox(args[0]).MintToken(cmd.Context(), token.Class(class), ttl)
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(cmd.OutOrStdout(), t)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), t.Token)
			return err
		},
	}
	cmd.Flags().StringVar(&class, "class", string(token.Execute), "execute or manage")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default the daemon's, 10m; at most its --max-token-ttl)")
	return cmd
}

// sessionsOf are the sandboxes' sessions, as -o json prints them.
func sessionsOf(sbs []*client.Sandbox) []sandbox.Session {
	out := make([]sandbox.Session, len(sbs))
	for i, sb := range sbs {
		out[i] = sb.Session
	}
	return out
}
