package local

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sched"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
)

// prestartValue is what the test's Prestart leaves: the agent it was given, and whether the
// pool released it.
type prestartValue struct {
	id    string
	agent sandbox.Agent
	mu    sync.Mutex
	shut  bool
}

func (v *prestartValue) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.shut = true
	return v.agent.Close()
}

func (v *prestartValue) State() ([]byte, error) { return []byte(v.id), nil }

func (v *prestartValue) closed() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.shut
}

// TestPoolPrestart: Prestart runs in each pooled sandbox before it is offered (what it
// started is there at claim), its value goes to ClaimForRun's caller, which records no claim on
// disk; Claim, expiry and Close release values nobody got; a failing Prestart leaves the
// sandbox offered without a value; a miss has none.
func TestPoolPrestart(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	var mu sync.Mutex
	values := map[string]*prestartValue{}
	fail := false
	prestart := func(ctx context.Context, sess *sandbox.Session, a sandbox.Agent) (prestarted.Interpreters, error) {
		mu.Lock()
		f := fail
		mu.Unlock()
		if f {
			return nil, errors.New("prestart refused by the test")
		}
		if err := a.WriteFile(ctx, "/tmp/prestarted", nil, 0o644); err != nil {
			return nil, err
		}
		v := &prestartValue{id: sess.ID, agent: a}
		mu.Lock()
		values[sess.ID] = v
		mu.Unlock()
		return v, nil
	}
	p := newTestPool(t, b, PoolOptions{Size: 2, Prestart: prestart}, nil)
	waitReady(t, p, 2)

	s, v, err := p.ClaimForRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pv, ok := v.(*prestartValue)
	if !ok || pv.id != s.ID {
		t.Fatalf("claim got %#v for %s: want its sandbox's prestart value", v, s.ID)
	}
	if _, err := pv.agent.Stat(ctx, "/tmp/prestarted"); err != nil {
		t.Errorf("what Prestart did is not in the claimed sandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.opts.StateDir, s.ID, claimedFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ClaimForRun recorded a claim on disk: %v", err)
	}
	if pv.closed() {
		t.Error("the claimed value was closed by the pool")
	}
	pv.Close()
	p.Discard(s.ID)

	// Claim drops the value: it is released.
	s2, err := p.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	v2 := values[s2.ID]
	mu.Unlock()
	if v2 == nil || !v2.closed() {
		t.Errorf("Claim did not release the prestart value of %s", s2.ID)
	}
	p.Discard(s2.ID)

	// A failing Prestart: the sandbox is still offered, without a value.
	waitFor(t, "the pool to refill", func() bool { st := p.Stats(); return st.Size == 2 && st.Creating == 0 })
	mu.Lock()
	fail = true
	mu.Unlock()
	s3, v3, err := p.ClaimForRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v3 == nil {
		t.Error("a sandbox prestarted before the failures came without its value")
	}
	release(v3)
	p.Discard(s3.ID)
	waitFor(t, "a refill with a failing prestart", func() bool { st := p.Stats(); return st.Size == 2 && st.Creating == 0 })
	var unvalued int
	for range 2 {
		s, v, err := p.ClaimForRun(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v == nil {
			unvalued++
		}
		release(v)
		p.Discard(s.ID)
	}
	if unvalued == 0 {
		t.Error("no sandbox came from the failing prestart without a value")
	}

	// Close releases the values of sandboxes still ready.
	mu.Lock()
	fail = false
	mu.Unlock()
	waitFor(t, "the pool to refill", func() bool { st := p.Stats(); return st.Size == 2 && st.Creating == 0 })
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, v := range values {
		if !v.closed() {
			t.Errorf("value of %s never released", id)
		}
	}
}

// TestPoolRefillIdle: a refill starts idle (issue 26: it must not delay the call it refills
// for), its init and agent under SCHED_IDLE while Prestart runs, and is put back to the pool's
// own scheduling, every thread, before it is offered.
func TestPoolRefillIdle(t *testing.T) {
	b := newTestBackend(t)
	normal, own := sched.Normal()
	if !normal || !sched.Supported() {
		t.Skip("this test runs idle already, or not as root: nothing to start idle")
	}
	threads := func(id string) map[int]sched.Thread {
		s := b.sessionOf(id)
		if s == nil {
			t.Errorf("session %s is not this backend's", id)
			return nil
		}
		pids, err := s.cg.procs()
		if err != nil {
			t.Error(err)
		}
		out := map[int]sched.Thread{}
		for _, pid := range pids {
			th, _ := sched.Threads(pid) // exited meanwhile: none
			maps.Copy(out, th)
		}
		return out
	}
	var mu sync.Mutex
	starting := map[string]map[int]sched.Thread{}
	prestart := func(ctx context.Context, sess *sandbox.Session, a sandbox.Agent) (prestarted.Interpreters, error) {
		th := threads(sess.ID)
		mu.Lock()
		starting[sess.ID] = th
		mu.Unlock()
		return &prestartValue{id: sess.ID, agent: a}, nil
	}
	p := newTestPool(t, b, PoolOptions{Size: 1, Prestart: prestart}, nil)
	waitReady(t, p, 1)
	s, v, err := p.ClaimForRun(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := starting[s.ID]
	mu.Unlock()
	if len(before) == 0 {
		t.Fatalf("no thread of %s seen while it started", s.ID)
	}
	for tid, th := range before {
		if !th.Idle {
			t.Errorf("while starting, thread %d of the refill runs %+v, want SCHED_IDLE", tid, th)
		}
	}
	after := threads(s.ID)
	if len(after) == 0 {
		t.Fatalf("no thread of %s once offered", s.ID)
	}
	for tid, th := range after {
		if th.Idle || th.Nice != own {
			t.Errorf("once offered, thread %d of the refill runs %+v, want normal at the pool's nice %d", tid, th, own)
		}
	}
	// The threads that started it are back where they were once no refill is under way (one
	// runs idle, on its locked thread, while it starts init).
	v.Close()
	p.Discard(s.ID)
	if err := p.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	mine, err := sched.Threads(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for tid, th := range mine {
		if th.Idle || th.Nice != own {
			t.Errorf("thread %d of this process left at %+v, want normal at nice %d", tid, th, own)
		}
	}
}
