package capability

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
)

// HostProbe is what this host offers the embedded local runtime. ProbeHost fills it; Set maps
// it to the local capability set, with a reason for every false.
type HostProbe struct {
	OS     string `json:"os"`
	Kernel string `json:"kernel,omitempty"` // uname release
	UID    int    `json:"uid"`
	Root   bool   `json:"root"` // effective uid 0
	// CapSysAdmin and CapNetAdmin are effective capabilities of this process (root can lack them).
	CapSysAdmin bool `json:"capSysAdmin"`
	CapNetAdmin bool `json:"capNetAdmin"`

	Cgroup CgroupFacts `json:"cgroup"`
	// SwapOn is true when /proc/swaps lists an active swap area.
	SwapOn bool `json:"swapOn"`

	Seccomp SeccompFacts `json:"seccomp"`
	// LandlockABI is the kernel's Landlock ABI version; 0 when Landlock is unavailable.
	LandlockABI int `json:"landlockABI"`

	UserNS UserNSFacts `json:"userns"`
	// MissingNamespaces are namespace kinds the kernel lacks (no /proc/self/ns/<kind>).
	MissingNamespaces []string `json:"missingNamespaces,omitempty"`
	// Tmpfs is true when the kernel has tmpfs, which bounds a sandbox's writable layer.
	Tmpfs bool `json:"tmpfs"`

	NFTables Feature `json:"nftables"`
	Veth     Feature `json:"veth"`

	// Runsc is the path of gVisor's runsc on PATH, "" when absent.
	Runsc string `json:"runsc,omitempty"`
	// DockerCLI is the first docker-compatible CLI on PATH (docker, podman, nerdctl).
	DockerCLI string `json:"dockerCli,omitempty"`

	// Problems are probe steps that could not read what they needed; the facts they would
	// have given stay false (never assumed true).
	Problems []string `json:"problems,omitempty"`
}

// CgroupFacts describe the cgroup layout the runtime would create sandboxes in.
type CgroupFacts struct {
	// Version is "v1", "v2", "hybrid" (v1 controllers plus a controller-less cgroup2
	// mount) or "none".
	Version string        `json:"version"`
	Mounts  []CgroupMount `json:"mounts,omitempty"`
	// Kernel is /proc/cgroups: controller → enabled. Absent means not built in.
	Kernel map[string]bool `json:"kernel,omitempty"`
	// Controllers are the controllers usable in Version's mode, keyed by name.
	Controllers map[string]CgroupController `json:"controllers,omitempty"`
	// V2Controllers is the cgroup2 root's cgroup.controllers (empty in hybrid mode).
	V2Controllers []string `json:"v2Controllers,omitempty"`
	// CPUQuota is true when CFS bandwidth control (cpu.cfs_quota_us / cpu.max) exists.
	CPUQuota bool `json:"cpuQuota"`
	// MemorySwap is true when memory+swap can be limited (memsw / memory.swap.max).
	MemorySwap bool `json:"memorySwap"`
	// Freezer is true when sandboxes can be frozen (v1 freezer or v2 cgroup.freeze).
	Freezer bool `json:"freezer"`
}

// CgroupController is one usable controller.
type CgroupController struct {
	Version int `json:"version"`
	// Dir is this process's cgroup directory for the controller: where sandboxes are created.
	Dir string `json:"dir"`
	// Writable is true when this process may create cgroups in Dir.
	Writable bool `json:"writable"`
	// WriteError says why Dir is not writable.
	WriteError string `json:"writeError,omitempty"`
}

// SeccompFacts describe the kernel's seccomp support.
type SeccompFacts struct {
	// Supported is CONFIG_SECCOMP (the Seccomp: line in /proc/self/status, prctl answers).
	Supported bool `json:"supported"`
	// Filter is CONFIG_SECCOMP_FILTER (/proc/sys/kernel/seccomp/actions_avail exists).
	Filter bool `json:"filter"`
	// Actions are the filter return actions the kernel knows.
	Actions []string `json:"actions,omitempty"`
	// Mode is this process's seccomp mode: 0 none, 1 strict, 2 filter.
	Mode int `json:"mode"`
}

// UserNSFacts describe whether user namespaces can be created.
type UserNSFacts struct {
	// Max is user.max_user_namespaces; -1 when the sysctl is absent (no CONFIG_USER_NS).
	Max int64 `json:"max"`
	// UnprivilegedClone is Debian's kernel.unprivileged_userns_clone, nil when absent.
	UnprivilegedClone *bool `json:"unprivilegedClone,omitempty"`
	// AppArmorRestrict is Ubuntu's kernel.apparmor_restrict_unprivileged_userns, nil when absent.
	AppArmorRestrict *bool `json:"apparmorRestrict,omitempty"`
}

// Unprivileged reports whether a process without CAP_SYS_ADMIN may create a user namespace.
func (u UserNSFacts) Unprivileged() bool {
	return u.Max > 0 &&
		(u.UnprivilegedClone == nil || *u.UnprivilegedClone) &&
		(u.AppArmorRestrict == nil || !*u.AppArmorRestrict)
}

// Feature is a kernel feature found through the cheapest reliable evidence.
type Feature struct {
	Available bool `json:"available"`
	// Source is the evidence: "netlink" (asked the kernel), "loaded", "builtin",
	// "loadable", "absent", "unknown".
	Source string `json:"source"`
	Detail string `json:"detail,omitempty"`
}

// Capability bits in /proc/self/status CapEff (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// requiredNamespaces are the namespaces every local sandbox is made of.
var requiredNamespaces = []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"}

// probeFiles gathers every fact that comes from files (proc, sys, kernel config) through
// fsys, rooted at "/". kernel is the uname release (for /boot and /lib/modules).
func probeFiles(fsys fs.FS, kernel string) HostProbe {
	h := HostProbe{OS: "linux", Kernel: kernel, UserNS: UserNSFacts{Max: -1}}
	problem := func(format string, a ...any) { h.Problems = append(h.Problems, fmt.Sprintf(format, a...)) }

	if b, err := fs.ReadFile(fsys, "proc/self/status"); err != nil {
		problem("read /proc/self/status: %v", err)
	} else if st, err := parseProcStatus(bytes.NewReader(b)); err != nil {
		problem("%v", err)
	} else {
		h.Seccomp.Supported, h.Seccomp.Mode = st.HasSeccomp, st.SeccompMode
		h.CapSysAdmin = st.CapEff&(1<<capSysAdmin) != 0
		h.CapNetAdmin = st.CapEff&(1<<capNetAdmin) != 0
	}
	if b, err := fs.ReadFile(fsys, "proc/sys/kernel/seccomp/actions_avail"); err == nil {
		h.Seccomp.Filter = true
		h.Seccomp.Actions = strings.Fields(string(b))
	}

	h.Cgroup = probeCgroups(fsys, problem)

	if b, err := fs.ReadFile(fsys, "proc/swaps"); err != nil {
		problem("read /proc/swaps: %v", err)
	} else if on, err := ParseSwaps(bytes.NewReader(b)); err != nil {
		problem("parse /proc/swaps: %v", err)
	} else {
		h.SwapOn = on
	}

	h.UserNS = probeUserNS(fsys, problem)
	for _, ns := range requiredNamespaces {
		if _, err := fs.Stat(fsys, "proc/self/ns/"+ns); err != nil {
			h.MissingNamespaces = append(h.MissingNamespaces, ns)
		}
	}
	if b, err := fs.ReadFile(fsys, "proc/filesystems"); err != nil {
		problem("read /proc/filesystems: %v", err)
	} else {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "tmpfs" {
				h.Tmpfs = true
			}
		}
	}

	kcfg := readKernelConfig(fsys, kernel)
	if h.Cgroup.Version == "v2" && !h.Cgroup.CPUQuota {
		// cpu.max shows only where cpu is enabled for a child cgroup; the config tells otherwise.
		h.Cgroup.CPUQuota = kcfg["CONFIG_CFS_BANDWIDTH"] == "y"
	}
	h.NFTables = kernelFeature(fsys, kcfg, kernel, "nf_tables", "CONFIG_NF_TABLES")
	h.Veth = kernelFeature(fsys, kcfg, kernel, "veth", "CONFIG_VETH")
	return h
}

// probeCgroups combines mountinfo, /proc/self/cgroup and /proc/cgroups into the layout.
func probeCgroups(fsys fs.FS, problem func(string, ...any)) CgroupFacts {
	cg := CgroupFacts{Version: "none", Controllers: map[string]CgroupController{}}
	b, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		problem("read /proc/self/mountinfo: %v", err)
		return cg
	}
	mounts, err := ParseCgroupMounts(bytes.NewReader(b))
	if err != nil {
		problem("%v", err)
		return cg
	}
	cg.Mounts = mounts
	var member []kernfile.CgroupMembership
	if b, err := fs.ReadFile(fsys, "proc/self/cgroup"); err != nil {
		problem("read /proc/self/cgroup: %v", err)
	} else if member, err = kernfile.ParseProcCgroup(bytes.NewReader(b)); err != nil {
		problem("%v", err)
	}
	if b, err := fs.ReadFile(fsys, "proc/cgroups"); err == nil {
		if cg.Kernel, err = ParseProcCgroups(bytes.NewReader(b)); err != nil {
			problem("%v", err)
		}
	}

	ownPath := func(version int, ctrl string) string {
		for _, m := range member {
			if version == 2 && m.HierarchyID == 0 {
				return m.Path
			}
			if version == 1 && slices.Contains(m.Controllers, ctrl) {
				return m.Path
			}
		}
		return "/"
	}
	dirOf := func(m CgroupMount, own string) string {
		rel := own
		if m.Root != "/" {
			if r, ok := strings.CutPrefix(own, m.Root); ok {
				rel = r
			} else {
				rel = "/" // a cgroup namespace shows the mount's root as "/"
			}
		}
		return path.Clean(m.MountPoint + "/" + rel)
	}

	var v2 *CgroupMount
	hasV1 := false
	for i, m := range mounts {
		switch {
		case m.Version == 2 && v2 == nil:
			v2 = &mounts[i]
		case m.Version == 1:
			for _, c := range m.Controllers {
				hasV1 = true
				if _, dup := cg.Controllers[c]; dup {
					continue // a bind mount of a hierarchy already seen
				}
				cg.Controllers[c] = CgroupController{Version: 1, Dir: dirOf(m, ownPath(1, c))}
			}
		}
	}
	if v2 != nil {
		if b, err := fs.ReadFile(fsys, rel(v2.MountPoint+"/cgroup.controllers")); err != nil {
			problem("read %s/cgroup.controllers: %v", v2.MountPoint, err)
		} else {
			cg.V2Controllers = strings.Fields(string(b))
		}
	}
	switch {
	case hasV1 && v2 != nil:
		cg.Version = "hybrid"
	case hasV1:
		cg.Version = "v1"
	case v2 != nil:
		cg.Version = "v2"
		dir := dirOf(*v2, ownPath(2, ""))
		for _, c := range cg.V2Controllers {
			cg.Controllers[c] = CgroupController{Version: 2, Dir: dir}
		}
	}

	switch cg.Version {
	case "v1", "hybrid":
		if c, ok := cg.Controllers["cpu"]; ok {
			cg.CPUQuota = exists(fsys, c.Dir+"/cpu.cfs_quota_us")
		}
		if c, ok := cg.Controllers["memory"]; ok {
			cg.MemorySwap = exists(fsys, c.Dir+"/memory.memsw.limit_in_bytes")
		}
		_, cg.Freezer = cg.Controllers["freezer"]
	case "v2":
		// memory.swap.max, cpu.max and cgroup.freeze exist only below the root cgroup.
		child := v2Child(fsys, *v2, dirOf(*v2, ownPath(2, "")))
		if child != "" {
			cg.MemorySwap = exists(fsys, child+"/memory.swap.max")
			cg.CPUQuota = exists(fsys, child+"/cpu.max")
			cg.Freezer = exists(fsys, child+"/cgroup.freeze")
		}
	}
	return cg
}

// v2Child returns a non-root cgroup2 directory to look for per-cgroup files in: this
// process's own cgroup when it is not the root, else the first child of the root.
func v2Child(fsys fs.FS, m CgroupMount, own string) string {
	if path.Clean(own) != path.Clean(m.MountPoint) {
		return own
	}
	entries, err := fs.ReadDir(fsys, rel(m.MountPoint))
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if e.IsDir() {
			return m.MountPoint + "/" + e.Name()
		}
	}
	return ""
}

func probeUserNS(fsys fs.FS, problem func(string, ...any)) UserNSFacts {
	u := UserNSFacts{Max: -1}
	if b, err := fs.ReadFile(fsys, "proc/sys/user/max_user_namespaces"); err == nil {
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			problem("parse user.max_user_namespaces %q: %v", b, err)
			n = 0
		}
		u.Max = n
	}
	flag := func(name string) *bool {
		b, err := fs.ReadFile(fsys, "proc/sys/kernel/"+name)
		if err != nil {
			return nil
		}
		v := strings.TrimSpace(string(b)) != "0"
		return &v
	}
	u.UnprivilegedClone = flag("unprivileged_userns_clone")
	u.AppArmorRestrict = flag("apparmor_restrict_unprivileged_userns")
	return u
}

// kernelOptions are the kernel config options the probe reads.
var kernelOptions = map[string]bool{"CONFIG_VETH": true, "CONFIG_NF_TABLES": true, "CONFIG_CFS_BANDWIDTH": true}

// readKernelConfig reads /proc/config.gz, else /boot/config-<release>; nil when neither.
func readKernelConfig(fsys fs.FS, kernel string) map[string]string {
	if f, err := fsys.Open("proc/config.gz"); err == nil {
		defer f.Close()
		if cfg, err := parseGzipKernelConfig(f, kernelOptions); err == nil {
			return cfg
		}
	}
	if kernel != "" {
		if f, err := fsys.Open("boot/config-" + kernel); err == nil {
			defer f.Close()
			if cfg, err := parseKernelConfig(f, kernelOptions); err == nil {
				return cfg
			}
		}
	}
	return nil
}

// kernelFeature finds a kernel feature that may be built in or a module: loaded
// (/sys/module), then the kernel config, then the module lists under /lib/modules.
// A built-in feature without module parameters has no /sys/module entry, so the config
// and module lists are needed to see it.
func kernelFeature(fsys fs.FS, kcfg map[string]string, kernel, module, option string) Feature {
	if exists(fsys, "/sys/module/"+module) {
		return Feature{Available: true, Source: string(ModuleLoaded)}
	}
	modDir := "lib/modules/" + kernel
	inList := func(file string) (bool, bool) {
		f, err := fsys.Open(modDir + "/" + file)
		if err != nil {
			return false, false
		}
		defer f.Close()
		ok, err := moduleInList(f, module)
		return ok, err == nil
	}
	if kcfg != nil {
		switch v := kcfg[option]; v {
		case "y":
			return Feature{Available: true, Source: string(ModuleBuiltin), Detail: option + "=y"}
		case "m":
			if kernel != "" {
				if ok, read := inList("modules.dep"); ok && read {
					return Feature{Available: true, Source: string(ModuleLoadable), Detail: option + "=m"}
				}
			}
			return Feature{Source: string(ModuleAbsent), Detail: option + "=m but the module is not installed under /lib/modules/" + kernel}
		default:
			return Feature{Source: string(ModuleAbsent), Detail: option + " is not set in the kernel config"}
		}
	}
	if kernel != "" {
		okB, readB := inList("modules.builtin")
		if okB {
			return Feature{Available: true, Source: string(ModuleBuiltin), Detail: "listed in modules.builtin"}
		}
		okD, readD := inList("modules.dep")
		if okD {
			return Feature{Available: true, Source: string(ModuleLoadable), Detail: "listed in modules.dep"}
		}
		if readB && readD {
			return Feature{Source: string(ModuleAbsent), Detail: "not in modules.builtin or modules.dep"}
		}
	}
	return Feature{Source: string(ModuleUnknown), Detail: "no /sys/module/" + module + ", no kernel config and no module lists to tell"}
}

// rel turns an absolute host path into an fs.FS path rooted at "/".
func rel(p string) string {
	p = strings.TrimPrefix(path.Clean(p), "/")
	if p == "" {
		return "."
	}
	return p
}

func exists(fsys fs.FS, p string) bool {
	_, err := fs.Stat(fsys, rel(p))
	return err == nil
}
