package local

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
)

// The published set is one: the host's facts (capability.ProbeHost().Set(): namespaces,
// seccomp, cgroup controllers, cpu quota, swap accounting, tmpfs, veth and nftables, runsc)
// joined with what this backend enforces (probeCapabilities). A capability holds only when
// both say so; the host's reason wins when both refuse, since it is the one to act on.

// reasonGVisorRootless is why a rootless backend does not run gVisor (rootless.go).
const reasonGVisorRootless = "runsc is driven as root only; this runtime is rootless"

// runscOffPath is the probe's refusal when runsc is not on PATH: Options.RunscPath may name
// one elsewhere, which the backend has checked itself.
const runscOffPath = "runsc not found on PATH"

// combineCapabilities is the published set: host facts and backend enforcement together.
// runscOption is Options.RunscPath.
func combineCapabilities(host, backend capability.Set, runscOption string) capability.Set {
	out := capability.Set{Platform: capability.Local, Entries: make(map[capability.Name]capability.Status, len(capability.Names))}
	for _, n := range capability.Names {
		h, okH := host.Entries[n]
		b, okB := backend.Entries[n]
		if !okB {
			b = capability.Status{Reason: "not implemented by the local backend"}
		}
		if !okH {
			h = capability.Status{Reason: "the host probe does not know it"}
		}
		switch {
		case h.Supported && b.Supported:
			out.Entries[n] = capability.Status{Supported: true}
		case !h.Supported && !(n == capability.GVisor && h.Reason == runscOffPath && runscOption != ""):
			out.Entries[n] = h
		case !b.Supported:
			out.Entries[n] = b
		default:
			out.Entries[n] = capability.Status{Supported: true}
		}
	}
	out.Bounds = backend.Bounds
	out.Notes = backend.Notes
	if m := host.Bounds.MaxProcesses; m > 0 && (out.Bounds.MaxProcesses == 0 || m < out.Bounds.MaxProcesses) {
		out.Bounds.MaxProcesses = m
	}
	return out
}

// capabilitySet starts probing in the background and returns the published set once it is
// known: a process that never asks (terminate, list) never waits for it.
func (b *Backend) capabilitySet() func() capability.Set {
	probed := make(chan capability.Set, 1)
	stateDir, cg, runsc, rl := b.opts.StateDir, b.cg, b.opts.RunscPath, b.rootless
	key := currentHostKey()
	key.CgroupVersion, key.RunscOption = cg.version(), runsc
	maxAge := hostProbeTTL
	if b.opts.OneShot {
		maxAge = oneShotProbeMaxAge
	}
	go func() {
		probed <- cachedHostSet(stateDir, time.Now(), key, maxAge, func() capability.Set {
			// The two probes are independent: side by side.
			host := make(chan capability.Set, 1)
			go func() {
				p := capability.ProbeHost()
				if rl != nil {
					// Rootless (rootless.go): sandboxes' cgroups go under the parent
					// root delegated to this user, which New found writable; the
					// probe looked at this process's own cgroup.
					for name, c := range p.Cgroup.Controllers {
						c.Dir, c.Writable, c.WriteError = filepath.Join(cgroupRoot, name, b.opts.CgroupParent), true, ""
						if cg.version() == 2 {
							c.Dir = filepath.Join(cgroupRoot, b.opts.CgroupParent)
						}
						p.Cgroup.Controllers[name] = c
					}
					if cg.version() == 2 {
						// v2: only what is enabled in the delegated subtree, judged
						// at the parent New made (probeDelegationV2).
						parent := filepath.Join(cgroupRoot, b.opts.CgroupParent)
						have, _ := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
						for name := range p.Cgroup.Controllers {
							if !slices.Contains(strings.Fields(string(have)), name) {
								delete(p.Cgroup.Controllers, name)
							}
						}
						p.Cgroup.CPUQuota = fileExists(filepath.Join(parent, "cpu.max"))
						p.Cgroup.MemorySwap = fileExists(filepath.Join(parent, "memory.swap.max"))
						p.Cgroup.Freezer = fileExists(filepath.Join(parent, "cgroup.freeze"))
					}
				}
				host <- p.Set()
			}()
			backend := probeCapabilities(cg, runsc)
			set := combineCapabilities(<-host, backend, runsc)
			if rl != nil && set.Entries[capability.GVisor].Supported {
				set.Entries[capability.GVisor] = capability.Status{Reason: reasonGVisorRootless}
			}
			return set
		})
	}()
	return sync.OnceValue(func() capability.Set { return <-probed })
}

// Probing costs milliseconds: the host probe reads and decompresses /proc/config.gz, lists
// nf_tables tables over netlink and searches PATH (1.5-3 ms here), the backend's own asks the
// egress gateway's requirements (~2 ms). A one-shot process (airlock run) would pay that on
// every call before it can plan, so the published set is kept in the state dir for
// hostProbeTTL and reused by processes of the same user, boot, PATH, cgroup version and runsc
// option. A fact that changes within that window shows late: one gained (runsc installed, a
// module loaded) is refused a little longer, one lost fails at create (the backend cannot make a
// sandbox without the mechanism), never silently. A one-shot process followed by one that
// probes anew past hostProbeTTL (Options.OneShot: airlock run and its filler) takes a probe up
// to oneShotProbeMaxAge old: a run after a pause of minutes does not probe (~10 ms of a one-shot
// run here), its filler does, and a changed fact shows one run later.
const (
	hostProbeFile      = "host-probe.json"
	hostProbeTTL       = 30 * time.Second
	oneShotProbeMaxAge = 10 * time.Minute
)

// hostKey is what a cached probe must have been made under.
type hostKey struct {
	BootID        string `json:"bootId"`
	UID           int    `json:"uid"`
	Path          string `json:"path"`
	CgroupVersion int    `json:"cgroupVersion"`
	RunscOption   string `json:"runscOption"`
}

func currentHostKey() hostKey {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return hostKey{BootID: strings.TrimSpace(string(boot)), UID: os.Geteuid(), Path: os.Getenv("PATH")}
}

type cachedProbe struct {
	Key   hostKey        `json:"key"`
	At    time.Time      `json:"at"`
	Set   capability.Set `json:"set"`
	Owner string         `json:"owner"` // the format: a later one ignores an older file
}

const cachedProbeFormat = "airlock-capabilities-1"

// cachedHostSet returns the probed set, from the state dir when one made under key at most
// maxAge ago is there, else probed now and written back.
func cachedHostSet(stateDir string, now time.Time, key hostKey, maxAge time.Duration, probe func() capability.Set) capability.Set {
	p := filepath.Join(stateDir, hostProbeFile)
	if b, err := os.ReadFile(p); err == nil && key.BootID != "" {
		var c cachedProbe
		if json.Unmarshal(b, &c) == nil && c.Owner == cachedProbeFormat && c.Key == key &&
			!c.At.After(now) && now.Sub(c.At) < maxAge && len(c.Set.Entries) > 0 {
			return c.Set
		}
	}
	set := probe()
	if key.BootID == "" {
		return set
	}
	if b, err := json.Marshal(cachedProbe{Key: key, At: now, Set: set, Owner: cachedProbeFormat}); err == nil {
		tmp := p + "." + strconv.Itoa(os.Getpid()) + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil || os.Rename(tmp, p) != nil {
			_ = os.Remove(tmp)
		}
	}
	return set
}
