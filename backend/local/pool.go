package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	sbstats "github.com/airlock-sandbox/airlock/backend/local/stats"
	"github.com/airlock-sandbox/airlock/internal/sched"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
	"github.com/airlock-sandbox/airlock/spec"
)

// Labels of a sandbox a pool created. They are set at creation, so session.json says from
// birth that a sandbox is pooled and which process's pool holds it; a claim is recorded as a
// file (claimedFile) in the session's state dir. A later process's reconcile reaps a pooled,
// unclaimed sandbox whose pool's process is gone (see reapablePooled); nobody else could ever
// claim it.
const (
	// LabelPool names the pool (a hash of its template) a sandbox was made for.
	LabelPool = "airlock.pool"
	// labelPoolFiller is the process holding the pool: "<pid>-<start time in clock ticks>".
	labelPoolFiller = "airlock.pool.owner"
	claimedFile     = "claimed"
)

// Pool bounds.
const (
	// MaxPoolSize bounds PoolOptions.Max.
	MaxPoolSize = 4096
	// DefaultPoolIdleExpiry is how long a ready sandbox waits before it is replaced.
	DefaultPoolIdleExpiry = 10 * time.Minute
	// reapQueue is how many discarded sandboxes may wait for the background reaper before
	// Discard terminates on the caller's path (back-pressure).
	reapQueue = 256
	// maxRefillBackoff bounds the wait between failed refills.
	maxRefillBackoff = 30 * time.Second
	// prestartTimeout bounds PoolOptions.Prestart in one sandbox.
	prestartTimeout = 30 * time.Second
	// refillDefer is the longest a refill waits for the claimer of a sandbox to be done while
	// the pool still holds others: creating a sandbox takes CPU from the claimer's own call
	// (on 2 cores a claim-to-first-exec goes from ~4 ms to ~10 ms). A claim that empties the
	// pool refills at once; a Discard while the pool holds others, sessions.ParkQuiet later,
	// so that calls back to back (the next claim comes sooner) run with no refill beside them
	// (bench BenchmarkRefillBeside), as parked sandboxes' filler waits (pool_parked.go).
	refillDefer = time.Second
	// maxMissWait bounds how long a claim that found the pool empty waits for the create in
	// flight before it creates its own (a create takes ~50-100 ms here, seconds on a machine
	// under heavy load).
	maxMissWait = 5 * time.Second
)

// PoolOptions configure a Pool.
type PoolOptions struct {
	// Size is how many ready sandboxes the pool keeps (at least 1).
	Size int
	// Max is the most the pool keeps, ready or being created (default Size, or MaxPoolSize
	// when Memory is set, at most MaxPoolSize). Each claim that finds the pool empty raises the
	// pool's target by one, up to Max and within Memory; each sandbox that expires unclaimed
	// lowers it by one, down to Size. So the pool grows to the call rate it sees: calls that come
	// faster than one refill find it empty and raise it.
	Max int
	// Memory (the pool memory) bounds the host memory the pool's sandboxes hold while they
	// wait, in bytes (0: only Max bounds it): the target is raised past Size only while
	// target+1 sandboxes of the most memory one has been measured to hold (its memory cgroup's
	// usage once ready, interpreters pre-started: PoolStats.SandboxMemory) fit in it. Size
	// sandboxes are kept whatever they hold.
	Memory int64
	// IdleExpiry is how long a ready sandbox may wait unclaimed before it is terminated and
	// replaced (default DefaultPoolIdleExpiry); it must be shorter than the template's lifetime,
	// and a claimed sandbox has at least lifetime - IdleExpiry left.
	IdleExpiry time.Duration
	Logger     *slog.Logger
	// Prestart, when set, runs in every sandbox the pool creates, after its warm-up exec and
	// before it is offered: it may leave work started and waiting in the sandbox (runcode starts
	// language interpreters, see runcode.Prestart). What it returns is handed to the claimer
	// with the sandbox (ClaimForRun); a claim that finds the pool empty gets a cold sandbox
	// and nil. Claim hands the sandbox out with what Prestart started still in it (only its
	// value is released): give a pool with Prestart to callers that know it. An error is logged and the sandbox offered without it: Prestart cleans up what it
	// started before failing. ctx ends when the pool closes or after prestartTimeout.
	//
	// agent is a client of the sandbox's agent. When Prestart succeeds it owns agent (it may keep
	// it, with its open connections, in its value for the claimer, or close it); the value is
	// closed if the pool terminates the sandbox unclaimed or a claim drops it (Claim), and is the
	// claimer's to close otherwise. When Prestart fails, the pool closes agent.
	Prestart prestarted.Func
}

// PoolStats count what a pool did.
type PoolStats struct {
	// Hits are claims served from the pool; Misses claims that found it empty: of them, Waited
	// got the sandbox a background create was making (they waited for it), the rest created
	// one cold.
	Hits, Misses, Waited uint64
	// Size is how many sandboxes are ready now; Creating how many are being created; Target
	// how many the pool aims to hold.
	Size, Creating, Target int
	// Refills are sandboxes the pool created in the background; Failures its failed creates;
	// Expired ready sandboxes terminated for waiting longer than IdleExpiry; Dead ready
	// sandboxes found ended at claim time (skipped); Stale ready sandboxes skipped at claim
	// because the host's /etc changed after they were made.
	Refills, Failures, Expired, Dead, Stale uint64
	// Reaping is how many sandboxes wait for or are in a background termination;
	// ReapFailures those terminations that failed (logged).
	Reaping      int
	ReapFailures uint64
	// SandboxMemory is the most host memory one ready sandbox was measured to hold (bytes;
	// 0 until one is), what PoolOptions.Memory is counted in.
	SandboxMemory int64
}

// Pool keeps sandboxes of one template created and their agents answering, so that a claim is
// a pop instead of a create. Claimed sandboxes are single-use: the caller terminates them
// (Terminate, or Discard to do it off the caller's path). Close the pool before its backend.
type Pool struct {
	b      *Backend
	tmpl   spec.Sandbox
	key    string
	filler string
	opts   PoolOptions
	log    *slog.Logger

	ctx    context.Context // ends in-flight creates on Close
	cancel context.CancelFunc
	wake   chan struct{}
	reapQ  chan string
	wg     sync.WaitGroup

	mu     sync.Mutex
	ready  []pooled // claims pop the newest (most lifetime left); expiry takes the oldest
	target int
	// deferUntil holds refills back until then (zero: refill now); see refillDefer.
	deferUntil time.Time
	// inflight counts background creates under way (past beforeCreate); waiters the claims
	// waiting for one of them (at most one each); changed is closed and replaced whenever one
	// ends or the pool closes.
	inflight, waiters int
	changed           chan struct{}
	closed            bool
	stats             PoolStats

	// beforeCreate, when set (tests), runs before each background create.
	beforeCreate func(ctx context.Context)
}

type pooled struct {
	sess  *sandbox.Session
	s     *session
	since time.Time
	// prestarted is what PoolOptions.Prestart returned for this sandbox.
	prestarted prestarted.Interpreters
}

// PoolKey is the pool name for a template: a hash of everything that shapes a sandbox (image,
// limits, egress, runtime, lifetime, workdir, env), not of its id or labels.
func PoolKey(tmpl spec.Sandbox) (string, error) {
	t := tmpl
	t.ApplyDefaults()
	t.ID, t.Labels = "", nil
	b, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return "p" + hex.EncodeToString(h[:8]), nil
}

// NewPool starts a pool of sandboxes declared by tmpl on b and begins filling it in the
// background; it returns at once.
func NewPool(ctx context.Context, b *Backend, tmpl spec.Sandbox, opts PoolOptions) (*Pool, error) {
	return newPool(ctx, b, tmpl, opts, nil)
}

func newPool(ctx context.Context, b *Backend, tmpl spec.Sandbox, opts PoolOptions, beforeCreate func(context.Context)) (*Pool, error) {
	bad := func(field string, value any, msg string) error {
		return fmt.Errorf("%w: pool %s %v: %s", sandbox.ErrInvalid, field, value, msg)
	}
	if b == nil {
		return nil, fmt.Errorf("%w: pool: no backend", sandbox.ErrInvalid)
	}
	if opts.Max == 0 {
		opts.Max = opts.Size
		if opts.Memory > 0 {
			opts.Max = MaxPoolSize
		}
	}
	if opts.IdleExpiry == 0 {
		opts.IdleExpiry = DefaultPoolIdleExpiry
	}
	tmpl.ApplyDefaults()
	if tmpl.ID == "" {
		tmpl.ID = "pool"
	}
	life := time.Duration(tmpl.Session.Lifetime()) * time.Second
	switch {
	case opts.Size < 1:
		return nil, bad("size", opts.Size, "must be at least 1")
	case opts.Max < opts.Size || opts.Max > MaxPoolSize:
		return nil, bad("max", opts.Max, fmt.Sprintf("must be %d (size) to %d", opts.Size, MaxPoolSize))
	case opts.Memory < 0:
		return nil, bad("memory", opts.Memory, "must be 0 (no bound) or a number of bytes")
	case opts.IdleExpiry < time.Second:
		return nil, bad("idleExpiry", opts.IdleExpiry, "must be at least 1s")
	case opts.IdleExpiry >= life:
		return nil, bad("idleExpiry", opts.IdleExpiry, fmt.Sprintf("must be shorter than the template's lifetime (%v), or sandboxes would end in the pool", life))
	}
	if errs := tmpl.Validate(""); len(errs) > 0 {
		return nil, fmt.Errorf("%w: pool template: %v", sandbox.ErrInvalid, errors.Join(fieldErrors(errs)...))
	}
	for k := range tmpl.Labels {
		if k == LabelPool || k == labelPoolFiller {
			return nil, bad("template label", k, "is set by the pool itself")
		}
	}
	// The template must create: resolve it now (image unpacked, limits checked) rather than
	// fail in the background forever.
	if _, err := b.resolve(ctx, tmpl); err != nil {
		return nil, fmt.Errorf("pool template: %w", err)
	}
	key, err := PoolKey(tmpl)
	if err != nil {
		return nil, err
	}
	filler, err := sessions.SelfProc()
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = b.log
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Pool{
		b: b, tmpl: tmpl, key: key, filler: filler, opts: opts,
		log: opts.Logger.With("pool", key), ctx: pctx, cancel: cancel,
		wake: make(chan struct{}, 1), reapQ: make(chan string, reapQueue), target: opts.Size,
		changed:      make(chan struct{}),
		beforeCreate: beforeCreate,
	}
	p.wg.Add(2)
	go p.refiller()
	go p.reaper()
	return p, nil
}

func fieldErrors(fes []*spec.FieldError) []error {
	out := make([]error, len(fes))
	for i, fe := range fes {
		out[i] = fe
	}
	return out
}

// Key is the pool's name, the value of LabelPool on its sandboxes.
func (p *Pool) Key() string { return p.key }

// Template is the declaration the pool's sandboxes are created from (defaults applied; each
// sandbox gets its own id).
func (p *Pool) Template() spec.Sandbox { return p.tmpl }

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Size = len(p.ready)
	st.Target = p.target
	return st
}

// fits reports whether n sandboxes fit in PoolOptions.Memory, counted at the most one was
// measured to hold (none measured yet: one more than Size may be tried, to measure it). Called
// with mu held.
func (p *Pool) fits(n int) bool {
	if p.opts.Memory == 0 || n <= p.opts.Size {
		return true
	}
	if p.stats.SandboxMemory == 0 {
		return n <= p.opts.Size+1
	}
	return int64(n)*p.stats.SandboxMemory <= p.opts.Memory
}

// Claim hands out a ready sandbox no other claim gets, or, when none is ready, creates one (a
// miss, counted). The caller owns the sandbox: it is single-use, terminate it when done.
func (p *Pool) Claim(ctx context.Context) (*sandbox.Session, error) {
	sess, pre, err := p.claim(ctx, true)
	release(pre)
	return sess, err
}

// release closes what Prestart returned, when nobody will use it.
func release(pre prestarted.Interpreters) {
	if pre != nil {
		_ = pre.Close()
	}
}

// ClaimForRun is Claim for a caller whose use of the sandbox ends with this process, as a
// run_code call's does (one run, then Discard). It also returns what PoolOptions.Prestart left
// in the sandbox (nil when the pool has no Prestart, when it failed there, or when the claim
// created the sandbox cold), and it records no claim on disk: should this process die, the
// next process's reconcile reaps the sandbox as an unclaimed one, which is right, its user
// being gone too. (Writing that record is most of a claim's time on a busy disk: 0.1-1 ms.)
func (p *Pool) ClaimForRun(ctx context.Context) (*sandbox.Session, prestarted.Interpreters, error) {
	return p.claim(ctx, false)
}

func (p *Pool) claim(ctx context.Context, record bool) (*sandbox.Session, prestarted.Interpreters, error) {
	missed := false
	var waitEnd time.Time // set once this claim has waited for a create in flight
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, nil, fmt.Errorf("%w: pool %s is closed", sandbox.ErrConflict, p.key)
		}
		n := len(p.ready)
		if n == 0 {
			if !missed {
				missed = true
				p.stats.Misses++
				if p.target < p.opts.Max && p.fits(p.target+1) {
					p.target++
				}
			}
			p.deferUntil = time.Time{}
			// A create in flight has done part of the work a cold create would start from
			// scratch, and a second create beside it slows both on a busy machine: wait for it,
			// one claimer per create in flight, for at most maxMissWait.
			if waitEnd.IsZero() {
				waitEnd = time.Now().Add(maxMissWait)
			}
			if wait := time.Until(waitEnd); p.waiters < p.inflight && wait > 0 {
				p.waiters++
				changed := p.changed
				p.mu.Unlock()
				p.signal()
				err := waitChange(ctx, changed, wait)
				p.mu.Lock()
				p.waiters--
				p.mu.Unlock()
				if err != nil {
					return nil, nil, err
				}
				continue
			}
			p.mu.Unlock()
			p.signal()
			sess, err := p.b.Create(ctx, p.decl(false))
			return sess, nil, err
		}
		it := p.ready[n-1]
		p.ready[n-1] = pooled{}
		p.ready = p.ready[:n-1]
		if len(p.ready) == 0 {
			p.deferUntil = time.Time{}
		} else if d := time.Now().Add(refillDefer); d.After(p.deferUntil) {
			p.deferUntil = d // held while this claimer's call runs
		}
		p.mu.Unlock()
		p.signal()
		if it.s.exited() {
			p.count(func(st *PoolStats) { st.Dead++ })
			release(it.prestarted)
			p.Discard(it.sess.ID)
			continue
		}
		// etc.go: a sandbox whose /etc copy the host has since changed would show older
		// files than one created now.
		if err := p.b.etcCurrent(it.s); err != nil {
			p.log.Info("pool: discarding a ready sandbox", "session", it.sess.ID, "err", err)
			p.count(func(st *PoolStats) { st.Stale++ })
			release(it.prestarted)
			p.Discard(it.sess.ID)
			continue
		}
		// Recorded on disk: a claimed sandbox outlives a crash of this process like any other.
		if record {
			if err := os.WriteFile(filepath.Join(it.s.dir, claimedFile), nil, 0o600); err != nil {
				p.log.Warn("pool: recording a claim failed; discarding the sandbox", "session", it.sess.ID, "err", err)
				release(it.prestarted)
				p.Discard(it.sess.ID)
				continue
			}
		}
		p.count(func(st *PoolStats) {
			if missed {
				st.Waited++
			} else {
				st.Hits++
			}
		})
		return it.sess, it.prestarted, nil
	}
}

// waitChange waits until changed is closed or wait has passed (nil) or ctx ends (its error).
func waitChange(ctx context.Context, changed <-chan struct{}, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// changedLocked wakes the claims waiting for a create in flight. Called with mu held.
func (p *Pool) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Discard terminates a claimed sandbox in the background, off the caller's path; Close waits
// for every discarded sandbox to be gone. When the queue is full (or the pool closed) it
// terminates on the caller's path. Errors are logged and counted (ReapFailures).
func (p *Pool) Discard(sessionID string) {
	p.mu.Lock()
	// The claimer is done: refill once no call has followed for a moment, or now when the
	// pool is empty (see refillDefer).
	if len(p.ready) > 0 {
		p.deferUntil = time.Now().Add(sessions.ParkQuiet)
	} else {
		p.deferUntil = time.Time{}
	}
	p.mu.Unlock()
	p.signal()
	if !p.enqueueReap(sessionID) {
		p.terminate(sessionID)
	}
}

// enqueueReap hands id to the reaper; false when it cannot take it.
func (p *Pool) enqueueReap(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	select {
	case p.reapQ <- id:
		p.stats.Reaping++
		return true
	default:
		return false
	}
}

func (p *Pool) terminate(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.b.Terminate(ctx, id); err != nil {
		p.count(func(st *PoolStats) { st.ReapFailures++ })
		p.log.Error("pool: terminating a sandbox failed", "session", id, "err", err)
	}
}

func (p *Pool) count(f func(*PoolStats)) {
	p.mu.Lock()
	f(&p.stats)
	p.mu.Unlock()
}

func (p *Pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// decl is one sandbox of the template, with its own id; pooled ones carry the pool's labels.
func (p *Pool) decl(pooled bool) spec.Sandbox {
	if !pooled {
		return Instance(p.tmpl, nil)
	}
	return Instance(p.tmpl, map[string]string{LabelPool: p.key, labelPoolFiller: p.filler})
}

// Instance is one sandbox of the template tmpl: its id is tmpl's plus a random suffix, its
// labels tmpl's plus extra (a pool's, a parked sandbox's).
func Instance(tmpl spec.Sandbox, extra map[string]string) spec.Sandbox {
	d := tmpl
	prefix := d.ID
	if len(prefix) > 55 {
		prefix = prefix[:55]
	}
	d.ID = prefix + "-" + randomSuffix()
	d.Labels = make(map[string]string, len(tmpl.Labels)+len(extra))
	for k, v := range tmpl.Labels {
		d.Labels[k] = v
	}
	for k, v := range extra {
		d.Labels[k] = v
	}
	return d
}

func randomSuffix() string {
	id, _ := newSessionID() // s-<16 hex>; crypto/rand.Read does not fail
	return id[2:10]
}

// refiller keeps the pool at its target and expires ready sandboxes that waited too long.
func (p *Pool) refiller() {
	defer p.wg.Done()
	var delay time.Duration // after consecutive failed creates: the next wait
	var hold time.Time      // no create before then (after a failure)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := p.expire()
		soonest := func(d time.Duration) {
			if d > 0 && (next == 0 || d < next) {
				next = d
			}
		}
		if wait := time.Until(hold); wait > 0 {
			soonest(wait)
		} else {
			start, deferred := p.startCreate()
			if start {
				if p.createOne() {
					delay = 0
				} else {
					delay = min(max(2*delay, 100*time.Millisecond), maxRefillBackoff)
					hold = time.Now().Add(delay)
				}
				continue
			}
			soonest(deferred)
		}
		if next == 0 {
			next = time.Hour
		}
		timer.Reset(next)
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// startCreate reserves a create when the pool is below its target; deferred is how long a
// due refill is held back (see refillDefer).
func (p *Pool) startCreate() (start bool, deferred time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.ready)+p.stats.Creating >= p.target {
		return false, 0
	}
	if !p.deferUntil.IsZero() {
		if d := time.Until(p.deferUntil); d > 0 && len(p.ready) > 0 {
			return false, d
		}
		p.deferUntil = time.Time{}
	}
	p.stats.Creating++
	return true, 0
}

// createOne creates one pooled sandbox; false when the create failed.
func (p *Pool) createOne() bool {
	if p.beforeCreate != nil {
		p.beforeCreate(p.ctx)
	}
	p.mu.Lock()
	p.inflight++
	p.mu.Unlock()
	// A refill starts idle, its warm-up and prestart included, and is put back to this
	// process's scheduling before it is offered (idle.go).
	ctx := p.ctx
	normal, nice := sched.Normal()
	idle := p.b.canIdle() && normal
	if idle {
		ctx = withIdle(ctx)
	}
	sess, err := p.b.Create(ctx, p.decl(true))
	var s *session
	if err == nil {
		p.b.mu.Lock()
		s = p.b.sessions[sess.ID]
		p.b.mu.Unlock()
		if s == nil {
			err = fmt.Errorf("session %s is not registered", sess.ID)
		}
	}
	var pre prestarted.Interpreters
	var mem int64
	if err == nil {
		pre = p.warmUp(sess)
		mem = p.memoryOf(s)
		if idle {
			if err = sched.Restore(s.cg.procs, nice); err != nil {
				err = fmt.Errorf("putting pooled sandbox %s back to normal scheduling: %w", sess.ID, err)
				release(pre)
			}
		}
	}
	p.mu.Lock()
	p.stats.Creating--
	p.inflight--
	p.changedLocked()
	if err != nil {
		closed := p.closed
		if !closed {
			p.stats.Failures++
		}
		p.mu.Unlock()
		if !closed {
			p.log.Warn("pool: creating a sandbox failed", "err", err)
		}
		if sess != nil {
			p.terminate(sess.ID)
		}
		return false
	}
	if p.closed {
		p.mu.Unlock()
		release(pre)
		p.terminate(sess.ID)
		return true
	}
	p.ready = append(p.ready, pooled{sess: sess, s: s, since: time.Now(), prestarted: pre})
	p.stats.Refills++
	p.stats.SandboxMemory = max(p.stats.SandboxMemory, mem)
	for p.target > p.opts.Size && !p.fits(p.target) {
		p.target-- // measured bigger than counted: back within the pool memory
	}
	p.mu.Unlock()
	return true
}

// warmUp runs one command in a new sandbox before it is offered: an agent's first exec costs
// several times a later one (its first child cgroup, first fork, pages touched the first time),
// and that belongs off the claimer's path. It runs "true" (found on PATH, or failing to be: the
// spawn path is exercised either way) and leaves nothing behind; its result does not matter.
// Then PoolOptions.Prestart, whose result it returns.
func (p *Pool) warmUp(sess *sandbox.Session) prestarted.Interpreters {
	id := sess.ID
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	a, err := p.b.Connect(ctx, id)
	if err != nil {
		return nil
	}
	if _, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 5 * time.Second}, io.Discard, io.Discard); err != nil {
		p.log.Debug("pool: warm-up exec failed", "session", id, "err", err)
	}
	if p.opts.Prestart == nil {
		a.Close()
		return nil
	}
	pctx, pcancel := context.WithTimeout(p.ctx, prestartTimeout)
	defer pcancel()
	pre, err := p.opts.Prestart(pctx, sess, a)
	if err != nil {
		a.Close()
		if p.ctx.Err() == nil {
			p.log.Warn("pool: prestart failed; offering the sandbox without it", "session", id, "err", err)
		}
		return nil
	}
	return pre // a is Prestart's now
}

// memoryOf is the host memory s holds now as its memory cgroup counts it (every process of
// it, the waiting interpreters included), 0 when it cannot be read (logged).
func (p *Pool) memoryOf(s *session) int64 {
	if p.opts.Memory == 0 {
		return 0
	}
	st, err := sbstats.Read(s.rec.CgroupVersion, s.rec.Cgroup)
	if err != nil {
		p.log.Warn("pool: reading a ready sandbox's memory failed; the pool memory counts the most measured so far", "err", err)
		return 0
	}
	return st.MemoryBytes
}

// expire hands ready sandboxes older than IdleExpiry to the reaper and returns how long until
// the next one expires (0: none is ready).
func (p *Pool) expire() time.Duration {
	now := time.Now()
	var old []string
	var next time.Duration
	p.mu.Lock()
	keep := p.ready[:0:0]
	for _, it := range p.ready {
		left := p.opts.IdleExpiry - now.Sub(it.since)
		if left <= 0 || it.s.exited() {
			old = append(old, it.sess.ID)
			release(it.prestarted)
			if it.s.exited() {
				p.stats.Dead++
			} else {
				p.stats.Expired++
			}
			if p.target > p.opts.Size {
				p.target--
			}
			continue
		}
		keep = append(keep, it)
		if next == 0 || left < next {
			next = left
		}
	}
	if len(old) > 0 {
		p.ready = keep
	}
	p.mu.Unlock()
	for _, id := range old {
		if !p.enqueueReap(id) {
			p.terminate(id)
		}
	}
	return next
}

// reaper terminates discarded and expired sandboxes until Close has closed the queue.
func (p *Pool) reaper() {
	defer p.wg.Done()
	for id := range p.reapQ {
		p.terminate(id)
		p.count(func(st *PoolStats) { st.Reaping-- })
	}
}

// Close stops refilling, waits for every discarded sandbox to be terminated, and terminates
// every sandbox still unclaimed. Claimed sandboxes are their callers'. Close is idempotent.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.changedLocked()
	ready := p.ready
	p.ready = nil
	close(p.reapQ) // no sender left: every send holds mu and checks closed
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()

	errs := make([]error, len(ready))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i, it := range ready {
		release(it.prestarted)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := p.b.Terminate(ctx, it.sess.ID); err != nil {
				errs[i] = fmt.Errorf("pool %s: terminate %s: %w", p.key, it.sess.ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// reapablePooled reports whether a sandbox found at reconcile is a pooled one nobody claimed
// and whose pool's process is gone: nothing can ever claim it, so it goes.
func (b *Backend) reapablePooled(dir string, rec *record) bool {
	key := rec.Spec.Labels[LabelPool]
	if key == "" {
		return false
	}
	if _, err := os.Stat(filepath.Join(dir, claimedFile)); err == nil {
		return false
	}
	if procAlive(rec.Spec.Labels[labelPoolFiller]) {
		return false
	}
	b.log.Info("reaping an unclaimed pool sandbox whose pool's process is gone", "session", rec.ID, "pool", key, "owner", rec.Spec.Labels[labelPoolFiller])
	return true
}

// procAlive is sessions.ProcAlive: a pool's filler and a parked sandbox's filler and claimer alike.
var procAlive = sessions.ProcAlive
