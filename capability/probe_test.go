package capability

import (
	"bytes"
	"compress/gzip"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// fakeHost is a host's file tree as probeFiles reads it, rooted at "/".
type fakeHost fstest.MapFS

func (h fakeHost) set(path, content string) fakeHost {
	h[path] = &fstest.MapFile{Data: []byte(content)}
	return h
}

func (h fakeHost) dir(path string) fakeHost {
	h[path] = &fstest.MapFile{Mode: fs.ModeDir | 0o755}
	return h
}

func (h fakeHost) del(path string) fakeHost {
	delete(h, path)
	return h
}

// baseHost is a capable Linux host without any cgroup mounts.
func baseHost() fakeHost {
	h := fakeHost{}
	h.set("proc/self/status", "Name:\tprobe\nCapEff:\t000001fffeffffff\nSeccomp:\t0\n")
	h.set("proc/sys/kernel/seccomp/actions_avail", "kill_process kill_thread trap errno user_notif trace log allow\n")
	h.set("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n")
	h.set("proc/sys/user/max_user_namespaces", "96364\n")
	for _, ns := range requiredNamespaces {
		h.set("proc/self/ns/"+ns, "")
	}
	h.set("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\nnodev\tcgroup\nnodev\tcgroup2\n\text4\n")
	h.set("proc/cgroups", "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t1\t1\ncpuacct\t2\t1\t1\nmemory\t4\t45\t1\nfreezer\t6\t1\t1\npids\t8\t1\t1\n")
	h.set("proc/self/mountinfo", "22 1 0:21 / / rw,relatime - ext4 /dev/sda rw\n")
	h.set("proc/self/cgroup", "")
	return h
}

func v1Host() fakeHost {
	h := baseHost()
	h.set("proc/self/mountinfo", mountinfoV1)
	h.set("proc/self/cgroup", procCgroupV1)
	h.set("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n")
	h.set("sys/fs/cgroup/memory/process_api/459d/memory.memsw.limit_in_bytes", "9223372036854771712\n")
	h.dir("sys/fs/cgroup/pids")
	h.dir("sys/fs/cgroup/freezer")
	return h
}

func v2Host() fakeHost {
	h := baseHost()
	h.set("proc/cgroups", "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t0\t1\t1\nmemory\t0\t45\t1\npids\t0\t1\t1\n")
	h.set("proc/self/mountinfo", mountinfoV2)
	h.set("proc/self/cgroup", procCgroupV2)
	h.set("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
	own := "sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope/"
	h.set(own+"memory.swap.max", "max\n")
	h.set(own+"cpu.max", "max 100000\n")
	h.set(own+"cgroup.freeze", "0\n")
	return h
}

func hybridHost() fakeHost {
	h := baseHost()
	h.set("proc/self/mountinfo", mountinfoHybrid)
	h.set("proc/self/cgroup", procCgroupHybrid)
	h.set("sys/fs/cgroup/unified/cgroup.controllers", "")
	h.set("sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_quota_us", "-1\n")
	h.set("sys/fs/cgroup/memory/user.slice/user-1000.slice/session-2.scope/memory.usage_in_bytes", "1\n")
	return h
}

func gz(s string) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write([]byte(s))
	w.Close()
	return b.String()
}

func TestProbeFilesCgroups(t *testing.T) {
	ctl := func(v int, dir string) CgroupController { return CgroupController{Version: v, Dir: dir} }
	tests := []struct {
		name     string
		host     fakeHost
		version  string
		ctls     map[string]CgroupController
		v2       []string
		quota    bool
		memsw    bool
		freezer  bool
		problems bool
	}{
		{name: "v1", host: v1Host(), version: "v1", ctls: map[string]CgroupController{
			"cpu":     ctl(1, "/sys/fs/cgroup/cpu"),
			"cpuacct": ctl(1, "/sys/fs/cgroup/cpuacct"),
			"memory":  ctl(1, "/sys/fs/cgroup/memory/process_api/459d"),
			"freezer": ctl(1, "/sys/fs/cgroup/freezer"),
			"pids":    ctl(1, "/sys/fs/cgroup/pids"),
		}, quota: true, memsw: true, freezer: true},
		{name: "v1 without swap accounting or freezer", host: v1Host().
			del("sys/fs/cgroup/memory/process_api/459d/memory.memsw.limit_in_bytes").
			set("proc/self/mountinfo", strings.Replace(mountinfoV1, "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n", "", 1)),
			version: "v1", ctls: map[string]CgroupController{
				"cpu":     ctl(1, "/sys/fs/cgroup/cpu"),
				"cpuacct": ctl(1, "/sys/fs/cgroup/cpuacct"),
				"memory":  ctl(1, "/sys/fs/cgroup/memory/process_api/459d"),
				"pids":    ctl(1, "/sys/fs/cgroup/pids"),
			}, quota: true},
		{name: "v2", host: v2Host(), version: "v2", ctls: map[string]CgroupController{
			"cpuset": ctl(2, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
			"cpu":    ctl(2, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
			"io":     ctl(2, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
			"memory": ctl(2, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
			"pids":   ctl(2, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
		}, v2: []string{"cpuset", "cpu", "io", "memory", "pids"}, quota: true, memsw: true, freezer: true},
		{name: "v2 in the root cgroup looks at a child", host: v2Host().
			set("proc/self/cgroup", "0::/\n").
			set("sys/fs/cgroup/init.scope/memory.swap.max", "max\n").
			set("sys/fs/cgroup/init.scope/cgroup.freeze", "0\n"),
			version: "v2", ctls: map[string]CgroupController{
				"cpuset": ctl(2, "/sys/fs/cgroup"), "cpu": ctl(2, "/sys/fs/cgroup"), "io": ctl(2, "/sys/fs/cgroup"),
				"memory": ctl(2, "/sys/fs/cgroup"), "pids": ctl(2, "/sys/fs/cgroup"),
			}, v2: []string{"cpuset", "cpu", "io", "memory", "pids"}, memsw: true, freezer: true},
		{name: "v2 with cpu and pids not delegated", host: v2Host().
			set("sys/fs/cgroup/cgroup.controllers", "memory\n").
			del("sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope/cpu.max"),
			version: "v2", ctls: map[string]CgroupController{
				"memory": ctl(2, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
			}, v2: []string{"memory"}, memsw: true, freezer: true},
		{name: "hybrid uses the v1 controllers", host: hybridHost(), version: "hybrid", ctls: map[string]CgroupController{
			"cpu":     ctl(1, "/sys/fs/cgroup/cpu,cpuacct/user.slice"),
			"cpuacct": ctl(1, "/sys/fs/cgroup/cpu,cpuacct/user.slice"),
			"memory":  ctl(1, "/sys/fs/cgroup/memory/user.slice/user-1000.slice/session-2.scope"),
			"pids":    ctl(1, "/sys/fs/cgroup/pids/user.slice/user-1000.slice/session-2.scope"),
		}, quota: true},
		{name: "container: hierarchy root is the container's cgroup", host: baseHost().
			set("proc/self/mountinfo", mountinfoContainer).
			set("proc/self/cgroup", "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n").
			set("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"),
			version: "v1", ctls: map[string]CgroupController{
				"memory":  ctl(1, "/sys/fs/cgroup/memory"),
				"cpu":     ctl(1, "/sys/fs/cgroup/cpu,cpuacct"),
				"cpuacct": ctl(1, "/sys/fs/cgroup/cpu,cpuacct"),
			}, quota: true},
		{name: "no cgroup mounted", host: baseHost(), version: "none", ctls: map[string]CgroupController{}},
		{name: "unreadable mountinfo", host: baseHost().del("proc/self/mountinfo"), version: "none",
			ctls: map[string]CgroupController{}, problems: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := probeFiles(fstest.MapFS(tt.host), "6.1.0")
			cg := h.Cgroup
			if cg.Version != tt.version {
				t.Errorf("Version = %q, want %q", cg.Version, tt.version)
			}
			if !reflect.DeepEqual(cg.Controllers, tt.ctls) {
				t.Errorf("Controllers = %+v\nwant          %+v", cg.Controllers, tt.ctls)
			}
			if !slices.Equal(cg.V2Controllers, tt.v2) {
				t.Errorf("V2Controllers = %v, want %v", cg.V2Controllers, tt.v2)
			}
			if cg.CPUQuota != tt.quota || cg.MemorySwap != tt.memsw || cg.Freezer != tt.freezer {
				t.Errorf("CPUQuota, MemorySwap, Freezer = %v, %v, %v; want %v, %v, %v",
					cg.CPUQuota, cg.MemorySwap, cg.Freezer, tt.quota, tt.memsw, tt.freezer)
			}
			if (len(h.Problems) > 0) != tt.problems {
				t.Errorf("Problems = %q, want problems: %v", h.Problems, tt.problems)
			}
		})
	}
}

func TestProbeFilesHostFacts(t *testing.T) {
	tests := []struct {
		name  string
		host  fakeHost
		check func(t *testing.T, h HostProbe)
	}{
		{"capable host", baseHost(), func(t *testing.T, h HostProbe) {
			if !h.Seccomp.Supported || !h.Seccomp.Filter || h.Seccomp.Mode != 0 || !slices.Contains(h.Seccomp.Actions, "user_notif") {
				t.Errorf("Seccomp = %+v", h.Seccomp)
			}
			if !h.CapSysAdmin || !h.CapNetAdmin {
				t.Errorf("caps: sysadmin %v netadmin %v", h.CapSysAdmin, h.CapNetAdmin)
			}
			if h.UserNS.Max != 96364 || h.UserNS.UnprivilegedClone != nil || !h.UserNS.Unprivileged() {
				t.Errorf("UserNS = %+v", h.UserNS)
			}
			if h.SwapOn || !h.Tmpfs || len(h.MissingNamespaces) != 0 || len(h.Problems) != 0 {
				t.Errorf("swap %v tmpfs %v missing %v problems %q", h.SwapOn, h.Tmpfs, h.MissingNamespaces, h.Problems)
			}
		}},
		{"seccomp filtered process, no caps", baseHost().set("proc/self/status", "CapEff:\t0000000000000000\nSeccomp:\t2\n"), func(t *testing.T, h HostProbe) {
			if h.Seccomp.Mode != 2 || h.CapSysAdmin || h.CapNetAdmin {
				t.Errorf("Seccomp %+v sysadmin %v netadmin %v", h.Seccomp, h.CapSysAdmin, h.CapNetAdmin)
			}
		}},
		{"no seccomp filter mode", baseHost().del("proc/sys/kernel/seccomp/actions_avail"), func(t *testing.T, h HostProbe) {
			if h.Seccomp.Filter {
				t.Error("Filter true without actions_avail")
			}
		}},
		{"debian knob off", baseHost().set("proc/sys/kernel/unprivileged_userns_clone", "0\n"), func(t *testing.T, h HostProbe) {
			if h.UserNS.UnprivilegedClone == nil || *h.UserNS.UnprivilegedClone || h.UserNS.Unprivileged() {
				t.Errorf("UserNS = %+v", h.UserNS)
			}
		}},
		{"ubuntu apparmor restriction", baseHost().set("proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1\n"), func(t *testing.T, h HostProbe) {
			if h.UserNS.AppArmorRestrict == nil || !*h.UserNS.AppArmorRestrict || h.UserNS.Unprivileged() {
				t.Errorf("UserNS = %+v", h.UserNS)
			}
		}},
		{"user namespaces off", baseHost().set("proc/sys/user/max_user_namespaces", "0\n"), func(t *testing.T, h HostProbe) {
			if h.UserNS.Max != 0 || h.UserNS.Unprivileged() {
				t.Errorf("UserNS = %+v", h.UserNS)
			}
		}},
		{"no user namespaces in the kernel", baseHost().del("proc/sys/user/max_user_namespaces").del("proc/self/ns/user"), func(t *testing.T, h HostProbe) {
			if h.UserNS.Max != -1 || !slices.Equal(h.MissingNamespaces, []string{"user"}) {
				t.Errorf("UserNS = %+v missing %v", h.UserNS, h.MissingNamespaces)
			}
		}},
		{"swap on", baseHost().set("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 2097148 0 -2\n"), func(t *testing.T, h HostProbe) {
			if !h.SwapOn {
				t.Error("SwapOn false")
			}
		}},
		{"unprivileged_userns_clone on", baseHost().set("proc/sys/kernel/unprivileged_userns_clone", "1\n"), func(t *testing.T, h HostProbe) {
			if h.UserNS.UnprivilegedClone == nil || !*h.UserNS.UnprivilegedClone || !h.UserNS.Unprivileged() {
				t.Errorf("UserNS = %+v", h.UserNS)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, probeFiles(fstest.MapFS(tt.host), "6.1.0")) })
	}
}

func TestKernelFeature(t *testing.T) {
	const rel = "6.1.0"
	mods := "lib/modules/" + rel + "/"
	tests := []struct {
		name      string
		host      fakeHost
		available bool
		source    ModuleState
	}{
		{"loaded module", baseHost().dir("sys/module/veth"), true, ModuleLoaded},
		{"built in per /proc/config.gz", baseHost().set("proc/config.gz", gz("CONFIG_VETH=y\n")), true, ModuleBuiltin},
		{"built in per /boot config", baseHost().set("boot/config-"+rel, "CONFIG_VETH=y\n"), true, ModuleBuiltin},
		{"module per config, installed", baseHost().set("proc/config.gz", gz("CONFIG_VETH=m\n")).
			set(mods+"modules.dep", "kernel/drivers/net/veth.ko.zst:\n"), true, ModuleLoadable},
		{"module per config, not installed", baseHost().set("proc/config.gz", gz("CONFIG_VETH=m\n")), false, ModuleAbsent},
		{"not set in config", baseHost().set("proc/config.gz", gz("# CONFIG_VETH is not set\n")).
			set(mods+"modules.dep", "kernel/drivers/net/veth.ko:\n"), false, ModuleAbsent},
		{"modules.builtin without config", baseHost().set(mods+"modules.builtin", "kernel/drivers/net/veth.ko\n").
			set(mods+"modules.dep", ""), true, ModuleBuiltin},
		{"modules.dep without config", baseHost().set(mods+"modules.builtin", "").
			set(mods+"modules.dep", "kernel/drivers/net/veth.ko:\n"), true, ModuleLoadable},
		{"in neither list", baseHost().set(mods+"modules.builtin", "kernel/net/bridge.ko\n").
			set(mods+"modules.dep", "kernel/net/tun.ko:\n"), false, ModuleAbsent},
		{"no evidence at all", baseHost(), false, ModuleUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := probeFiles(fstest.MapFS(tt.host), rel)
			if h.Veth.Available != tt.available || h.Veth.Source != string(tt.source) {
				t.Errorf("Veth = %+v, want available %v source %s", h.Veth, tt.available, tt.source)
			}
			if !h.Veth.Available && h.Veth.Detail == "" {
				t.Error("an unavailable feature has no detail")
			}
		})
	}
}
