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

func (a fakeProcessAgent) Handoff(context.Context, string, client.HandoffRequest) (*client.Stream, error) {
	panic("handoff: the run used a pre-started interpreter")
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

// TestRunInPrestartedOthersRemoved: interpreters the run does not use (another language) are
// killed and waited for before the code runs cold, alone; pre's agent
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := fakeProcessAgent{&fakeAgent{exec: echoExec}}
			pre := NewPrestarted(a, map[Language]string{Python: "p-py", Node: "p-node"})
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
	pre := NewPrestarted(a, map[Language]string{Python: "p-py"})
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

// refusingAgent answers a handoff with err and records what it was handed.
type refusingAgent struct {
	fakeProcessAgent
	err    error
	handed []client.HandoffRequest
}

func (a *refusingAgent) Handoff(_ context.Context, id string, req client.HandoffRequest) (*client.Stream, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if req.More != nil {
		panic("an in-memory stdin went as a stream")
	}
	a.handed = append(a.handed, req)
	return nil, a.err
}

// TestRunInPrestartedHandoff: the run's code goes to the waiting interpreter in one handoff
// with the run's deadline and caps (the agent keeps them). An agent that has no such process
// any more (exited: conflict) or no handoff at all (older: not found) gets the code cold, its
// exec keeping the deadline, after the interpreter is killed; any other refusal is the run's
// error, never a second attempt.
func TestRunInPrestartedHandoff(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		cold bool
	}{
		{"exited", fmt.Errorf("%w: process p-py has exited", sbtypes.ErrConflict), true},
		{"older agent", fmt.Errorf("%w: no endpoint POST /v1/processes/p-py/handoff", sbtypes.ErrNotFound), true},
		{"unreachable", fmt.Errorf("%w: dial", sbtypes.ErrUnreachable), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &refusingAgent{fakeProcessAgent: fakeProcessAgent{&fakeAgent{exec: echoExec}}, err: tt.err}
			pre := NewPrestarted(a, map[Language]string{Python: "p-py"})
			res, err := RunIn(t.Context(), nil, pre, "/work", Request{Language: "python", Code: "print(4)", Stdin: "in", TimeoutSeconds: 7}, Options{MaxOutputBytes: 99})
			want := client.HandoffRequest{Timeout: 7 * time.Second, MaxStdout: 99, MaxStderr: 99, Input: []byte("8 1\nprint(4)in")}
			if len(a.handed) != 1 || fmt.Sprint(a.handed[0]) != fmt.Sprint(want) {
				t.Errorf("handed %+v, want %+v", a.handed, want)
			}
			if !tt.cold {
				if !errors.Is(err, tt.err) || a.execReq != nil {
					t.Errorf("got %+v %v (exec %+v), want the refusal as the run's error", res, err, a.execReq)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 3 || res.Stdout != "out:in" || a.execReq == nil || a.execReq.Timeout != 7*time.Second || a.execReq.MaxStdout != 99 {
				t.Errorf("result %+v exec %+v: want a cold run with its deadline, caps and stdin from the start", res, a.execReq)
			}
			if !slices.Equal(a.killed, []string{"p-py SIGKILL"}) || !slices.Equal(a.waited, []string{"p-py"}) {
				t.Errorf("killed %v waited %v: the interpreter must be gone before the cold run", a.killed, a.waited)
			}
		})
	}
}
