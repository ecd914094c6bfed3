package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// fakeAgent records what a run does; unimplemented methods panic.
type fakeAgent struct {
	sbtypes.Agent
	exec func(req sbtypes.ExecRequest, stdout, stderr io.Writer) (sbtypes.ExecResult, error)

	mu      sync.Mutex
	written map[string]string
	dirs    []string
	execReq *sbtypes.ExecRequest
	killed  []string
	waited  []string
	closed  bool
}

func (a *fakeAgent) WriteFile(_ context.Context, p string, r io.Reader, _ uint32) error {
	data, err := io.ReadAll(r)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.written == nil {
		a.written = map[string]string{}
	}
	a.written[p] = string(data)
	return err
}

func (a *fakeAgent) Mkdir(_ context.Context, p string, _ uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dirs = append(a.dirs, p)
	return nil
}

func (a *fakeAgent) Exec(_ context.Context, req sbtypes.ExecRequest, stdout, stderr io.Writer) (sbtypes.ExecResult, error) {
	a.mu.Lock()
	a.execReq = &req
	a.mu.Unlock()
	return a.exec(req, stdout, stderr)
}

func (a *fakeAgent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return nil
}

// fakeProcessAgent is a fakeAgent that also reaches background processes: enough for the
// interpreters a run does not use to be removed.
type fakeProcessAgent struct{ *fakeAgent }

func (a fakeProcessAgent) Attach(context.Context, string, bool) (*client.Stream, error) {
	panic("attach: the run used a pre-started interpreter")
}
func (a fakeProcessAgent) WriteStdin(context.Context, string, io.Reader, bool) error {
	panic("stdin: the run used a pre-started interpreter")
}
func (a fakeProcessAgent) WriteStdinDeadline(context.Context, string, io.Reader, bool, time.Duration) error {
	panic("stdin: the run used a pre-started interpreter")
}
func (a fakeProcessAgent) RemoveProcess(context.Context, string) error {
	panic("remove: the run used a pre-started interpreter")
}
func (a fakeProcessAgent) Signal(_ context.Context, id, signal string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.killed = append(a.killed, id+" "+signal)
	return nil
}
func (a fakeProcessAgent) Wait(_ context.Context, id string) (sbtypes.ExecResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waited = append(a.waited, id)
	return sbtypes.ExecResult{ExitCode: -1, Signal: "SIGKILL"}, nil
}

func echoExec(req sbtypes.ExecRequest, stdout, stderr io.Writer) (sbtypes.ExecResult, error) {
	var in []byte
	if req.Stdin != nil {
		in, _ = io.ReadAll(req.Stdin)
	}
	io.WriteString(stdout, "out:"+string(in))
	io.WriteString(stderr, "err")
	return sbtypes.ExecResult{ExitCode: 3, Duration: 5 * time.Millisecond}, nil
}

// TestRunInCold: without interpreters waiting, the files and the code are written and the
// language's command exec'd in workdir; the result is the exec's, its sandbox fields unset.
func TestRunInCold(t *testing.T) {
	a := &fakeAgent{exec: echoExec}
	var live strings.Builder
	res, err := RunIn(t.Context(), a, nil, "/work", Request{Language: "JS", Code: "console.log(1)", Stdin: "abc", TimeoutSeconds: 9,
		Files: map[string][]byte{"data/in.txt": []byte("D"), "/tmp/abs": []byte("A")}}, Options{Stdout: &live})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Stdout != "out:abc" || res.Stderr != "err" || res.Language != "node" || res.DurationMs != 5 ||
		res.TimeoutSeconds != 9 || res.SandboxID != "" || res.Memory != "" || res.OutputCapBytes != DefaultOutputBytes {
		t.Errorf("result %+v", res)
	}
	if live.String() != "out:abc" {
		t.Errorf("live stdout %q", live.String())
	}
	if got := strings.Join(a.execReq.Argv, " "); got != "node main.js" || a.execReq.Cwd != "/work" || a.execReq.Timeout != 9*time.Second {
		t.Errorf("exec request %+v", a.execReq)
	}
	want := map[string]string{"/work/main.js": "console.log(1)", "/work/data/in.txt": "D", "/tmp/abs": "A"}
	for p, w := range want {
		if a.written[p] != w {
			t.Errorf("file %s = %q, want %q (written: %v)", p, a.written[p], w, a.written)
		}
	}
	if !slices.Equal(a.dirs, []string{"/tmp", "/work/data"}) {
		t.Errorf("directories made %v", a.dirs)
	}
	if a.closed {
		t.Error("RunIn closed the caller's agent")
	}
}

// TestRunInRefuses: a request that does not normalize never reaches the agent.
func TestRunInRefuses(t *testing.T) {
	a := &fakeAgent{}
	if _, err := RunIn(t.Context(), a, nil, "/work", Request{Language: "ruby", Code: "x"}, Options{}); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("ruby: %v", err)
	}
	if _, err := RunIn(t.Context(), nil, nil, "/work", Request{Language: "bash", Code: "x"}, Options{}); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("no agent: %v", err)
	}
	if a.execReq != nil || a.written != nil {
		t.Errorf("the agent was used: %+v", a)
	}
}

// TestRunInPrestartedOthersRemoved: interpreters the run does not use (another language, or a
// cap over theirs) are killed and waited for before the code runs cold, alone; pre's agent
// runs it when the caller gives none, and stays open.
func TestRunInPrestartedOthersRemoved(t *testing.T) {
	tests := []struct {
		name   string
		req    Request
		opts   Options
		argv   string
		killed []string
	}{
		{"other language", Request{Language: "bash", Code: "echo 4"}, Options{}, "bash main.sh", []string{"p-node SIGKILL", "p-py SIGKILL"}},
		{"cap over theirs", Request{Language: "python", Code: "print(4)"}, Options{MaxOutputBytes: 2 << 20}, "python3 main.py", []string{"p-node SIGKILL", "p-py SIGKILL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := fakeProcessAgent{&fakeAgent{exec: echoExec}}
			pre := NewPrestarted(a, 1<<20, map[Language]Waiting{Python: {ID: "p-py", ReadySeq: 1}, Node: {ID: "p-node", ReadySeq: 1}})
			res, err := RunIn(t.Context(), nil, pre, "/work", tt.req, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Language != tt.req.Language || res.ExitCode != 3 {
				t.Errorf("result %+v", res)
			}
			slices.Sort(a.killed)
			slices.Sort(a.waited)
			if !slices.Equal(a.killed, tt.killed) || len(a.waited) != len(tt.killed) {
				t.Errorf("killed %v waited %v, want %v", a.killed, a.waited, tt.killed)
			}
			if a.execReq == nil || strings.Join(a.execReq.Argv, " ") != tt.argv {
				t.Errorf("exec %+v, want %s", a.execReq, tt.argv)
			}
			if a.closed {
				t.Error("RunIn closed pre's agent")
			}
		})
	}
}

// TestRunInPrestartedNeedsProcesses: interpreters waiting behind an agent client that cannot
// reach background processes is an error, not a silent cold run next to them.
func TestRunInPrestartedNeedsProcesses(t *testing.T) {
	a := &fakeAgent{exec: echoExec}
	pre := NewPrestarted(a, 1<<20, map[Language]Waiting{Python: {ID: "p-py", ReadySeq: 1}})
	if _, err := RunIn(t.Context(), nil, pre, "/work", Request{Language: "python", Code: "x"}, Options{}); !errors.Is(err, sbtypes.ErrUnsupported) {
		t.Errorf("got %v, want ErrUnsupported", err)
	}
}

func TestProgram(t *testing.T) {
	for _, l := range Languages() {
		file, argv := Program(l)
		if file == "" || len(argv) == 0 || argv[len(argv)-1] != file {
			t.Errorf("%s: file %q argv %q", l, file, argv)
		}
		argv[0] = "changed"
		if _, again := Program(l); again[0] == "changed" {
			t.Errorf("%s: Program hands out its table", l)
		}
	}
}

// oldAgent is a process agent older than handed deadlines: it refuses deadlineMs (as an agent
// refuses any query parameter it does not know), before reading the code.
type oldAgent struct {
	fakeProcessAgent
	removed []string
}

func (a *oldAgent) WriteStdinDeadline(context.Context, string, io.Reader, bool, time.Duration) error {
	return fmt.Errorf("%w: query parameter \"deadlineMs\" is not known here (allowed: close)", sbtypes.ErrInvalid)
}

func (a *oldAgent) RemoveProcess(_ context.Context, id string) error {
	a.removed = append(a.removed, id)
	return nil
}

// TestRunInPrestartedOldAgent: a waiting interpreter whose agent refuses the handed deadline
// is removed and the code runs cold, with its exec's deadline, instead of the run failing.
func TestRunInPrestartedOldAgent(t *testing.T) {
	a := &oldAgent{fakeProcessAgent: fakeProcessAgent{&fakeAgent{exec: echoExec}}}
	pre := NewPrestarted(a, 1<<20, map[Language]Waiting{Python: {ID: "p-py", ReadySeq: 1}})
	res, err := RunIn(t.Context(), nil, pre, "/work", Request{Language: "python", Code: "print(4)", TimeoutSeconds: 7}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || a.execReq == nil || a.execReq.Timeout != 7*time.Second || !slices.Equal(a.removed, []string{"p-py"}) {
		t.Errorf("result %+v exec %+v removed %v: want a cold run with its deadline, the interpreter removed", res, a.execReq, a.removed)
	}
}
