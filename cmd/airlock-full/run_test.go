package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

// runtimeEnv is a built agent, a state dir and a cgroup parent of the test's own.
type runtimeEnv struct {
	agent, stateDir, parent string
}

func newRuntimeEnv(t *testing.T) runtimeEnv {
	t.Helper()
	agent, cleanup, err := runcodetest.BuildAgent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	t.Setenv("AIRLOCK_AGENT", agent)
	e := runtimeEnv{agent: agent, stateDir: runcodetest.StateDir(t), parent: runcodetest.CgroupParent(t)}
	t.Cleanup(func() { e.assertNoSandboxes(t) })
	return e
}

func (e runtimeEnv) flags() []string {
	return []string{"--state-dir", e.stateDir, "--cgroup-parent", e.parent}
}

// open starts a local runtime on the environment's state dir, as a command would.
func (e runtimeEnv) open(t *testing.T) *local.Backend {
	t.Helper()
	b, err := local.New(context.Background(), local.Options{StateDir: e.stateDir, CgroupParent: e.parent, AgentPath: e.agent})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// assertNoSandboxes fails for every sandbox a command left behind in the state dir.
func (e runtimeEnv) assertNoSandboxes(t *testing.T) {
	t.Helper()
	b := e.open(t)
	defer b.Close()
	list, _ := b.List(context.Background())
	for _, s := range list {
		t.Errorf("sandbox %s (%s) outlived its command", s.ID, s.SandboxID)
		_ = b.Terminate(context.Background(), s.ID)
	}
}

// execCmd runs a command constructor in-process and returns its exit status as run() would.
func execCmd(t *testing.T, cmd *cobra.Command, args []string) (int, error) {
	t.Helper()
	// As under the root command.
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return cli.ExitOK, nil
	}
	var ee *cli.ExitError
	if errors.As(err, &ee) {
		return ee.Code, ee.Err
	}
	return cli.ExitRefused, err
}

func runCommand(t *testing.T, output string, args []string, stdin string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := newRunCmd(&cli.Globals{Output: output})
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetIn(strings.NewReader(stdin))
	code, err := execCmd(t, cmd, args)
	if err != nil {
		fmt.Fprintln(&errb, "airlock:", err)
	}
	return code, out.String(), errb.String()
}

func TestRunCommand(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	script := write("script.sh", "[[ -n $BASH_VERSION ]] && echo bash\n")
	notes := write("notes.txt", "print(1)\n")
	data := write("data.txt", "payload\n")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	connect := fmt.Sprintf("import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), timeout=3)\n    print('connected')\nexcept OSError:\n    print('unreachable')\n", ln.Addr().(*net.TCPAddr).Port)
	publicEgress := env.backendCaps(t).Has(capability.PublicOnlyEgress)

	tests := []struct {
		name      string
		args      []string
		stdin     string
		code      int
		stdout    string
		stderrHas string
	}{
		{name: "python by default", args: []string{"-c", "print(2+2)"}, stdout: "4\n"},
		{name: "exit status and stderr", args: []string{"--lang", "bash", "-c", "echo out; echo err >&2; exit 7"}, code: 7, stdout: "out\n", stderrHas: "err\n"},
		{name: "language from the file extension", args: []string{script}, stdout: "bash\n"},
		{name: "code from standard input", args: []string{"--lang", "js", "-"}, stdin: "console.log(6*7)", stdout: "42\n"},
		{name: "-i feeds stdin to the code", args: []string{"-i", "-l", "sh", "-c", "tr a-z A-Z"}, stdin: "quiet", stdout: "QUIET"},
		{name: "stdin closed without -i", args: []string{"-l", "bash", "-c", "cat; echo end"}, stdin: "ignored", stdout: "end\n"},
		{name: "files in", args: []string{"--file", data, "--file", data + ":sub/dir/copy.txt", "-l", "bash", "-c", "cat data.txt sub/dir/copy.txt"}, stdout: "payload\npayload\n"},
		{name: "timeout is 124", args: []string{"--timeout", "1s", "-l", "bash", "-c", "echo a; sleep 30"}, code: 124, stdout: "a\n", stderrHas: "timed out after 1s"},
		{name: "oom is 137", args: []string{"-c", "x = b'x' * (1 << 30)\nprint(len(x))"}, code: 137, stderrHas: "out of memory (limit 512Mi)"},
		{name: "network off", args: []string{"-c", connect}, stdout: "unreachable\n"},
		// usage errors: nothing runs.
		{name: "unknown extension", args: []string{notes}, code: cli.ExitUsage, stderrHas: "cannot tell the language"},
		{name: "unknown language", args: []string{"--lang", "ruby", "-c", "x"}, code: cli.ExitUsage, stderrHas: `"ruby" is not supported`},
		{name: "no code", args: nil, code: cli.ExitUsage, stderrHas: "no code to run"},
		{name: "code twice", args: []string{"-c", "x", script}, code: cli.ExitUsage, stderrHas: "give the code once"},
		{name: "fractional timeout", args: []string{"--timeout", "1500ms", "-c", "x"}, code: cli.ExitUsage, stderrHas: "whole seconds"},
		{name: "over-cap timeout", args: []string{"--timeout", "301s", "-c", "x"}, code: cli.ExitUsage, stderrHas: "cap of 300 seconds"},
		{name: "-i with code on stdin", args: []string{"-i", "-"}, code: cli.ExitUsage, stderrHas: "-i feeds standard input"},
		{name: "missing file", args: []string{"--file", filepath.Join(dir, "nope"), "-c", "x"}, code: cli.ExitUsage, stderrHas: "nope"},
		{name: "empty image", args: []string{"--image", "", "-c", "x"}, code: cli.ExitUsage, stderrHas: "--image"},
	}
	if publicEgress {
		tests = append(tests, struct {
			name      string
			args      []string
			stdin     string
			code      int
			stdout    string
			stderrHas string
		}{name: "network on never reaches loopback", args: []string{"--network", "-c", connect}, stdout: "unreachable\n"})
	} else {
		tests = append(tests, struct {
			name      string
			args      []string
			stdin     string
			code      int
			stdout    string
			stderrHas string
		}{name: "network on refused here", args: []string{"--network", "-c", connect}, code: exitRunFailed, stderrHas: "publicOnlyEgress"})
	}
	// Cold, then through parked sandboxes (pool_parked.go): each run that fits takes the parked sandbox a filler parked
	// (python in it pre-started) and must give what the cold run gave.
	for _, spares := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "parked"}[spares], func(t *testing.T) {
			if spares {
				env.useParked(t)
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					var parked []string // what was parked before the run
					if spares {
						env.waitParked(t)
						parked = env.settledParked(t)
					}
					code, stdout, stderr := runCommand(t, cli.OutputText, append(tt.args, env.flags()...), tt.stdin)
					if code != tt.code || stdout != tt.stdout || !strings.Contains(stderr, tt.stderrHas) {
						t.Errorf("exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q, stderr containing %q", code, stdout, stderr, tt.code, tt.stdout, tt.stderrHas)
					}
					if spares {
						// Usage errors run nothing; --network does not fit a parked sandbox.
						fits := tt.code != cli.ExitUsage && !slices.Contains(tt.args, "--network")
						// Only a claim takes an entry out of the index (the pool may have grown
						// past one: the run takes the newest).
						taken := 0
						for _, id := range parked {
							if _, err := os.Stat(filepath.Join(env.parkedIndex(t), id)); errors.Is(err, os.ErrNotExist) {
								taken++
							}
						}
						if want := map[bool]int{true: 1, false: 0}[fits]; taken != want {
							t.Errorf("parked sandboxes %v: %d taken, want %d", parked, taken, want)
						}
					}
				})
			}
		})
	}
}

func (e runtimeEnv) backendCaps(t *testing.T) capability.Set {
	t.Helper()
	b := e.open(t)
	defer b.Close()
	return b.Capabilities(context.Background())
}

func TestRunCommandJSON(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	code, stdout, stderr := runCommand(t, cli.OutputJSON, append([]string{"-l", "bash", "-c", "echo j; echo e >&2; exit 3"}, env.flags()...), "")
	if code != 3 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if stderr != "" {
		t.Errorf("-o json streamed to stderr: %q", stderr)
	}
	var res runcode.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("stdout is not one JSON result: %v\n%s", err, stdout)
	}
	if res.ExitCode != 3 || res.Stdout != "j\n" || res.Stderr != "e\n" || res.Language != "bash" || res.SandboxID == "" {
		t.Errorf("result %+v", res)
	}
}

// TestRunLargeFile: a FILE over the 1 MiB code cap runs (sent as a file, run by a one-line
// runner), in every language, as itself: its own name, its arguments' view of it (issue 25:
// the cap's message said to put large programs in files while a FILE was refused).
func TestRunLargeFile(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	dir := t.TempDir()
	pad := strings.Repeat("x", core.MaxCodeBytes)
	for _, tc := range []struct{ name, content, want string }{
		{"big.py", "import sys, os\n# " + pad + "\nprint(os.path.basename(sys.argv[0]), __name__)\n", "big.py __main__\n"},
		{"main.py", "print('named as the code file')\n# " + pad + "\n", "named as the code file\n"},
		{"big.js", "// " + pad + "\nconsole.log(require('path').basename(process.argv[1]))\n", "big.js\n"},
		{"big.sh", "# " + pad + "\necho from bash $BASH_VERSION | cut -c1-9\n", "from bash\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runCLI(t, append([]string{"run", p}, env.flags()...)...)
			if code != 0 || out != tc.want {
				t.Errorf("run %s: exit %d stdout %q stderr %q, want %q", tc.name, code, out, errs, tc.want)
			}
		})
	}
}
