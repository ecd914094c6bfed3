//go:build linux

package capability

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/google/nftables"
	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestProbeHostGroundTruth checks ProbeHost on this machine against evidence gathered another
// way: statfs of the cgroup mounts, really creating a cgroup, a user namespace, a veth pair and
// an nf_tables table in throwaway namespaces, and the landlock and seccomp libraries.
func TestProbeHostGroundTruth(t *testing.T) {
	testutil.RequireRoot(t)
	h := ProbeHost()
	if len(h.Problems) > 0 {
		t.Errorf("probe problems on this host: %q", h.Problems)
	}
	if h.Root != (os.Geteuid() == 0) || h.UID != os.Geteuid() {
		t.Errorf("Root = %v, UID = %d; euid is %d", h.Root, h.UID, os.Geteuid())
	}

	// cgroup layout from statfs of the mount points.
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil {
		t.Fatal(err)
	}
	isV2 := fs.Type == unix.CGROUP2_SUPER_MAGIC
	unified := unix.Statfs("/sys/fs/cgroup/unified", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC
	present := map[string]bool{}
	for _, c := range []string{"cpu", "memory", "pids", "freezer"} {
		if isV2 {
			b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
			if err != nil {
				t.Fatal(err)
			}
			present[c] = strings.Contains(" "+strings.TrimSpace(string(b))+" ", " "+c+" ")
		} else {
			present[c] = unix.Statfs("/sys/fs/cgroup/"+c, &fs) == nil && fs.Type == unix.CGROUP_SUPER_MAGIC
		}
	}
	wantVersion := "v1"
	switch {
	case isV2:
		wantVersion = "v2"
	case unified:
		wantVersion = "hybrid"
	}
	if h.Cgroup.Version != wantVersion {
		t.Errorf("cgroup version = %q, statfs says %q", h.Cgroup.Version, wantVersion)
	}
	for c, want := range present {
		if _, got := h.Cgroup.Controllers[c]; got != want && c != "freezer" {
			t.Errorf("controller %s probed %v, mounted per statfs %v", c, got, want)
		}
	}
	if !isV2 {
		_, err := os.Stat("/sys/fs/cgroup/freezer")
		if h.Cgroup.Freezer != (err == nil && present["freezer"]) {
			t.Errorf("Freezer = %v, freezer hierarchy present = %v", h.Cgroup.Freezer, present["freezer"])
		}
		if mem, ok := h.Cgroup.Controllers["memory"]; ok {
			_, err := os.Stat(filepath.Join(mem.Dir, "memory.memsw.limit_in_bytes"))
			if h.Cgroup.MemorySwap != (err == nil) {
				t.Errorf("MemorySwap = %v, memsw file present = %v", h.Cgroup.MemorySwap, err == nil)
			}
		}
	}
	// Writable means a cgroup can really be made there.
	for _, c := range []string{"cpu", "memory", "pids"} {
		ctl, ok := h.Cgroup.Controllers[c]
		if !ok {
			continue
		}
		dir := filepath.Join(ctl.Dir, fmt.Sprintf("airlock-probe-test-%d", os.Getpid()))
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			if rerr := os.Remove(dir); rerr != nil {
				t.Errorf("cleanup %s: %v", dir, rerr)
			}
		}
		if ctl.Writable != (err == nil) {
			t.Errorf("%s Writable = %v, mkdir in %s: %v", c, ctl.Writable, ctl.Dir, err)
		}
	}

	if got, want := h.Seccomp.Supported, seccomp.Supported(); got != want {
		t.Errorf("Seccomp.Supported = %v, the seccomp syscall answers %v", got, want)
	}
	if h.Seccomp.Filter && !h.Seccomp.Supported {
		t.Error("seccomp filter mode without seccomp")
	}
	abi, err := llsyscall.LandlockGetABIVersion()
	if err != nil {
		abi = 0
	}
	if h.LandlockABI != abi {
		t.Errorf("LandlockABI = %d, go-landlock says %d (%v)", h.LandlockABI, abi, err)
	}

	// A user namespace can be made iff the probe says so (as root: iff max > 0).
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	userErr := cmd.Run()
	if (h.UserNS.Max > 0) != (userErr == nil) {
		t.Errorf("UserNS.Max = %d, but creating a user namespace: %v", h.UserNS.Max, userErr)
	}

	vethErr, nftErr := inThrowawayNetns(t)
	if h.Veth.Available != (vethErr == nil) {
		t.Errorf("Veth = %+v, creating a veth pair: %v", h.Veth, vethErr)
	}
	if h.NFTables.Available != (nftErr == nil) {
		t.Errorf("NFTables = %+v, creating a table: %v", h.NFTables, nftErr)
	}

	runsc := ""
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if fi, err := os.Stat(filepath.Join(dir, "runsc")); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			runsc = filepath.Join(dir, "runsc")
			break
		}
	}
	if (h.Runsc != "") != (runsc != "") {
		t.Errorf("Runsc = %q, PATH walk found %q", h.Runsc, runsc)
	}

	// The set follows from the same ground truth.
	s := h.Set()
	wantLimits := present["cpu"] && present["memory"] && h.Cgroup.Controllers["cpu"].Writable &&
		h.Cgroup.Controllers["memory"].Writable && h.Cgroup.CPUQuota && (!h.SwapOn || h.Cgroup.MemorySwap) && userErr == nil
	if s.Has(EnforcedLimits) != wantLimits {
		t.Errorf("enforcedLimits = %+v, want %v", s.Entries[EnforcedLimits], wantLimits)
	}
	if st := s.Entries[GVisor]; st.Supported != (runsc != "") || runsc == "" && !strings.Contains(st.Reason, "not found on PATH") {
		t.Errorf("gvisor = %+v, runsc on PATH %q", s.Entries[GVisor], runsc)
	}
	if s.Has(EgressDeny) != (userErr == nil && h.Seccomp.Filter) {
		t.Errorf("egressDeny = %+v", s.Entries[EgressDeny])
	}
}

// inThrowawayNetns creates a veth pair and an nf_tables table in a network namespace that is
// gone when it returns.
func inThrowawayNetns(t *testing.T) (vethErr, nftErr error) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		// The thread is left locked: it exits with the goroutine, so no other goroutine ever
		// runs in a namespace this test switched.
		orig, err := netns.Get()
		if err != nil {
			vethErr, nftErr = err, err
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			vethErr, nftErr = err, err
			return
		}
		defer ns.Close()
		defer func() {
			if err := netns.Set(orig); err != nil {
				t.Errorf("restore netns: %v", err)
			}
		}()

		nh, err := netlink.NewHandleAt(ns)
		if err != nil {
			vethErr = err
		} else {
			vethErr = nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "aptest0"}, PeerName: "aptest1"})
			nh.Close()
		}

		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			nftErr = err
			return
		}
		c.AddTable(&nftables.Table{Name: "airlock_probe_test", Family: nftables.TableFamilyINet})
		nftErr = c.Flush()
	}()
	<-done
	if vethErr != nil && errors.Is(vethErr, unix.EPERM) {
		t.Fatalf("no permission to test veth: %v", vethErr)
	}
	return vethErr, nftErr
}

func BenchmarkProbeHost(b *testing.B) {
	for b.Loop() {
		ProbeHost()
	}
}
