package agent

import (
	"os"
	"strings"
	"testing"
)

// threads is this process's OS thread count (/proc/self/status Threads).
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n := 0
			for _, c := range strings.TrimSpace(v) {
				n = n*10 + int(c-'0')
			}
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// TestSpareThreads: the threads are started and stay (idle) after the call returns, so the
// runtime has them when a later blocking call needs one.
func TestSpareThreads(t *testing.T) {
	spareThreads(16)
	// 16 goroutines held 16 threads at once; those threads outlive the call, idle.
	if n := threads(t); n < 16 {
		t.Errorf("after spareThreads(16) the process has %d threads, want at least 16", n)
	}
	spareThreads(0) // nothing
}
