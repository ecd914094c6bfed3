//go:build linux

package capability

import (
	"errors"
	"os"
	"os/exec"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// ProbeHost reads what this host offers the local runtime: cgroup layout and controllers,
// memory+swap accounting, seccomp, the Landlock ABI, user namespaces, nf_tables, veth, runsc
// and privileges. It only reads (files, read-only syscalls, one netlink dump of nf_tables
// tables) and takes a few milliseconds; see BenchmarkProbeHost.
func ProbeHost() HostProbe {
	var uts unix.Utsname
	release := ""
	if err := unix.Uname(&uts); err == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	h := probeFiles(os.DirFS("/"), release)
	h.UID = os.Geteuid()
	h.Root = h.UID == 0

	// prctl answers EINVAL without CONFIG_SECCOMP, whatever /proc says.
	if mode, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err == nil {
		h.Seccomp.Supported, h.Seccomp.Mode = true, mode
	} else if errors.Is(err, unix.EINVAL) {
		h.Seccomp.Supported, h.Seccomp.Filter = false, false
	}

	h.LandlockABI = landlockABI()

	for name, c := range h.Cgroup.Controllers {
		// access(2) also reports a read-only cgroupfs (EROFS), as inside most containers.
		if err := unix.Access(c.Dir, unix.W_OK); err != nil {
			c.Writable, c.WriteError = false, err.Error()
		} else {
			c.Writable, c.WriteError = true, ""
		}
		h.Cgroup.Controllers[name] = c
	}

	if h.CapNetAdmin {
		h.NFTables = nftablesByNetlink(h.NFTables)
	}

	if p, err := exec.LookPath("runsc"); err == nil {
		h.Runsc = p
	}
	for _, name := range []string{"docker", "podman", "nerdctl"} {
		if p, err := exec.LookPath(name); err == nil {
			h.DockerCLI = p
			break
		}
	}
	return h
}

// landlockABI asks the kernel for its Landlock ABI version (landlock_create_ruleset with
// LANDLOCK_CREATE_RULESET_VERSION); 0 when Landlock is not built in or not enabled.
func landlockABI() int {
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(abi)
}

// nftablesByNetlink asks the kernel directly with a read-only dump of nf_tables tables; the
// file evidence stands only when the kernel refuses to answer this process.
func nftablesByNetlink(fromFiles Feature) Feature {
	c, err := nftables.New()
	if err == nil {
		_, err = c.ListTables()
	}
	switch {
	case err == nil:
		return Feature{Available: true, Source: "netlink", Detail: "listed nf_tables tables"}
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return fromFiles
	default:
		return Feature{Source: "netlink", Detail: "listing nf_tables tables failed: " + err.Error()}
	}
}
