// Package stats reads a sandbox's usage from its cgroup's counters, on cgroup v1 and v2.
package stats

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// statFiles are where each counter is, per cgroup version, relative to the cgroup root and the
// sandbox's cgroup path. A peak file the kernel lacks (v2 before 5.19) leaves the peak 0.
type statFiles struct {
	cpu, cpuUnit       string // unit: "ns" (v1 cpuacct.usage) or "cpu.stat" (v2 usage_usec)
	memory, memoryPeak string
	pids               string
}

func filesFor(version int, cg string) statFiles {
	if version == 2 {
		d := filepath.Join(kernfile.CgroupRoot, cg)
		return statFiles{
			cpu: filepath.Join(d, "cpu.stat"), cpuUnit: "cpu.stat",
			memory: filepath.Join(d, "memory.current"), memoryPeak: filepath.Join(d, "memory.peak"),
			pids: filepath.Join(d, "pids.current"),
		}
	}
	return statFiles{
		cpu: filepath.Join(kernfile.CgroupRoot, "cpuacct", cg, "cpuacct.usage"), cpuUnit: "ns",
		memory:     filepath.Join(kernfile.CgroupRoot, "memory", cg, "memory.usage_in_bytes"),
		memoryPeak: filepath.Join(kernfile.CgroupRoot, "memory", cg, "memory.max_usage_in_bytes"),
		pids:       filepath.Join(kernfile.CgroupRoot, "pids", cg, "pids.current"),
	}
}

// Read is the usage of the cgroup cg (a path below the root of each hierarchy) on a cgroup
// version's host: cpu time, memory now and at most, processes and threads now.
func Read(version int, cg string) (sandbox.Stats, error) {
	f := filesFor(version, cg)
	open := func(name string) (io.Reader, error) {
		b, err := kernfile.Read(name)
		if err != nil {
			return nil, err
		}
		return bytes.NewReader(b), nil
	}
	var st sandbox.Stats
	r, err := open(f.cpu)
	if err != nil {
		return st, err
	}
	if f.cpuUnit == "cpu.stat" {
		usec, err := parseCPUStatUsage(r)
		if err != nil {
			return st, fmt.Errorf("%s: %w", f.cpu, err)
		}
		st.CPUSeconds = float64(usec) / 1e6
	} else {
		ns, err := parseCounter(r)
		if err != nil {
			return st, fmt.Errorf("%s: %w", f.cpu, err)
		}
		st.CPUSeconds = float64(ns) / 1e9
	}
	for _, c := range []struct {
		name     string
		into     *int64
		optional bool
	}{{f.memory, &st.MemoryBytes, false}, {f.memoryPeak, &st.MemoryPeakBytes, true}, {f.pids, &st.Processes, false}} {
		r, err := open(c.name)
		if c.optional && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return st, err
		}
		if *c.into, err = parseCounter(r); err != nil {
			return st, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return st, nil
}

// parseCounter reads a cgroup file holding one non-negative integer ("max" is not a counter).
func parseCounter(r io.Reader) (int64, error) {
	b, err := io.ReadAll(io.LimitReader(r, 64))
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("not a counter: %q", strings.TrimSpace(string(b)))
	}
	return v, nil
}

// parseCPUStatUsage reads usage_usec from a v2 cpu.stat.
func parseCPUStatUsage(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == "usage_usec" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("usage_usec %q", v)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no usage_usec line")
}
