package aws_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/sandbox"
)

func repeat(n int, f fake.Fault) []fake.Fault { return slices.Repeat([]fake.Fault{f}, n) }

// TestTerminateNeverReportsUnconfirmed: under each fault of the API, Terminate returns an
// error (outcome unknown) while the MicroVM is not TERMINATED, and a later Terminate, the
// faults gone, confirms it.
func TestTerminateNeverReportsUnconfirmed(t *testing.T) {
	w := newWorld(t)
	b := w.backend(t)
	// More faults than the client's attempts (5), so none is retried away.
	cases := []struct {
		name   string
		op     string
		faults []fake.Fault
		// slow: the MicroVM stays TERMINATING for many reads (a slow delete).
		slow bool
	}{
		{name: "terminate answers 500", op: "TerminateMicrovm", faults: repeat(6, fake.Fault{Status: 500, Type: awsb.TypeInternal, Message: "internal"})},
		{name: "terminate throttled", op: "TerminateMicrovm", faults: repeat(6, fake.Fault{Status: 429, Type: awsb.TypeThrottling, Message: "Rate exceeded"})},
		{name: "terminate over quota", op: "TerminateMicrovm", faults: repeat(1, fake.Fault{Status: 402, Type: awsb.TypeQuotaExceeded, Message: "quota"})},
		{name: "confirming read answers 500", op: "GetMicrovm", faults: repeat(6, fake.Fault{Status: 500, Type: awsb.TypeInternal, Message: "internal"})},
		{name: "confirming read throttled, body naming not-found", op: "GetMicrovm",
			faults: repeat(6, fake.Fault{Status: 429, Type: awsb.TypeThrottling, Body: `{"message":"ResourceNotFoundException: MicroVM not found (404)"}`})},
		{name: "confirming read 404 without the not-found type (wrong region)", op: "GetMicrovm",
			faults: repeat(6, fake.Fault{Status: 404, Body: `{"message":"ResourceNotFoundException"}`})},
		{name: "confirming read 503 with an empty body", op: "GetMicrovm", faults: repeat(6, fake.Fault{Status: 503})},
		{name: "slow delete", slow: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.slow {
				w.fake.Tune(func(s *fake.Server) { s.TerminatingGets = 1 << 20 })
			}
			sess, err := b.Create(t.Context(), testDecl("fault"))
			if tc.slow {
				w.fake.Tune(func(s *fake.Server) { s.TerminatingGets = 2 })
			}
			if err != nil {
				t.Fatal(err)
			}
			w.fake.Inject(tc.op, tc.faults...)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			err = b.Terminate(ctx, sess.ID)
			cancel()
			if state := w.fake.State(sess.ID); err == nil && state != awsb.StateTerminated {
				t.Fatalf("Terminate = nil while the MicroVM is %s", state)
			}
			if err == nil {
				t.Fatalf("Terminate = nil under the fault (the MicroVM happened to end first?)")
			}
			if !errors.Is(err, sandbox.ErrOutcomeUnknown) || errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("Terminate = %v, want outcome unknown and not not-found", err)
			}
			w.fake.ClearFaults() // the client gave up before using them all
			if tc.slow {
				return // its TERMINATING reads are the service's own, see TestSlowDeleteConfirmed
			}
			if err := b.Terminate(t.Context(), sess.ID); err != nil {
				t.Fatalf("Terminate once the faults are gone: %v", err)
			}
			if got := w.fake.State(sess.ID); got != awsb.StateTerminated {
				t.Errorf("after a confirmed Terminate the MicroVM is %s", got)
			}
		})
	}
}

// TestSlowDeleteConfirmed: a MicroVM that stays TERMINATING for a while is reported gone only
// once the service says TERMINATED.
func TestSlowDeleteConfirmed(t *testing.T) {
	w := newWorld(t)
	b := w.backend(t)
	w.fake.Tune(func(s *fake.Server) { s.TerminatingGets = 8 })
	sess, err := b.Create(t.Context(), testDecl("slow"))
	if err != nil {
		t.Fatal(err)
	}
	before := w.fake.Calls("GetMicrovm")
	if err := b.Terminate(t.Context(), sess.ID); err != nil {
		t.Fatal(err)
	}
	if got := w.fake.State(sess.ID); got != awsb.StateTerminated {
		t.Fatalf("Terminate = nil while the MicroVM is %s", got)
	}
	if n := w.fake.Calls("GetMicrovm") - before; n < 9 {
		t.Errorf("Terminate confirmed after %d reads, the service answered TERMINATING to the first 8", n)
	}
}

// TestCreateTimeoutLeavesNothing: a MicroVM whose endpoint never lets the agent through is
// terminated (confirmed) before Create returns its error.
func TestCreateTimeoutLeavesNothing(t *testing.T) {
	w := newWorld(t)
	b := w.backend(t, func(c *awsb.Config) { c.ReadyTimeout = 3 * time.Second })
	w.fake.Tune(func(s *fake.Server) { s.RestoreFailures = 1 << 30 })
	_, err := b.Create(t.Context(), testDecl("never"))
	if !errors.Is(err, sandbox.ErrDeadlineExceeded) {
		t.Fatalf("Create = %v, want deadline exceeded", err)
	}
	if run := w.fake.Running(); len(run) != 0 {
		t.Errorf("after a timed-out Create the fake still runs %v", run)
	}
	if w.fake.MicroVMs() != 1 {
		t.Errorf("%d MicroVMs made, want 1", w.fake.MicroVMs())
	}
}

// TestRunRetriedWithItsClientToken: a RunMicrovm whose answer is lost is retried with the same
// client token, and the service answers the MicroVM it made: one MicroVM, not two.
func TestRunRetriedWithItsClientToken(t *testing.T) {
	w := newWorld(t)
	b := w.backend(t)
	w.fake.Inject("RunMicrovm", fake.Fault{Status: 500, Type: awsb.TypeInternal, Message: "lost", AfterWork: true})
	sess, err := b.Create(t.Context(), testDecl("once"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Terminate(context.Background(), sess.ID)
	if n := w.fake.Calls("RunMicrovm"); n != 2 {
		t.Errorf("RunMicrovm called %d times, want 2 (one lost answer, one retry)", n)
	}
	if n := w.fake.MicroVMs(); n != 1 {
		t.Errorf("%d MicroVMs made, want 1", n)
	}
}

// TestThrottleRetryAfter: a throttled call is retried after the Retry-After the service gave.
func TestThrottleRetryAfter(t *testing.T) {
	w := newWorld(t)
	b := w.backend(t)
	sess, err := b.Create(t.Context(), testDecl("throttle"))
	if err != nil {
		t.Fatal(err)
	}
	w.fake.Inject("TerminateMicrovm", fake.Fault{Status: 429, Type: awsb.TypeThrottling, Message: "Rate exceeded", RetryAfter: 1})
	start := time.Now()
	if err := b.Terminate(t.Context(), sess.ID); err != nil {
		t.Fatal(err)
	}
	if n := w.fake.Calls("TerminateMicrovm"); n != 2 {
		t.Errorf("TerminateMicrovm called %d times, want 2", n)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("retried after %v, before the Retry-After of 1 s", d)
	}
}

// TestQuotaRefused: ServiceQuotaExceededException (402) is a refusal, not retried, and makes
// nothing.
func TestQuotaRefused(t *testing.T) {
	w := newWorld(t)
	b := w.backend(t)
	w.fake.Inject("RunMicrovm", fake.Fault{Status: 402, Type: awsb.TypeQuotaExceeded, Message: "You have reached the MicroVM quota"})
	_, err := b.Create(t.Context(), testDecl("quota"))
	var ae *awsb.APIError
	if !errors.Is(err, sandbox.ErrRefused) || !errors.As(err, &ae) || ae.Type != awsb.TypeQuotaExceeded {
		t.Fatalf("Create = %v, want a refusal of type %s", err, awsb.TypeQuotaExceeded)
	}
	if n := w.fake.Calls("RunMicrovm"); n != 1 {
		t.Errorf("RunMicrovm called %d times, want 1", n)
	}
	if n := w.fake.MicroVMs(); n != 0 {
		t.Errorf("%d MicroVMs made", n)
	}
}
