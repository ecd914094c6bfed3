package runcode

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
	"github.com/airlock-sandbox/airlock/spec"
)

// fakePool hands out scripted sessions and records discards.
type fakePool struct {
	tmpl      spec.Sandbox
	expiresIn time.Duration

	mu        sync.Mutex
	claims    int
	discarded []string
}

func (p *fakePool) Template() spec.Sandbox { return p.tmpl }
func (p *fakePool) Claim(context.Context) (*sandbox.Session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.claims++
	return &sandbox.Session{ID: "s-pooled", SandboxID: "run-pooled", ExpiresAt: time.Now().Add(p.expiresIn)}, nil
}
func (p *fakePool) Discard(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discarded = append(p.discarded, id)
}

func okExec(_ context.Context, _ sandbox.ExecRequest, stdout, _ io.Writer) (sandbox.ExecResult, error) {
	io.WriteString(stdout, "4\n")
	return sandbox.ExecResult{}, nil
}

func TestRunWithPool(t *testing.T) {
	tests := []struct {
		name      string
		req       Request
		expiresIn time.Duration
		pooled    bool
	}{
		{"fits", Request{Language: "python", Code: "print(2+2)"}, time.Hour, true},
		{"other language, same sandbox", Request{Language: "bash", Code: "echo 4", TimeoutSeconds: 300}, time.Hour, true},
		{"network does not fit", Request{Language: "python", Code: "print(2+2)", Network: true}, time.Hour, false},
		{"too little lifetime left", Request{Language: "python", Code: "print(2+2)", TimeoutSeconds: 60}, 30 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeBackend{set: supportedSet(), exec: okExec}
			p := &fakePool{tmpl: PoolTemplate(Options{}, time.Minute), expiresIn: tt.expiresIn}
			res, err := Run(t.Context(), f, tt.req, Options{Pool: p})
			if err != nil {
				t.Fatal(err)
			}
			if res.Stdout != "4\n" {
				t.Errorf("stdout %q", res.Stdout)
			}
			if tt.pooled {
				if p.claims != 1 || len(f.created) != 0 || len(f.terminated) != 0 {
					t.Errorf("claims %d, created %d, terminated %v: want one claim and nothing created", p.claims, len(f.created), f.terminated)
				}
				if len(p.discarded) != 1 || p.discarded[0] != "s-pooled" {
					t.Errorf("discarded %v, want the claimed sandbox", p.discarded)
				}
				if res.SandboxID != "run-pooled" {
					t.Errorf("result names sandbox %q, want the claimed one", res.SandboxID)
				}
				return
			}
			if len(f.created) != 1 || len(f.terminated) != 1 {
				t.Errorf("created %d, terminated %v: want a cold sandbox, terminated", len(f.created), f.terminated)
			}
			if p.claims != len(p.discarded) {
				t.Errorf("claimed %d but discarded %v", p.claims, p.discarded)
			}
		})
	}
}

func TestFits(t *testing.T) {
	tmpl := PoolTemplate(Options{}, time.Minute)
	req := Request{Language: "python", Code: "x", TimeoutSeconds: 30}
	base := Declaration(req, Options{})
	withMem := base
	withMem.Limits.Memory = "1Gi"
	withImg := Declaration(req, Options{Image: spec.Image{Dir: "/srv/root"}})
	withNet := Declaration(Request{Language: "python", Code: "x", Network: true}, Options{})
	withEnv := base
	withEnv.Env = map[string]string{"A": "b"}
	tests := []struct {
		name string
		decl spec.Sandbox
		want bool
	}{
		{"a run's declaration", base, true},
		{"memory", withMem, false},
		{"image", withImg, false},
		{"egress", withNet, false},
		{"env", withEnv, false},
	}
	for _, tt := range tests {
		if got := Fits(tt.decl, tmpl); got != tt.want {
			t.Errorf("%s: Fits = %v, want %v", tt.name, got, tt.want)
		}
	}
	life := tmpl.Session.Lifetime()
	if want := int64(MaxTimeoutSeconds + lifetimeMargin + 60); life != want {
		t.Errorf("template lifetime %d, want %d (longest timeout, margin, idle expiry)", life, want)
	}
}

// fakeRunPool is a fakePool whose ClaimForRun hands out pre with the sandbox.
type fakeRunPool struct {
	fakePool
	pre prestarted.Interpreters
}

func (p *fakeRunPool) ClaimForRun(ctx context.Context) (*sandbox.Session, prestarted.Interpreters, error) {
	s, err := p.Claim(ctx)
	return s, p.pre, err
}

// foreignInterpreters is what some other prestart left: not runcode's to run or end.
type foreignInterpreters struct{ closed bool }

func (f *foreignInterpreters) State() ([]byte, error) { return nil, nil }
func (f *foreignInterpreters) Close() error           { f.closed = true; return nil }

// TestRunPoolInterpreters: what a RunPool hands out with a sandbox is closed whenever the run
// does not use it, and a sandbox holding interpreters runcode cannot end is not run in (the
// code would not be alone there): the run creates its own.
func TestRunPoolInterpreters(t *testing.T) {
	tests := []struct {
		name      string
		expiresIn time.Duration
		wantCold  bool
	}{
		{"foreign interpreters", time.Hour, true},
		{"too little lifetime left", 30 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeBackend{set: supportedSet(), exec: okExec}
			pre := &foreignInterpreters{}
			p := &fakeRunPool{fakePool: fakePool{tmpl: PoolTemplate(Options{}, time.Minute), expiresIn: tt.expiresIn}, pre: pre}
			res, err := Run(t.Context(), f, Request{Language: "python", Code: "print(2+2)", TimeoutSeconds: 60}, Options{Pool: p})
			if err != nil {
				t.Fatal(err)
			}
			if res.Stdout != "4\n" {
				t.Errorf("stdout %q", res.Stdout)
			}
			if !pre.closed {
				t.Error("the claimed sandbox's interpreters were not closed")
			}
			if tt.wantCold && (len(f.created) != 1 || len(p.discarded) != 1 || p.discarded[0] != "s-pooled") {
				t.Errorf("created %d, discarded %v: want the claimed sandbox discarded and a cold one", len(f.created), p.discarded)
			}
		})
	}
}
