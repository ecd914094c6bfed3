// Command fakelauncher stands in for Cloud Run's sandbox launcher CLI in tests: its documented grammar and exit statuses, each sandbox a local-runtime sandbox.
//
// What it keeps of the real launcher (backend/gcp/argv.go has the sources): run NAME (or
// --sandbox-name NAME) --detach ... -- cmd, exec NAME [--workdir D] [-e K=V] [--stdin=false]
// -- cmd, delete [--force] NAME; "--" before every command; an absolute argv[0]; exit 0 when
// the command succeeded and 1 on a CLI error or any non-zero exit of the command (the
// command's own status is lost, as documented); stdin forwarded to exec unless
// --stdin=false; no network unless --allow-egress; the sandbox's root is this machine's root
// (read-only) and nothing of the caller's environment but what -e gives; deleting a missing
// sandbox succeeds; delete without --force refuses a running sandbox. Flags it does not
// implement (--mount, --rootfs, --import-tar, --export-tar, do, wait, fork) are CLI errors,
// never silently ignored.
//
// Environment: AIRLOCK_FAKE_LAUNCHER_STATE (required) is its state directory (the local
// runtime's state dir is its "l" subdirectory: keep the path short, a unix socket lives
// below it); AIRLOCK_AGENT is the agent the local runtime starts; it runs as root.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9-]*$`)

// maxOutput is an exec's output cap: none, in practice.
const maxOutput = 1 << 40

// lifetime is a fake sandbox's: the real launcher has none, the local runtime needs one.
const lifetime = 24 * 3600

func main() { os.Exit(run(os.Args[1:])) }

func fail(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", a...)
	return 1
}

// flags is one subcommand's parsed command line.
type flags struct {
	name        string
	detach      bool
	allowEgress bool
	write       bool
	force       bool
	stdin       bool
	workdir     string
	env         map[string]string
	command     []string
}

// parse reads flags (interspersed with one positional NAME) up to "--", then the command.
func parse(verb string, args []string) (flags, error) {
	f := flags{stdin: true, env: map[string]string{}}
	takesCommand := verb == "run" || verb == "exec"
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() (string, error) {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
				return v, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag %s needs a value", a)
			}
			i++
			return args[i], nil
		}
		flag, _, _ := strings.Cut(a, "=")
		switch {
		case a == "--":
			if !takesCommand {
				return f, fmt.Errorf("%s takes no command", verb)
			}
			f.command = args[i+1:]
			i = len(args)
		case flag == "--detach" && verb == "run":
			f.detach = true
		case flag == "--write" && verb == "run":
			f.write = true
		case flag == "--allow-egress" && verb == "run":
			f.allowEgress = true
		case flag == "--force" && verb == "delete":
			f.force = true
		case flag == "--stdin" && takesCommand:
			switch a {
			case "--stdin", "--stdin=true":
				f.stdin = true
			case "--stdin=false":
				f.stdin = false
			default:
				return f, fmt.Errorf("invalid value for --stdin: %s", a)
			}
		case flag == "--workdir" && takesCommand:
			v, err := value()
			if err != nil {
				return f, err
			}
			f.workdir = v
		case (flag == "--env" || a == "-e") && takesCommand:
			v, err := value()
			if err != nil {
				return f, err
			}
			k, val, ok := strings.Cut(v, "=")
			if !ok || k == "" {
				return f, fmt.Errorf("--env %q is not KEY=VALUE", v)
			}
			f.env[k] = val
		case flag == "--sandbox-name" && verb == "run":
			v, err := value()
			if err != nil {
				return f, err
			}
			if f.name != "" {
				return f, fmt.Errorf("two sandbox names: %q and %q", f.name, v)
			}
			f.name = v
		case strings.HasPrefix(a, "-"):
			return f, fmt.Errorf("unknown or unimplemented flag %s for %s (the fake launcher implements what airlock uses and refuses the rest)", a, verb)
		default:
			if f.name != "" {
				return f, fmt.Errorf("unexpected argument %q (put -- before the command)", a)
			}
			f.name = a
		}
	}
	if f.name == "" {
		return f, fmt.Errorf("%s needs a sandbox name", verb)
	}
	if !nameRE.MatchString(f.name) || len(f.name) > 64 {
		return f, fmt.Errorf("invalid sandbox name %q: must match %s", f.name, nameRE)
	}
	if takesCommand {
		if len(f.command) == 0 {
			return f, fmt.Errorf("%s needs -- and a command", verb)
		}
		if !filepath.IsAbs(f.command[0]) {
			return f, fmt.Errorf("command %q: argv[0] must be an absolute path", f.command[0])
		}
	}
	return f, nil
}

func run(args []string) int {
	if len(args) == 0 {
		return fail("usage: sandbox run|exec|delete ...")
	}
	state := os.Getenv("AIRLOCK_FAKE_LAUNCHER_STATE")
	if state == "" {
		return fail("AIRLOCK_FAKE_LAUNCHER_STATE is not set")
	}
	verb := args[0]
	switch verb {
	case "run", "exec", "delete":
	default:
		return fail("unknown or unimplemented command %q", verb)
	}
	f, err := parse(verb, args[1:])
	if err != nil {
		return fail("%v", err)
	}
	ctx := context.Background()
	names := filepath.Join(state, "names")
	// Searchable by others: the local runtime's sandboxes reach their session directories below it.
	if err := os.MkdirAll(state, 0o711); err != nil {
		return fail("%v", err)
	}
	if err := os.Mkdir(names, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fail("%v", err)
	}
	b, err := local.New(ctx, local.Options{StateDir: filepath.Join(state, "l"), OneShot: true})
	if err != nil {
		return fail("local runtime: %v", err)
	}
	defer b.Close()
	switch verb {
	case "run":
		return runCmd(ctx, b, names, f)
	case "exec":
		return execCmd(ctx, b, names, f)
	}
	return deleteCmd(ctx, b, names, f)
}

// lock serialises the name table.
func lock(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return func() { unix.Close(fd) }, nil
}

func runCmd(ctx context.Context, b *local.Backend, names string, f flags) int {
	unlock, err := lock(names)
	if err != nil {
		return fail("%v", err)
	}
	defer unlock()
	file := filepath.Join(names, f.name)
	if _, err := os.Stat(file); err == nil {
		return fail("sandbox %q already exists", f.name)
	}
	workdir := f.workdir
	if workdir == "" {
		workdir = "/tmp"
	}
	decl := spec.Sandbox{
		ID:    f.name,
		Image: spec.Image{Dir: "/"},
		// The launcher sets no limits; the local runtime wants them: generous ones.
		Limits:  spec.Limits{CPU: "2", Memory: "4Gi", Disk: "1Gi", MaxProcesses: ptr(int64(4096))},
		Session: spec.Session{MaxLifetimeSeconds: ptr(int64(lifetime)), IdleTimeoutSeconds: ptr(int64(lifetime)), Reconnect: ptr(true)},
		Egress:  spec.Egress{Mode: spec.EgressDeny},
		Workdir: workdir,
	}
	if f.allowEgress {
		decl.Egress.Mode = spec.EgressOpen
	}
	decl.ApplyDefaults()
	sess, err := b.Create(ctx, decl)
	if err != nil {
		return fail("create: %v", err)
	}
	if err := os.WriteFile(file, []byte(sess.ID), 0o600); err != nil {
		_ = b.Terminate(ctx, sess.ID)
		return fail("%v", err)
	}
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		return fail("%v", err)
	}
	defer a.Close()
	req := sandbox.ExecRequest{Argv: f.command, Env: f.env, Timeout: lifetime * time.Second}
	if !f.detach {
		unlock()
		unlock = func() {}
		res, err := a.Exec(ctx, req, os.Stdout, os.Stderr)
		_ = b.Terminate(ctx, sess.ID)
		_ = os.Remove(file)
		if err != nil {
			return fail("%v", err)
		}
		return status(res)
	}
	ps, ok := a.(interface {
		StartProcess(context.Context, client.ProcessRequest, ...client.ExecOption) (client.Process, error)
	})
	if !ok {
		return fail("the local agent client %T has no background processes", a)
	}
	if _, err := ps.StartProcess(ctx, client.ProcessRequest{ExecRequest: req}); err != nil {
		_ = b.Terminate(ctx, sess.ID)
		_ = os.Remove(file)
		return fail("start: %v", err)
	}
	fmt.Println(f.name)
	return 0
}

// status is the launcher's documented collapse: 0 when the command succeeded, else 1.
func status(res sandbox.ExecResult) int {
	if res.ExitCode == 0 && res.Signal == "" && !res.TimedOut {
		return 0
	}
	return 1
}

func sessionOf(names, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(names, name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("sandbox %q is not running", name)
	}
	return string(b), err
}

func execCmd(ctx context.Context, b *local.Backend, names string, f flags) int {
	id, err := sessionOf(names, f.name)
	if err != nil {
		return fail("%v", err)
	}
	a, err := b.Connect(ctx, id)
	if err != nil {
		return fail("sandbox %q is not running: %v", f.name, err)
	}
	defer a.Close()
	// An exec's output is whatever the command writes (the bridge's is every answer of an
	// agent connection): uncapped, as the launcher's.
	req := sandbox.ExecRequest{Argv: f.command, Env: f.env, Cwd: f.workdir, Timeout: lifetime * time.Second,
		MaxStdout: maxOutput, MaxStderr: maxOutput}
	if f.stdin {
		req.Stdin = os.Stdin
	}
	res, err := a.Exec(ctx, req, os.Stdout, os.Stderr)
	if err != nil {
		return fail("%v", err)
	}
	return status(res)
}

func deleteCmd(ctx context.Context, b *local.Backend, names string, f flags) int {
	unlock, err := lock(names)
	if err != nil {
		return fail("%v", err)
	}
	defer unlock()
	id, err := sessionOf(names, f.name)
	if err != nil {
		return 0 // deleting a missing sandbox succeeds
	}
	if !f.force {
		return fail("sandbox %q is running: use --force to delete it", f.name)
	}
	if err := b.Terminate(ctx, id); err != nil {
		return fail("delete: %v", err)
	}
	if err := os.Remove(filepath.Join(names, f.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("%v", err)
	}
	return 0
}

func ptr[T any](v T) *T { return &v }
