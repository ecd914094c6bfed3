package sessions

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParkedIDs: a claim's candidates come newest first by the index file's modification time
// (written once, when parked), without reading an entry; names that are not session ids are
// not candidates, and a key never filled has none.
func TestParkedIDs(t *testing.T) {
	dir := t.TempDir()
	idx := IndexDir(dir, "pkey")
	if err := os.MkdirAll(idx, 0o700); err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour)
	for i, id := range []string{"s-00000000000000a1", "s-00000000000000a2", "s-00000000000000a3", ".tmp-s-00000000000000a4", "notes"} {
		p := filepath.Join(idx, id)
		if err := os.WriteFile(p, []byte("not read"), 0o600); err != nil {
			t.Fatal(err)
		}
		// a2 newest, then a1, then a3.
		at := base.Add(time.Duration([]int{2, 3, 1, 4, 5}[i]) * time.Minute)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ParkedIDs(dir, "pkey")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"s-00000000000000a2", "s-00000000000000a1", "s-00000000000000a3"}; !slices.Equal(got, want) {
		t.Errorf("ParkedIDs = %v, want %v", got, want)
	}
	if got, err := ParkedIDs(dir, "never-filled"); err != nil || len(got) != 0 {
		t.Errorf("a key never filled: %v, %v", got, err)
	}
}

// BenchmarkClaimCandidates is what a claim reads of an index of 30 parked sandboxes before it
// takes one: every entry (Parked, as claims did) against the names and modification times
// (ParkedIDs) plus the one entry taken.
func BenchmarkClaimCandidates(b *testing.B) {
	dir := b.TempDir()
	idx := IndexDir(dir, "pkey")
	if err := os.MkdirAll(idx, 0o700); err != nil {
		b.Fatal(err)
	}
	for i := range 30 {
		id := fmt.Sprintf("s-%016x", i+1)
		data := []byte(`{"session":"` + id + `","parked":"2026-12-06T06:00:00Z","prestart":{"python":{"id":"p1","pid":42}}}`)
		if err := os.WriteFile(filepath.Join(idx, id), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("every-entry", func(b *testing.B) {
		for b.Loop() {
			if e, err := Parked(dir, "pkey"); err != nil || len(e) != 30 {
				b.Fatal(len(e), err)
			}
		}
	})
	b.Run("names-then-one", func(b *testing.B) {
		for b.Loop() {
			ids, err := ParkedIDs(dir, "pkey")
			if err != nil || len(ids) != 30 {
				b.Fatal(len(ids), err)
			}
			if _, err := os.ReadFile(filepath.Join(idx, ids[0])); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestFillerAlive: a run queues for the key's filler only while the process that marked itself
// filler runs; a filler that is gone (or none ever marked) makes it start one.
func TestFillerAlive(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(IndexDir(dir, "pkey"), 0o700); err != nil {
		t.Fatal(err)
	}
	if FillerAlive(dir, "pkey") {
		t.Error("a filler alive before any marked itself")
	}
	if err := MarkFiller(dir, "pkey"); err != nil {
		t.Fatal(err)
	}
	if !FillerAlive(dir, "pkey") {
		t.Error("this process marked itself filler and is not alive")
	}
	self, err := SelfProc()
	if err != nil {
		t.Fatal(err)
	}
	// The same pid with another start time: a process that is gone, its pid reused.
	pid, _, _ := strings.Cut(self, "-")
	if err := os.WriteFile(IndexDir(dir, "pkey")+".filler", []byte(pid+"-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if FillerAlive(dir, "pkey") {
		t.Error("a filler whose start time does not match is alive")
	}
}
