package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Spares for airlock run (docs/spares.md): a run claims a sandbox parked in the state dir by
// an earlier run's filler, and starts a filler that parks the next one.

const (
	// envSpares overrides --spares' default (0 turns spares off).
	envSpares = "AIRLOCK_SPARES"
	// spareMaxAge retires a parked spare this old; it lives at most this plus the longest run.
	spareMaxAge = 5 * time.Minute
	// spareOutputCap is the output cap a spare's interpreter starts with: --max-output's
	// default, so a run with that or a smaller cap can use it.
	spareOutputCap = 16 << 20
	// fillLog is the filler's log in the state dir's spares directory (it has no terminal).
	fillLog     = "fill.log"
	fillLogSize = 1 << 20
	// fillTimeout bounds a filler's whole life.
	fillTimeout = 2 * time.Minute
)

func init() {
	commands = append(commands, cli.Command{Names: []string{"__spares-fill"}, New: newSparesFillCmd})
}

// defaultSpares is --spares' default: $AIRLOCK_SPARES, else 1.
func defaultSpares() int {
	if v, ok := os.LookupEnv(envSpares); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return -1 // refused by the flag check, naming the variable
	}
	return 1
}

// spareTemplate is the sandbox a spare for runs with image img is: what runcode.Run would
// declare for them, living long enough for the longest run after spareMaxAge parked.
func spareTemplate(img spec.Image) spec.Sandbox {
	t := runcode.PoolTemplate(runcode.Options{Image: img}, spareMaxAge)
	t.ID = "spare"
	return t
}

// spareRun is the runcode.RunPool of one airlock run: a claim takes a parked spare (nil when
// none is parked: the run creates its own); Discard kills it; wait starts the filler, which
// removes what is left of it and parks the next once the kill is confirmed, and confirms every
// process of the spare is gone.
type spareRun struct {
	b       *local.Backend
	tmpl    spec.Sandbox
	key     string
	minLeft time.Duration
	log     *slog.Logger

	// fill starts the filler, which first terminates the sandboxes named (killed by Discard),
	// and returns its gate (startFiller); nil: Discard terminates them itself.
	fill func(terminate []string) (gate io.Closer, err error)

	wg        sync.WaitGroup
	mu        sync.Mutex
	claimed   bool     // a claim was made: the next run wants a spare, hit or miss
	discarded []string // being killed or killed: their remains are the filler's
	errs      []error
}

func newSpareRun(b *local.Backend, img spec.Image, timeout time.Duration, log *slog.Logger) (*spareRun, error) {
	tmpl := spareTemplate(img)
	key, err := local.SpareKey(tmpl)
	if err != nil {
		return nil, err
	}
	return &spareRun{b: b, tmpl: tmpl, key: key, minLeft: timeout + runcode.ClaimMargin, log: log}, nil
}

func (p *spareRun) Template() spec.Sandbox { return p.tmpl }

// Claim is runcode.Pool's: a parked spare, else one created from the template (runcode itself
// uses ClaimForRun, which leaves the create to the run).
func (p *spareRun) Claim(ctx context.Context) (*sandbox.Session, error) {
	sess, pre, err := p.ClaimForRun(ctx)
	if c, ok := pre.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	if err != nil || sess != nil {
		return sess, err
	}
	return p.b.Create(ctx, local.Instance(p.tmpl, nil))
}

func (p *spareRun) ClaimForRun(ctx context.Context) (*sandbox.Session, any, error) {
	sess, state, err := p.b.ClaimSpare(ctx, p.key, p.minLeft)
	p.mu.Lock()
	p.claimed = true
	p.mu.Unlock()
	if err != nil {
		// The spares are a speed-up: a run never fails for want of one.
		p.log.Warn("spares: claiming a spare failed; creating the sandbox", "err", err)
		return nil, nil, nil
	}
	if sess == nil {
		return nil, nil, nil
	}
	if len(state) == 0 {
		return sess, nil, nil
	}
	a, err := p.b.Connect(ctx, sess.ID)
	if err != nil {
		return sess, nil, nil // the run connects itself, and reports what fails
	}
	pre, err := runcode.ResumePrestarted(a, state)
	if err != nil {
		a.Close()
		p.log.Warn("spares: the spare's pre-started interpreters are unusable; running cold in it", "session", sess.ID, "err", err)
		return sess, nil, nil
	}
	return sess, pre, nil
}

// Discard kills the sandbox, every process of it: the run waits for that (nothing of the code
// outlives airlock run), while removing its cgroups and state dir (a few ms: rmdir in every
// hierarchy, the state files) is left to the filler wait starts, off the run's path.
func (p *spareRun) Discard(id string) {
	p.mu.Lock()
	if p.fill != nil {
		p.discarded = append(p.discarded, id)
	}
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if p.fill != nil {
			err = p.b.Kill(ctx, id)
		} else {
			err = p.b.Terminate(ctx, id)
		}
		if err != nil {
			p.mu.Lock()
			p.errs = append(p.errs, fmt.Errorf("terminating sandbox %s: %w", id, err))
			p.mu.Unlock()
		}
	}()
}

// wait starts the filler after a claim (after it: one started before would count this run's
// spare as parked and leave) and returns once every discarded sandbox's processes are
// confirmed gone, with what failed. The filler is started while the kills are still under way,
// its process start overlapping them, and held at its gate until they are over: it never sees
// the run's sandbox alive. A discarded sandbox the filler cannot be started for is terminated
// here.
func (p *spareRun) wait() error {
	p.mu.Lock()
	claimed, discarded := p.claimed, p.discarded
	p.claimed, p.discarded = false, nil
	p.mu.Unlock()
	var (
		gate    io.Closer
		fillErr error
	)
	if claimed && p.fill != nil {
		if gate, fillErr = p.fill(discarded); fillErr != nil {
			p.log.Warn("spares: starting the filler failed", "err", fillErr)
		}
	}
	p.wg.Wait()
	if gate != nil {
		_ = gate.Close()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if fillErr != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, id := range discarded {
			if err := p.b.Terminate(ctx, id); err != nil {
				p.errs = append(p.errs, fmt.Errorf("terminating sandbox %s: %w", id, err))
			}
		}
	}
	return errors.Join(p.errs...)
}

// startFiller starts a detached airlock spares-fill for img's spares: its own session, no
// terminal, standard streams on /dev/null (a caller reading this process's output to its end
// must not wait for it). It outlives this process. With gated, it does nothing until the
// returned gate is closed (or this process exits, which closes it): the write end of a pipe
// whose read end is the filler's fd 3.
func startFiller(b *cli.BackendFlags, img spec.Image, count int, terminate []string, gated bool) (gate io.Closer, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	imgJSON, err := json.Marshal(img)
	if err != nil {
		return nil, err
	}
	args := []string{"__spares-fill", "--state-dir", b.StateDir, "--image-json", string(imgJSON), "--count", strconv.Itoa(count)}
	if b.CgroupParent != "" {
		args = append(args, "--cgroup-parent", b.CgroupParent)
	}
	for _, id := range terminate {
		args = append(args, "--terminate", id)
	}
	// A gated filler's own start (~6 ms of CPU: the runtime, package inits) comes while the
	// run's kill has the kernel free the sandbox's memory on both cores: at the lowest
	// priority it takes only what the kill leaves idle. Every thread of its process group (its
	// own: Setsid) is lowered just after its start, and raised back by itself once its gate
	// opens, before it makes anything: its sandboxes (init, agent, the code) inherit it. Only
	// for a run as root at nice 0 (one that could raise it again, to where it was).
	lower := gated && os.Geteuid() == 0 && ownNice() == 0
	if lower {
		args = append(args, "--raise-after-gate")
	}
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var w *os.File
	if gated {
		r, pw, err := os.Pipe() // close-on-exec: no other child inherits the write end
		if err != nil {
			return nil, err
		}
		defer r.Close()
		w = pw
		cmd.ExtraFiles = []*os.File{r}
		cmd.Args = append(cmd.Args, "--gate-fd", "3")
	}
	if err := cmd.Start(); err != nil {
		if w != nil {
			w.Close()
		}
		return nil, err
	}
	if lower {
		_ = syscall.Setpriority(syscall.PRIO_PGRP, cmd.Process.Pid, gatedNice)
	}
	if w == nil {
		return nil, cmd.Process.Release()
	}
	return w, cmd.Process.Release()
}

type sparesFillFlags struct {
	imageJSON string
	count     int
	terminate []string
	gateFD    int
	raise     bool
	backend   cli.BackendFlags
}

func newSparesFillCmd(g *cli.Globals) *cobra.Command {
	f := &sparesFillFlags{}
	cmd := &cobra.Command{
		Use:    "__spares-fill --image-json JSON [--count N] [--terminate SESSION]...",
		Short:  "Park spare sandboxes for airlock run (started by airlock run itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(cmd *cobra.Command, _ []string) error { return runSparesFill(cmd, f) },
	}
	cmd.Flags().StringVar(&f.imageJSON, "image-json", "", "the runs' image, as JSON")
	cmd.Flags().IntVar(&f.count, "count", 1, "spares to keep parked")
	cmd.Flags().StringArrayVar(&f.terminate, "terminate", nil, "a used spare airlock run killed, to terminate first; repeatable")
	cmd.Flags().BoolVar(&f.raise, "raise-after-gate", false, "the starting run lowered this filler's priority: raise it to nice 0 once the gate opens")
	cmd.Flags().IntVar(&f.gateFD, "gate-fd", -1, "a pipe whose write end the starting run holds: wait for its end (the run's sandbox killed) before anything else")
	f.backend.Add(cmd)
	return cmd
}

func runSparesFill(cmd *cobra.Command, f *sparesFillFlags) error {
	var img spec.Image
	if err := json.Unmarshal([]byte(f.imageJSON), &img); err != nil || img == (spec.Image{}) {
		return cli.UsageError("--image-json %q: give the image as JSON (%v)", f.imageJSON, err)
	}
	if f.count < 1 || f.count > local.MaxSpares {
		return cli.UsageError("--count %d must be 1 to %d", f.count, local.MaxSpares)
	}
	logw, err := openFillLog(f.backend.StateDir)
	if err != nil {
		return err
	}
	defer logw.Close()
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})).With("pid", os.Getpid())
	// Bounded: a filler stuck in a create would hold the key's lock, and every later run's
	// filler would leave at once.
	ctx, cancel := context.WithTimeout(cmd.Context(), fillTimeout)
	defer cancel()
	if f.gateFD >= 0 {
		if err := awaitGate(ctx, f.gateFD); err != nil {
			log.Error("spares: waiting for the run failed", "err", err)
			return err
		}
		if f.raise {
			if err := syscall.Setpriority(syscall.PRIO_PGRP, 0, 0); err != nil {
				log.Error("spares: raising the filler's priority back failed", "err", err)
				return err
			}
		}
	}
	b, err := local.New(ctx, local.Options{StateDir: f.backend.StateDir, CgroupParent: f.backend.CgroupParent, Logger: log})
	if err != nil {
		log.Error("spares: starting the local runtime failed", "err", err)
		return err
	}
	defer b.Close()
	// First the remains of the run that started this filler (its New may have reaped them
	// already: then they are absent, which Terminate accepts).
	for _, id := range f.terminate {
		if err := b.Terminate(ctx, id); err != nil {
			log.Error("spares: terminating a used spare failed", "session", id, "err", err)
		}
	}
	pf, err := runcode.Prestart(runcode.PrestartOptions{Languages: []runcode.Language{runcode.Python}, MaxOutputBytes: spareOutputCap, Logger: log})
	if err != nil {
		return err
	}
	opts := local.SpareOptions{Count: f.count, MaxAge: spareMaxAge,
		Prestart: func(ctx context.Context, sess *sandbox.Session, a sandbox.Agent) ([]byte, error) {
			pre, err := pf(ctx, sess, a)
			if err != nil {
				return nil, err
			}
			return runcode.PrestartedState(pre) // the client is closed by the caller
		}}
	if err := b.FillSpares(ctx, spareTemplate(img), opts); err != nil {
		log.Error("spares: filling failed", "err", err)
		return err
	}
	return nil
}

// gatedNice is the nice value of a gated filler until its gate opens (startFiller).
const gatedNice = 19

// ownNice is this thread's nice value (-20..19; the system call answers 20 - nice).
func ownNice() int {
	p, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return -1
	}
	return 20 - p
}

// awaitGate returns once the pipe on fd reads EOF: the run that started this filler closed
// its write end, or exited.
func awaitGate(ctx context.Context, fd int) error {
	f := os.NewFile(uintptr(fd), "gate")
	if f == nil {
		return fmt.Errorf("--gate-fd %d: not an open file", fd)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, f)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("the run that started this filler did not open its gate: %w", context.Cause(ctx))
	}
}

// openFillLog opens the filler's log for appending, starting it over past fillLogSize.
func openFillLog(stateDir string) (*os.File, error) {
	dir := local.SparesDir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, fillLog)
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if fi, err := os.Stat(p); err == nil && fi.Size() > fillLogSize {
		flags |= os.O_TRUNC
	}
	return os.OpenFile(p, flags, 0o600)
}
