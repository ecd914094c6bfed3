package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestWarmSandboxHeldElsewhere: a pool's ready sandbox or a parked sandbox, made by another (live)
// process and not claimed yet, is found by no lookup of this one (Get, Connect, List; a
// second backend that adopted it at New alike) — else a daemon's caller could exec in it
// before the claimer gets it "fresh". Once claimed it is a session like any other; a warm
// sandbox of this very process stays its own; Terminate still ends it.
func TestWarmSandboxHeldElsewhere(t *testing.T) {
	start, err := startTime(1)
	if err != nil {
		t.Fatal(err)
	}
	other := fmt.Sprintf("1-%d", start) // a process that stays alive: not reaped as orphaned
	self, err := sessions.SelfProc()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		claim  string // the file a claim leaves in the session dir
		hidden bool
	}{
		{"pool of another process", map[string]string{LabelPool: "k", labelPoolFiller: other}, claimedFile, true},
		{"parked sandbox of another process", map[string]string{LabelParked: "k", labelParkedFiller: other}, sessions.ClaimPrefix + other, true},
		{"pool of this process", map[string]string{LabelPool: "k", labelPoolFiller: self}, claimedFile, false},
		{"parked sandbox this process makes", map[string]string{LabelParked: "k", labelParkedFiller: self}, sessions.ClaimPrefix + self, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t)
			ctx := context.Background()
			d := hostDecl("warm")
			d.Labels = tc.labels
			sess, err := b.Create(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			b2 := newTestBackendAt(t, b.opts.StateDir)
			check := func(when string, hidden bool) {
				t.Helper()
				for name, be := range map[string]*Backend{"maker's backend": b, "second backend": b2} {
					_, gerr := be.Get(ctx, sess.ID)
					a, cerr := be.Connect(ctx, sess.ID)
					if cerr == nil {
						a.Close()
					}
					list, lerr := be.List(ctx)
					if lerr != nil {
						t.Fatal(lerr)
					}
					listed := false
					for _, s := range list {
						listed = listed || s.ID == sess.ID
					}
					if hidden {
						if !errors.Is(gerr, sandbox.ErrNotFound) || !errors.Is(cerr, sandbox.ErrNotFound) || listed {
							t.Errorf("%s, %s: get %v, connect %v, listed %v: want it hidden", when, name, gerr, cerr, listed)
						}
					} else if gerr != nil || cerr != nil || !listed {
						t.Errorf("%s, %s: get %v, connect %v, listed %v: want it found", when, name, gerr, cerr, listed)
					}
				}
			}
			check("before the claim", tc.hidden)
			if err := os.WriteFile(filepath.Join(b.opts.StateDir, sess.ID, tc.claim), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			check("claimed", false)
			if err := b2.Terminate(ctx, sess.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
