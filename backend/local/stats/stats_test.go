package stats

import (
	"strings"
	"testing"
)

// TestParseCounter: cgroup counter files, v1 and v2 alike.
func TestParseCounter(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"123456789\n", 123456789, true},
		{"0\n", 0, true},
		{"  42  \n", 42, true},
		{"max\n", 0, false},
		{"-1\n", 0, false},
		{"", 0, false},
		{"12 34\n", 0, false},
	} {
		got, err := parseCounter(strings.NewReader(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseCounter(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestParseCPUStatUsage: usage_usec of a v2 cpu.stat, wherever it is in the file.
func TestParseCPUStatUsage(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n", 2500000, true},
		{"nr_periods 0\nusage_usec 17\n", 17, true},
		{"user_usec 1\nsystem_usec 2\n", 0, false},
		{"usage_usec lots\n", 0, false},
		{"", 0, false},
	} {
		got, err := parseCPUStatUsage(strings.NewReader(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseCPUStatUsage(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestStatFiles: which kernel files each version's counters come from.
func TestStatFiles(t *testing.T) {
	v1 := filesFor(1, "/airlock/s-1")
	if v1.cpu != "/sys/fs/cgroup/cpuacct/airlock/s-1/cpuacct.usage" || v1.cpuUnit != "ns" ||
		v1.memory != "/sys/fs/cgroup/memory/airlock/s-1/memory.usage_in_bytes" ||
		v1.memoryPeak != "/sys/fs/cgroup/memory/airlock/s-1/memory.max_usage_in_bytes" ||
		v1.pids != "/sys/fs/cgroup/pids/airlock/s-1/pids.current" {
		t.Errorf("v1 files %+v", v1)
	}
	v2 := filesFor(2, "/airlock/s-1")
	if v2.cpu != "/sys/fs/cgroup/airlock/s-1/cpu.stat" || v2.cpuUnit != "cpu.stat" ||
		v2.memory != "/sys/fs/cgroup/airlock/s-1/memory.current" || v2.memoryPeak != "/sys/fs/cgroup/airlock/s-1/memory.peak" ||
		v2.pids != "/sys/fs/cgroup/airlock/s-1/pids.current" {
		t.Errorf("v2 files %+v", v2)
	}
}
