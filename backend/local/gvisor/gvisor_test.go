package gvisor

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestSpec: the spec carries the declaration's limits (the host pids limit with room for
// gVisor's own threads, the guest's as RLIMIT_NPROC), the cgroup named after the session,
// and the host's directories only for the host image.
func TestSpec(t *testing.T) {
	for _, host := range []bool{false, true} {
		s := Spec(Config{
			Dir: "/state/s-0123456789abcdef", Root: "/img", HostImage: host, AgentPath: "/bin/agent",
			AgentConfig: "/state/agent.json", CgroupParent: "airlock", Hostname: "h", Workdir: "/work",
			CPUMillis: 500, MemoryBytes: 256 << 20, DiskBytes: 64 << 20, MaxProcesses: 100,
		})
		if got := *s.Linux.Resources.Pids.Limit; got != 100+pidsHeadroom {
			t.Errorf("host %v: pids limit %d, want %d", host, got, 100+pidsHeadroom)
		}
		if r := s.Process.Rlimits[0]; r.Type != "RLIMIT_NPROC" || r.Hard != 100 {
			t.Errorf("host %v: rlimit %+v, want RLIMIT_NPROC 100", host, r)
		}
		if got := *s.Linux.Resources.CPU.Quota; got != 50000 {
			t.Errorf("host %v: cpu quota %d, want 50000 of 100000", host, got)
		}
		if s.Linux.CgroupsPath != "/airlock/s-0123456789abcdef" {
			t.Errorf("host %v: cgroup %q", host, s.Linux.CgroupsPath)
		}
		hasUsr := slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/usr" })
		if hasUsr != host {
			t.Errorf("host image %v: /usr bound from the host: %v", host, hasUsr)
		}
		if !s.Root.Readonly || s.Root.Path != "/img" {
			t.Errorf("host %v: root %+v", host, s.Root)
		}
	}
}

// TestRoot: an image directory is the root as it is; the host image gets a skeleton with the
// workdir and a generated /etc.
func TestRoot(t *testing.T) {
	if got, err := Root(t.TempDir(), "/images/x", "/work"); err != nil || got != "/images/x" {
		t.Fatalf("Root with an image = %q, %v", got, err)
	}
	dir := t.TempDir()
	root, err := Root(dir, "", "/home/user/work")
	if err != nil {
		t.Fatal(err)
	}
	if root != filepath.Join(dir, "bundle", "rootfs") {
		t.Errorf("root %s", root)
	}
	for _, p := range []string{"home/user/work", ".airlock/bin", "etc/passwd", "usr"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("skeleton lacks %s: %v", p, err)
		}
	}
}
