// Package pause settles a sandbox's v2 cgroup frozen or thawed and refuses agent calls while it is paused.
package pause

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Timeout bounds how long a freeze or thaw may take to settle.
const Timeout = 2 * time.Second

// SetV2 freezes or thaws the v2 cgroup dir and waits, bounded by Timeout, until every task has
// settled in that state.
func SetV2(ctx context.Context, dir string, frozen bool) error {
	want := "0"
	if frozen {
		want = "1"
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(want), 0); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	for {
		ev, err := os.Open(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return err
		}
		got, err := parseFrozenEvent(ev)
		ev.Close()
		if err != nil {
			return err
		}
		if got == frozen {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s did not settle (frozen %v, wanted %v)", dir, got, frozen)
		case <-time.After(time.Millisecond):
		}
	}
}

// parseFrozenEvent reads the "frozen" line of a v2 cgroup.events file: whether every task of
// the cgroup has actually stopped.
func parseFrozenEvent(r io.Reader) (bool, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == "frozen" {
			switch v {
			case "0":
				return false, nil
			case "1":
				return true, nil
			}
			return false, fmt.Errorf("cgroup.events: frozen %q", v)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, errors.New("cgroup.events has no frozen line")
}

// Agent is the agent client a paused sandbox refuses: while the sandbox is paused, every call
// is refused at once with sandbox.ErrConflict instead of waiting on a frozen agent. The pause
// record (the freezer's state, or a gVisor sandbox's mark file) is read on each call (a few
// microseconds), so a pause made by another process counts too.
type Agent struct {
	*client.Client
	fz sessions.Freezer
	id string
}

// NewAgent wraps c, the agent client of session id whose freezer is fz.
func NewAgent(c *client.Client, fz sessions.Freezer, id string) *Agent {
	return &Agent{Client: c, fz: fz, id: id}
}

func (a *Agent) check() error {
	if p, err := a.fz.Paused(); err == nil && p {
		return fmt.Errorf("%w: session %s is paused: resume it first", sandbox.ErrConflict, a.id)
	}
	return nil
}

func (a *Agent) Health(ctx context.Context) (sandbox.Health, error) {
	if err := a.check(); err != nil {
		return sandbox.Health{}, err
	}
	return a.Client.Health(ctx)
}

func (a *Agent) Shutdown(ctx context.Context) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Shutdown(ctx)
}

func (a *Agent) Exec(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	if err := a.check(); err != nil {
		return sandbox.ExecResult{}, err
	}
	return a.Client.Exec(ctx, req, stdout, stderr)
}

func (a *Agent) ExecStream(ctx context.Context, req sandbox.ExecRequest, opts ...client.ExecOption) (*client.Stream, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.ExecStream(ctx, req, opts...)
}

func (a *Agent) ReadFile(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.ReadFile(ctx, path, offset, length)
}

func (a *Agent) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.WriteFile(ctx, path, r, mode)
}

func (a *Agent) Mkdir(ctx context.Context, path string, mode uint32) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Mkdir(ctx, path, mode)
}

func (a *Agent) List(ctx context.Context, path string) ([]sandbox.FileInfo, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.List(ctx, path)
}

func (a *Agent) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	if err := a.check(); err != nil {
		return sandbox.FileInfo{}, err
	}
	return a.Client.Stat(ctx, path)
}

func (a *Agent) Remove(ctx context.Context, path string, recursive bool) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Remove(ctx, path, recursive)
}

func (a *Agent) Rename(ctx context.Context, from, to string) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Rename(ctx, from, to)
}

func (a *Agent) StartProcess(ctx context.Context, req client.ProcessRequest, opts ...client.ExecOption) (client.Process, error) {
	if err := a.check(); err != nil {
		return client.Process{}, err
	}
	return a.Client.StartProcess(ctx, req, opts...)
}

func (a *Agent) Processes(ctx context.Context) ([]client.Process, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.Processes(ctx)
}

func (a *Agent) Process(ctx context.Context, id string) (client.Process, error) {
	if err := a.check(); err != nil {
		return client.Process{}, err
	}
	return a.Client.Process(ctx, id)
}

func (a *Agent) RemoveProcess(ctx context.Context, id string) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.RemoveProcess(ctx, id)
}

func (a *Agent) Attach(ctx context.Context, id string, fromStart bool) (*client.Stream, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.Attach(ctx, id, fromStart)
}

func (a *Agent) WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.WriteStdin(ctx, id, r, closeAfter)
}

func (a *Agent) Handoff(ctx context.Context, id string, req client.HandoffRequest) (*client.Stream, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.Handoff(ctx, id, req)
}

func (a *Agent) Signal(ctx context.Context, id, signal string) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Signal(ctx, id, signal)
}

func (a *Agent) Wait(ctx context.Context, id string) (sandbox.ExecResult, error) {
	if err := a.check(); err != nil {
		return sandbox.ExecResult{}, err
	}
	return a.Client.Wait(ctx, id)
}

func (a *Agent) Resize(ctx context.Context, id string, rows, cols int) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Resize(ctx, id, rows, cols)
}
