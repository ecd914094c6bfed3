package backoff

import (
	"context"
	"testing"
	"time"
)

// TestDelays: the delays double from first and stop at max.
func TestDelays(t *testing.T) {
	b := New(time.Microsecond, 5*time.Microsecond)
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
		if !b.Wait(context.Background()) {
			t.Fatal("Wait ended without its context ending")
		}
	}
	want := []time.Duration{time.Microsecond, 2 * time.Microsecond, 4 * time.Microsecond, 5 * time.Microsecond, 5 * time.Microsecond}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
}

// TestEnded: an ended context ends the wait, however long the delay.
func TestEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if New(time.Hour, time.Hour).Wait(ctx) {
		t.Error("Wait slept through an ended context")
	}
	ctx, cancel = context.WithCancel(context.Background())
	go cancel()
	if New(time.Hour, time.Hour).Wait(ctx) {
		t.Error("Wait slept through its context's end")
	}
}
