package local

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
	"github.com/airlock-sandbox/airlock/spec"
)

func poolTemplate() spec.Sandbox {
	return spec.Sandbox{ID: "pt", Image: spec.Image{Host: true}, Labels: map[string]string{"purpose": "pool-test"}}
}

// newTestPool starts a pool that the test's cleanup closes (before the backend's cleanup runs).
func newTestPool(t *testing.T, b *Backend, opts PoolOptions, beforeCreate func(context.Context)) *Pool {
	t.Helper()
	p, err := newPool(t.Context(), b, poolTemplate(), opts, beforeCreate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	return p
}

func waitReady(t *testing.T, p *Pool, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d ready sandboxes", n), func() bool { return p.Stats().Size >= n })
}

// pooledIDs lists the backend's sandboxes carrying the pool's label and not claimed.
func pooledIDs(t *testing.T, b *Backend, key string) []string {
	t.Helper()
	list, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		if s.Labels[LabelPool] != key {
			continue
		}
		if _, err := os.Stat(filepath.Join(b.opts.StateDir, s.ID, claimedFile)); err == nil {
			continue
		}
		ids = append(ids, s.ID)
	}
	return ids
}

func TestPoolKey(t *testing.T) {
	a := poolTemplate()
	b := poolTemplate()
	b.ID, b.Labels = "other", map[string]string{"x": "y"}
	c := poolTemplate()
	c.Limits.Memory = "64Mi"
	ka, _ := PoolKey(a)
	kb, _ := PoolKey(b)
	kc, _ := PoolKey(c)
	if ka != kb {
		t.Errorf("id and labels changed the key: %s vs %s", ka, kb)
	}
	if ka == kc {
		t.Errorf("a different memory limit kept the key %s", ka)
	}
	if errs := (&spec.Sandbox{ID: "x", Image: spec.Image{Host: true}, Labels: map[string]string{LabelPool: ka, labelPoolFiller: "123-456"}}).Validate(""); len(errs) > 0 {
		t.Errorf("the pool's labels are not valid labels: %v", errs)
	}
}

func TestProcAlive(t *testing.T) {
	start, err := startTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		owner string
		want  bool
	}{
		{fmt.Sprintf("%d-%d", os.Getpid(), start), true},
		{fmt.Sprintf("%d-%d", os.Getpid(), start+1), false}, // a reused pid
		{"", false},
		{"12x-3", false},
		{"1", false},
	}
	for _, tt := range tests {
		if got := procAlive(tt.owner); got != tt.want {
			t.Errorf("procAlive(%q) = %v, want %v", tt.owner, got, tt.want)
		}
	}
}

// TestProcAliveZombie: an owner that has exited but is not yet reaped owns nothing more (a
// run's filler reconciles as soon as the run's files are closed, before its parent reaps it).
func TestProcAliveZombie(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	start, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st, err := readStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/bin/true (%d) did not exit", pid)
		}
	}
	owner := fmt.Sprintf("%d-%d", pid, start)
	if procAlive(owner) {
		t.Errorf("procAlive(%q) of an exited, unreaped process = true", owner)
	}
	if !alive(pid, start) {
		t.Errorf("alive(%d) = false before the zombie is reaped: its pid is not reusable yet", pid)
	}
}

func TestPoolRefusals(t *testing.T) {
	b := newTestBackend(t)
	short := poolTemplate()
	life := int64(5)
	short.Session.MaxLifetimeSeconds = &life
	reserved := poolTemplate()
	reserved.Labels[LabelPool] = "mine"
	badMem := poolTemplate()
	badMem.Limits.Memory = "lots"
	tests := []struct {
		name string
		tmpl spec.Sandbox
		opts PoolOptions
	}{
		{"size 0", poolTemplate(), PoolOptions{Size: 0}},
		{"max below size", poolTemplate(), PoolOptions{Size: 3, Max: 2}},
		{"negative pool memory", poolTemplate(), PoolOptions{Size: 1, Memory: -1}},
		{"max too large", poolTemplate(), PoolOptions{Size: 1, Max: MaxPoolSize + 1}},
		{"idle expiry under a second", poolTemplate(), PoolOptions{Size: 1, IdleExpiry: time.Millisecond}},
		{"idle expiry past the lifetime", short, PoolOptions{Size: 1, IdleExpiry: 5 * time.Second}},
		{"reserved label", reserved, PoolOptions{Size: 1}},
		{"bad template", badMem, PoolOptions{Size: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPool(t.Context(), b, tt.tmpl, tt.opts)
			if err == nil {
				p.Close(context.Background())
				t.Fatal("accepted")
			}
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("%v, want invalid", err)
			}
		})
	}
}

// TestPoolClaimRefillClose: a claim is a ready sandbox, recorded as claimed and no longer the
// pool's; the pool refills; Close terminates every unclaimed sandbox and nothing else.
func TestPoolClaimRefillClose(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	p := newTestPool(t, b, PoolOptions{Size: 2}, nil)
	waitReady(t, p, 2)
	before := pooledIDs(t, b, p.Key())
	if len(before) != 2 {
		t.Fatalf("pooled sandboxes %v, want 2", before)
	}
	s, err := p.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Labels[LabelPool] != p.Key() || s.Labels["purpose"] != "pool-test" {
		t.Errorf("claimed labels %v: want the template's and the pool's", s.Labels)
	}
	if st := p.Stats(); st.Hits != 1 || st.Misses != 0 {
		t.Errorf("stats after a claim from a full pool: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(b.opts.StateDir, s.ID, claimedFile)); err != nil {
		t.Errorf("claim not recorded: %v", err)
	}
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, res := run(t, a, "echo claimed"); res.ExitCode != 0 || out != "claimed\n" {
		t.Errorf("exec in a claimed sandbox: %q %+v", out, res)
	}
	a.Close()
	waitFor(t, "the pool to refill", func() bool { st := p.Stats(); return st.Size == 2 && st.Refills >= 3 })
	unclaimed := pooledIDs(t, b, p.Key())
	pids := map[string]int{}
	for _, id := range unclaimed {
		pids[id] = b.sessionInitPID(id)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range unclaimed {
		assertGone(t, b, id, pids[id])
	}
	if _, err := b.Get(ctx, s.ID); err != nil {
		t.Errorf("Close terminated the claimed sandbox: %v", err)
	}
	if _, err := p.Claim(ctx); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("claim from a closed pool: %v, want conflict", err)
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPoolConcurrentClaims: many claims at once never get the same sandbox (run with -race).
func TestPoolConcurrentClaims(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	const size, claimers = 6, 16
	p := newTestPool(t, b, PoolOptions{Size: size}, nil)
	waitReady(t, p, size)
	var (
		mu   sync.Mutex
		ids  = map[string]int{}
		wg   sync.WaitGroup
		errs = make(chan error, claimers)
	)
	start := make(chan struct{})
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s, err := p.Claim(ctx)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			if prev, dup := ids[s.ID]; dup {
				errs <- fmt.Errorf("claimers %d and %d both got %s", prev, i, s.ID)
			}
			ids[s.ID] = i
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := p.Stats()
	if len(ids) != claimers || st.Hits+st.Misses != claimers {
		t.Errorf("%d distinct sandboxes, stats %+v; want %d claims", len(ids), st, claimers)
	}
	if st.Hits < 1 || st.Hits > size+st.Refills {
		t.Errorf("hits %d with %d prefilled and %d refills", st.Hits, size, st.Refills)
	}
	for id := range ids {
		p.Discard(id)
	}
}

// TestPoolMissFallsBack: a claim on an empty pool creates a sandbox cold, counts a miss and
// raises the target (up to Max).
func TestPoolMissFallsBack(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	gate := make(chan struct{})
	p := newTestPool(t, b, PoolOptions{Size: 1, Max: 2}, func(ctx context.Context) {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	})
	s, err := p.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, pooled := s.Labels[LabelPool]; pooled {
		t.Errorf("a cold sandbox carries the pool label: %v", s.Labels)
	}
	st := p.Stats()
	if st.Misses != 1 || st.Hits != 0 || st.Target != 2 {
		t.Errorf("stats after a miss: %+v, want 1 miss and target 2", st)
	}
	if _, err := p.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Misses != 2 || st.Target != 2 {
		t.Errorf("stats after a second miss: %+v, want the target held at max 2", st)
	}
	close(gate)
	waitReady(t, p, 2)
	s2, err := p.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Labels[LabelPool] != p.Key() || p.Stats().Hits != 1 {
		t.Errorf("claim after the refill: labels %v, stats %+v", s2.Labels, p.Stats())
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPoolIdleExpiry: a sandbox left unclaimed past IdleExpiry is terminated and replaced.
func TestPoolIdleExpiry(t *testing.T) {
	b := newTestBackend(t)
	p := newTestPool(t, b, PoolOptions{Size: 1, IdleExpiry: time.Second}, nil)
	waitReady(t, p, 1)
	first := pooledIDs(t, b, p.Key())
	if len(first) != 1 {
		t.Fatalf("pooled %v, want 1", first)
	}
	pid := b.sessionInitPID(first[0])
	waitFor(t, "the sandbox to expire", func() bool { return p.Stats().Expired >= 1 })
	assertGone(t, b, first[0], pid)
	waitFor(t, "a replacement", func() bool {
		ids := pooledIDs(t, b, p.Key())
		return len(ids) == 1 && ids[0] != first[0]
	})
}

// TestPoolReconcileKeepsLiveOwners: another backend on the same state dir leaves the pooled
// sandboxes of a live pool alone.
func TestPoolReconcileKeepsLiveOwners(t *testing.T) {
	b1 := newTestBackend(t)
	p := newTestPool(t, b1, PoolOptions{Size: 2}, nil)
	waitReady(t, p, 2)
	ids := pooledIDs(t, b1, p.Key())
	b2 := newTestBackendAt(t, b1.opts.StateDir)
	for _, id := range ids {
		if _, err := b2.Get(t.Context(), id); err != nil {
			t.Errorf("the second backend lost %s of a live pool: %v", id, err)
		}
	}
	s, err := p.Claim(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p.Discard(s.ID)
}

// TestPoolReconcileReapsOrphans: when the pool's process dies, the next backend reaps its
// unclaimed sandboxes and keeps the claimed one.
func TestPoolReconcileReapsOrphans(t *testing.T) {
	testutil.RequireRoot(t)
	state := testStateDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPoolHelperProcess$")
	cmd.Env = append(os.Environ(), "AIRLOCK_POOL_HELPER="+state, "AIRLOCK_HELPER_AGENT="+agentBin)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var report poolHelperReport
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if json.Unmarshal(sc.Bytes(), &report) == nil && report.Claimed != "" {
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if report.Claimed == "" || len(report.Pooled) == 0 {
		t.Fatalf("helper reported %+v", report)
	}
	b := newTestBackendAt(t, state)
	for id, pid := range report.Pooled {
		assertGone(t, b, id, pid)
	}
	if _, err := b.Get(t.Context(), report.Claimed); err != nil {
		t.Errorf("the claimed sandbox was reaped: %v", err)
	}
}

type poolHelperReport struct {
	Claimed string         `json:"claimed"`
	Pooled  map[string]int `json:"pooled"` // session id → init pid
}

// TestPoolHelperProcess is the other process of TestPoolReconcileReapsOrphans: it fills a
// pool, claims one sandbox, reports, and waits to be killed.
func TestPoolHelperProcess(t *testing.T) {
	state := os.Getenv("AIRLOCK_POOL_HELPER")
	if state == "" {
		t.Skip("helper process only")
	}
	ctx := context.Background()
	b, err := New(ctx, Options{StateDir: state, AgentPath: os.Getenv("AIRLOCK_HELPER_AGENT")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(ctx, b, poolTemplate(), PoolOptions{Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 2)
	s, err := p.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 2)
	rep := poolHelperReport{Claimed: s.ID, Pooled: map[string]int{}}
	for _, id := range pooledIDs(t, b, p.Key()) {
		rep.Pooled[id] = b.sessionInitPID(id)
	}
	line, _ := json.Marshal(rep)
	fmt.Printf("%s\n", line)
	time.Sleep(time.Hour)
}

// TestPoolCreateFailures: a template that stops creating is counted, retried with a growing
// wait, and a claim then fails as a cold create would, rather than hang.
func TestPoolCreateFailures(t *testing.T) {
	b := newTestBackend(t)
	tmpl := poolTemplate()
	// Resolves, but init cannot read it: mode 0700 and the host root's, an id no sandbox maps.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	tmpl.Image = spec.Image{Dir: dir}
	p, err := NewPool(t.Context(), b, tmpl, PoolOptions{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	waitFor(t, "failed refills", func() bool { return p.Stats().Failures >= 2 })
	if _, err := p.Claim(t.Context()); err == nil {
		t.Fatal("claim from a pool that cannot create succeeded")
	}
	if st := p.Stats(); st.Size != 0 || st.Misses != 1 || st.Hits != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestPoolRefillDefer: a claim that leaves the pool non-empty holds the refill back (it would
// take CPU from the claimer's call) until the sandbox is discarded, and then for
// sessions.ParkQuiet more (the next call back to back comes sooner); one that empties it does
// not.
func TestPoolRefillDefer(t *testing.T) {
	b := newTestBackend(t)
	p := newTestPool(t, b, PoolOptions{Size: 2}, nil)
	waitReady(t, p, 2)
	deferred := func() time.Duration {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.deferUntil.IsZero() {
			return 0
		}
		return time.Until(p.deferUntil)
	}
	s1, err := p.Claim(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := deferred(); d <= sessions.ParkQuiet {
		t.Errorf("a claim leaving one ready sandbox holds the refill back %v, want its call's (up to %v)", d, refillDefer)
	}
	p.Discard(s1.ID)
	if d := deferred(); d <= 0 || d > sessions.ParkQuiet {
		t.Errorf("a discard holds the refill back %v, want at most %v (calls back to back)", d, sessions.ParkQuiet)
	}
	waitReady(t, p, 2)
	for range 2 {
		s, err := p.Claim(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Discard(s.ID)
	}
	if d := deferred(); d != 0 {
		t.Errorf("a claim that emptied the pool held the refill back %v", d)
	}
}

// TestPoolSkipsDead: a ready sandbox that died in the pool is never handed out.
func TestPoolSkipsDead(t *testing.T) {
	b := newTestBackend(t)
	p := newTestPool(t, b, PoolOptions{Size: 1}, nil)
	waitReady(t, p, 1)
	ids := pooledIDs(t, b, p.Key())
	if len(ids) != 1 {
		t.Fatalf("pooled %v", ids)
	}
	pid := b.sessionInitPID(ids[0])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, ids[0], pid)
	s, err := p.Claim(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Discard(s.ID)
	if s.ID == ids[0] {
		t.Fatalf("claimed the dead sandbox %s", s.ID)
	}
	if st := p.Stats(); st.Dead != 1 {
		t.Errorf("stats %+v, want the dead sandbox counted", st)
	}
	if _, err := b.Get(t.Context(), s.ID); err != nil {
		t.Errorf("claimed sandbox is not alive: %v", err)
	}
}

// TestPoolStaleEtc: a ready sandbox made before the host's /etc changed is skipped at claim
// (terminated, counted) and the claim gets a current one.
func TestPoolStaleEtc(t *testing.T) {
	b := newTestBackend(t)
	setMotd := fakeHostEtc(t, b, "one\n") // spare_test.go
	p := newTestPool(t, b, PoolOptions{Size: 1}, nil)
	waitReady(t, p, 1)
	stale := pooledIDs(t, b, p.Key())
	setMotd("two\n")
	s, err := p.Claim(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Discard(s.ID)
	if len(stale) != 1 || s.ID == stale[0] || p.Stats().Stale != 1 {
		t.Fatalf("claimed %s of %v, stats %+v; want a new sandbox and one stale", s.ID, stale, p.Stats())
	}
	a, err := b.Connect(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if out, _, _ := run(t, a, "cat /etc/motd"); out != "two\n" {
		t.Errorf("/etc/motd: %q", out)
	}
}

// TestPoolMemory: misses raise the target past Size only while the sandboxes fit in the pool
// memory, counted at the most one ready sandbox was measured to hold; without a pool memory
// (and no Max) the target stays at Size.
func TestPoolMemory(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	probe := newTestPool(t, b, PoolOptions{Size: 1, Memory: 1 << 40}, nil)
	waitReady(t, probe, 1)
	m := probe.Stats().SandboxMemory
	if m <= 0 {
		t.Fatalf("a ready sandbox's memory was not measured: %+v", probe.Stats())
	}
	t.Logf("one ready sandbox holds %d KiB", m>>10)
	// A sandbox's measure varies from one to the next (the probe's is only a sign that it is
	// taken), so each case's pool memory is counted in what its own pool measured: its first
	// create is the only one measured, the later ones wait for the test.
	tests := []struct {
		name string
		room int // sandboxes the pool memory holds (and a half); 0: no pool memory, -1: unbounded
		want int
	}{
		{"no pool memory", 0, 1},
		{"room for three", 3, 3},
		{"room for all", -1, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate := make(chan struct{})
			var creates atomic.Int32
			var memory int64
			if tt.room != 0 {
				memory = 1 << 40
			}
			p := newTestPool(t, b, PoolOptions{Size: 1, Memory: memory}, func(ctx context.Context) {
				if creates.Add(1) == 1 {
					return
				}
				select {
				case <-gate:
				case <-ctx.Done():
				}
			})
			waitReady(t, p, 1)
			if tt.room > 0 {
				p.mu.Lock()
				m := p.stats.SandboxMemory
				p.opts.Memory = int64(tt.room)*m + m/2
				p.mu.Unlock()
			}
			for range 5 {
				s, err := p.Claim(ctx)
				if err != nil {
					t.Fatal(err)
				}
				p.Discard(s.ID)
			}
			st := p.Stats()
			if st.Hits != 1 || st.Misses != 4 || st.Target != tt.want {
				t.Errorf("after 1 hit and 4 misses: %+v, want target %d", st, tt.want)
			}
			if tt.room != 0 && st.SandboxMemory <= 0 {
				t.Errorf("sandbox memory not measured: %+v", st)
			}
			close(gate)
		})
	}
}

// TestPoolMissWaitsForCreate: a claim that finds the pool empty while a background create is
// under way waits for that sandbox instead of creating a second one beside it (one claim per
// create in flight: the next creates its own), and counts a miss that waited.
func TestPoolMissWaitsForCreate(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	gate := make(chan struct{})
	// The create stays in flight, its sandbox made, until the test opens the gate.
	hold := func(ctx context.Context, _ *sandbox.Session, _ sandbox.Agent) (prestarted.Interpreters, error) {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil, errors.New("nothing pre-started by the test")
	}
	p := newTestPool(t, b, PoolOptions{Size: 1, Prestart: hold}, nil)
	waitFor(t, "a create in flight", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inflight == 1
	})
	type claimed struct {
		s   *sandbox.Session
		err error
	}
	first := make(chan claimed, 1)
	go func() {
		s, err := p.Claim(ctx)
		first <- claimed{s, err}
	}()
	waitFor(t, "the claim waiting for the create", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.waiters == 1
	})
	cold, err := p.Claim(ctx) // the one create in flight is taken: this one creates its own
	if err != nil {
		t.Fatal(err)
	}
	if _, pooled := cold.Labels[LabelPool]; pooled {
		t.Errorf("the second claim got a pooled sandbox: %v", cold.Labels)
	}
	p.Discard(cold.ID)
	close(gate)
	c := <-first
	if c.err != nil {
		t.Fatal(c.err)
	}
	if c.s.Labels[LabelPool] != p.Key() {
		t.Errorf("the waiting claim got %v, want the pool's sandbox", c.s.Labels)
	}
	p.Discard(c.s.ID)
	if st := p.Stats(); st.Misses != 2 || st.Waited != 1 || st.Hits != 0 {
		t.Errorf("stats %+v: want 2 misses, 1 of them waited, no hit", st)
	}
}
