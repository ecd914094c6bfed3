package agent

import (
	"strings"
	"testing"
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
