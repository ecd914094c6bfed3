package nsinit

import (
	"strings"
	"testing"
	"time"
)

func TestGeneratedEtc(t *testing.T) {
	files := GeneratedEtc(nil, nil, "/workspace")
	if !strings.Contains(string(files["passwd"]), "sandbox:x:1000:1000:sandbox:/workspace:") {
		t.Errorf("passwd: %q", files["passwd"])
	}
	if !strings.Contains(string(files["group"]), "sandbox:x:1000:") {
		t.Errorf("group: %q", files["group"])
	}
	if len(files["resolv.conf"]) != 0 {
		t.Errorf("resolv.conf under deny must be empty: %q", files["resolv.conf"])
	}
	// An image's own passwd keeps its entries; uid 1000 is added only when missing.
	img := []byte("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh")
	got := string(GeneratedEtc(img, nil, "/w")["passwd"])
	if strings.Count(got, ":1000:") != 1 || !strings.HasPrefix(got, "root:x:0:0") {
		t.Errorf("passwd from an image with uid 1000: %q", got)
	}
	got = string(GeneratedEtc([]byte("root:x:0:0::/root:/bin/sh"), nil, "/w")["passwd"])
	if !strings.HasSuffix(got, "sandbox:x:1000:1000:sandbox:/w:/bin/sh\n") || !strings.Contains(got, "/bin/sh\nsandbox") {
		t.Errorf("passwd without a trailing newline: %q", got)
	}
}

func TestConfigCheck(t *testing.T) {
	good := func() Config {
		return Config{SessionDir: "/run/airlock/s-1", Hostname: "x", RootKind: RootHost, EtcDir: "/run/airlock/etc/v1-0", DiskBytes: 1 << 20,
			Workdir: "/workspace", CgroupVersion: 1, Deadline: time.Now().Add(time.Hour), Seccomp: make([]byte, 16)}
	}
	c := good()
	if err := c.check(); err != nil {
		t.Fatalf("good config refused: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"root kind":        func(c *Config) { c.RootKind = "overlay" },
		"dir without src":  func(c *Config) { c.RootKind = RootDir },
		"host without etc": func(c *Config) { c.EtcDir = "" },
		"relative etc":     func(c *Config) { c.EtcDir = "etc" },
		"relative root":    func(c *Config) { c.RootMount = "mnt" },
		"relative workdir": func(c *Config) { c.Workdir = "work" },
		"no disk":          func(c *Config) { c.DiskBytes = 0 },
		"cgroup version":   func(c *Config) { c.CgroupVersion = 3 },
		"no seccomp":       func(c *Config) { c.Seccomp = nil },
		"odd seccomp":      func(c *Config) { c.Seccomp = make([]byte, 9) },
		"no deadline":      func(c *Config) { c.Deadline = time.Time{} },
	} {
		c := good()
		mutate(&c)
		if c.check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLandlockRightsByABI(t *testing.T) {
	prev := uint64(0)
	for abi := 1; abi <= 9; abi++ {
		r := landlockFSRights(abi)
		if r&prev != prev || r == 0 {
			t.Errorf("abi %d rights %#x do not extend abi %d's %#x", abi, r, abi-1, prev)
		}
		prev = r
	}
	if landlockFSRights(0) != 0 {
		t.Error("abi 0 handles rights")
	}
}
