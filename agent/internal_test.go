package agent

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseCounter(t *testing.T) {
	tests := []struct {
		name, in, key string
		n             uint64
		ok, err       bool
	}{
		{"v1 oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n", "oom_kill", 4, true, false},
		{"v2 memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n", "oom_kill", 1, true, false},
		{"prefix is not the key", "oom_kill_disable 1\n", "oom_kill", 0, false, false},
		{"absent", "low 0\n", "oom_kill", 0, false, false},
		{"garbage value", "oom_kill x\n", "oom_kill", 0, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, ok, err := parseCounter(strings.NewReader(tc.in), tc.key)
			if n != tc.n || ok != tc.ok || (err != nil) != tc.err {
				t.Errorf("got %d %v %v", n, ok, err)
			}
		})
	}
}

func TestParsePids(t *testing.T) {
	got, err := parsePids([]byte("12\n345\n"))
	if err != nil || len(got) != 2 || got[0] != 12 || got[1] != 345 {
		t.Errorf("got %v %v", got, err)
	}
	if got, err := parsePids(nil); err != nil || len(got) != 0 {
		t.Errorf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"1\nx\n", "0\n", "-3\n"} {
		if _, err := parsePids([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRing(t *testing.T) {
	r := newRing(10)
	r.output(1, []byte("abcd"), false)
	r.output(2, []byte("efgh"), false)
	frames, _, closed := r.since(0)
	if len(frames) != 2 || closed || frames[0].seq != 1 || frames[1].seq != 2 {
		t.Fatalf("since(0) = %+v %v", frames, closed)
	}
	r.output(1, []byte("ijkl"), false) // 12 bytes > 10: the oldest frame goes
	frames, notify, _ := r.since(0)
	if len(frames) != 2 || frames[0].seq != 2 || frames[1].seq != 3 {
		t.Fatalf("after overflow: %+v", frames)
	}
	if frames, _, _ := r.since(3); len(frames) != 0 {
		t.Errorf("since(last) = %+v", frames)
	}
	if r.last() != 3 {
		t.Errorf("last = %d", r.last())
	}
	r.close()
	select {
	case <-notify:
	default:
		t.Error("close did not notify waiters")
	}
	if _, _, closed := r.since(3); !closed {
		t.Error("not closed")
	}
	// A single frame larger than the ring is kept: the newest output is never dropped.
	big := newRing(2)
	big.output(1, []byte("too big"), false)
	if frames, _, _ := big.since(0); len(frames) != 1 {
		t.Errorf("oversized frame dropped: %+v", frames)
	}
}

func TestLookPath(t *testing.T) {
	if p, err := lookPath("sh", "/nonexistent:/bin:/usr/bin", "/"); err != nil || p != "/bin/sh" {
		t.Errorf("sh: %q %v", p, err)
	}
	if _, err := lookPath("sh", "", "/"); err == nil {
		t.Error("found sh with an empty PATH")
	}
	if _, err := lookPath("/etc/passwd", "", "/"); err == nil {
		t.Error("a non-executable file was accepted")
	}
}

// TestOOMCounterChoice: the counter an exec's OOM verdict is read from, and that the verdict is
// the counter's change over the exec, not its value.
func TestOOMCounterChoice(t *testing.T) {
	write := func(t *testing.T, name string, n int) {
		t.Helper()
		if err := os.WriteFile(name, []byte(fmt.Sprintf("low 0\noom 1\noom_kill %d\n", n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name      string
		kind      string
		execFile  bool // the exec cgroup has its own memory.events (v2, memory enabled below)
		bumpExec  bool
		bumpBase  bool
		wantFile  string // "exec", "base", "v1" or ""
		wantKill  bool
		sandboxV1 bool
	}{
		{name: "v2 per exec, killed in it", kind: scopeV2, execFile: true, bumpExec: true, wantFile: "exec", wantKill: true},
		{name: "v2 per exec, killed elsewhere in the sandbox", kind: scopeV2, execFile: true, bumpBase: true, wantFile: "exec"},
		{name: "v2 sandbox-wide", kind: scopeV2, bumpBase: true, wantFile: "base", wantKill: true},
		{name: "v2 no change", kind: scopeV2, wantFile: "base"},
		{name: "v1", kind: scopeV1, sandboxV1: true, bumpBase: true, wantFile: "v1", wantKill: true},
		{name: "v1 no change", kind: scopeV1, sandboxV1: true, wantFile: "v1"},
		{name: "v1 without a memory cgroup", kind: scopeV1, bumpBase: true},
		{name: "process group", kind: scopePgrp, bumpBase: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base, exec, mem := t.TempDir(), t.TempDir(), t.TempDir()
			write(t, base+"/memory.events", 7)
			write(t, mem+"/memory.oom_control", 7)
			if tc.execFile {
				write(t, exec+"/memory.events", 0)
			}
			c := &cgroups{kind: tc.kind, base: base}
			t.Cleanup(c.closeFiles)
			if tc.sandboxV1 {
				c.memoryV1 = mem
			}
			g := &execGroup{kind: tc.kind, dir: exec, fd: -1, tasks: -1, c: c}
			g.startOOM()
			want := map[string]string{"exec": exec + "/memory.events", "base": base + "/memory.events", "v1": mem + "/memory.oom_control", "": ""}[tc.wantFile]
			if g.oomFile != want {
				t.Fatalf("counter %q, want %q", g.oomFile, want)
			}
			if tc.bumpExec {
				write(t, exec+"/memory.events", 1)
			}
			if tc.bumpBase {
				write(t, base+"/memory.events", 8)
				write(t, mem+"/memory.oom_control", 8)
			}
			g.endOOM()
			if g.oomKilled != tc.wantKill {
				t.Errorf("oomKilled %v, want %v", g.oomKilled, tc.wantKill)
			}
		})
	}
}

// TestActivityDiscountsFrozenTime: with a clock under the test's control, the idle budget
// runs down while the watcher looks on schedule, stands still while anything is active, and
// does not count a stretch in which the agent was not running (a paused, frozen sandbox:
// the next look comes far later than scheduled).
func TestActivityDiscountsFrozenTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	a := newActivity(300 * time.Millisecond)
	a.now = func() time.Time { return now }
	a.last, a.seen = t0, t0
	look := func(d time.Duration) time.Duration {
		now = now.Add(d)
		return a.remaining()
	}
	p := a.period
	if r := look(p); r != 300*time.Millisecond-p {
		t.Fatalf("after one period: %v", r)
	}
	end := a.begin()
	for range 100 {
		if r := look(p); r != 300*time.Millisecond {
			t.Fatalf("while active: %v, want the whole timeout", r)
		}
	}
	end()
	if r := look(p); r != 300*time.Millisecond-p {
		t.Errorf("one period after the end: %v", r)
	}
	// Frozen for 10 s: one period of it is counted (the look was due then), the rest is not.
	if r := look(10 * time.Second); r != 300*time.Millisecond-2*p {
		t.Errorf("after a 10 s freeze: %v remaining, want %v", r, 300*time.Millisecond-2*p)
	}
	if f := a.frozenTotal(); f != 10*time.Second-p {
		t.Errorf("frozen %v, want %v", f, 10*time.Second-p)
	}
	var r time.Duration
	for i := 0; i < 100; i++ {
		if r = look(p); r <= 0 {
			break
		}
	}
	if r > 0 {
		t.Errorf("never idle: %v", r)
	}
}

func TestListsID(t *testing.T) {
	for _, tc := range []struct {
		tasks string
		id    int
		want  bool
	}{
		{"", 1, false},
		{"1\n", 1, true},
		{"12\n", 1, false},
		{"1\n12\n", 12, true},
		{"112\n", 12, false},
		{"7\n8", 8, true}, // no final newline
		{"7\n\n8\n", 9, false},
	} {
		if got := listsID([]byte(tc.tasks), tc.id); got != tc.want {
			t.Errorf("listsID(%q, %d) = %v, want %v", tc.tasks, tc.id, got, tc.want)
		}
	}
}
