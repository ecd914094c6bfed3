// Command selftest checks, inside hack/v2vm's guest, what the local runtime's cgroup v2 tests rely on.
//
//	go build -o /var/cache/airlock-v2vm/selftest ./hack/v2vm/selftest
//	hack/v2vm/run /var/cache/airlock-v2vm/selftest
//
// It exits 1 when a check fails, so a broken VM shows as a harness failure, not as the runtime's.
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

type check struct {
	name string
	run  func() error
}

func main() {
	checks := []check{
		{"cgroup2 at /sys/fs/cgroup", cgroup2Mounted},
		{"cpu memory pids in the root's controllers and subtree_control", controllersEnabled},
		{"this process in a leaf cgroup below the root", inLeaf},
		{"a child cgroup with memory.max and pids.max", childCgroup},
		{"a user namespace mapping root", userNamespace},
		{"python3 from the shared root", python},
		{"overlayfs over a read-only bind of the shared /usr", overlayOnShared},
	}
	failed := 0
	for _, c := range checks {
		if err := c.run(); err != nil {
			failed++
			fmt.Printf("FAIL %s: %v\n", c.name, err)
			continue
		}
		fmt.Printf("ok   %s\n", c.name)
	}
	fmt.Printf("%d passed, %d failed\n", len(checks)-failed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}

const cgRoot = "/sys/fs/cgroup"

func cgroup2Mounted() error {
	var st unix.Statfs_t
	if err := unix.Statfs(cgRoot, &st); err != nil {
		return err
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("statfs type %#x, want cgroup2 %#x", st.Type, unix.CGROUP2_SUPER_MAGIC)
	}
	return nil
}

func controllersEnabled() error {
	for _, f := range []string{"cgroup.controllers", "cgroup.subtree_control"} {
		b, err := os.ReadFile(filepath.Join(cgRoot, f))
		if err != nil {
			return err
		}
		have := strings.Fields(string(b))
		for _, want := range []string{"cpu", "memory", "pids"} {
			if !slices.Contains(have, want) {
				return fmt.Errorf("%s is %q: no %s", f, have, want)
			}
		}
	}
	return nil
}

// ownCgroup is this process's cgroup v2 path ("0::/x" in /proc/self/cgroup).
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("/proc/self/cgroup has no v2 line: %q (v1 hierarchies still bound?)", b)
}

func inLeaf() error {
	p, err := ownCgroup()
	if err != nil {
		return err
	}
	if p == "/" && os.Getenv("V2VM_CGROUP") != "/" {
		return fmt.Errorf("in the root cgroup")
	}
	return nil
}

func childCgroup() error {
	own, err := ownCgroup()
	if err != nil {
		return err
	}
	// A sibling of this process's leaf: the parent has the controllers enabled.
	dir := filepath.Join(cgRoot, filepath.Dir(own), fmt.Sprintf("v2vm-selftest-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	defer os.Remove(dir)
	for f, v := range map[string]string{"memory.max": "67108864", "pids.max": "10", "cpu.max": "50000 100000"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func userNamespace() error {
	cmd := exec.Command("/bin/sh", "-c", "id -u; cat /proc/self/uid_map")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		Credential:  &syscall.Credential{Uid: 0, Gid: 0}, // else the unmapped host root shows as 65534
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	if !bytes.HasPrefix(out, []byte("0\n")) {
		return fmt.Errorf("id -u in the namespace: %q", out)
	}
	return nil
}

func python() error {
	out, err := exec.Command("python3", "-c", "print(6*7)").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		return fmt.Errorf("python3: %v: %q", err, out)
	}
	return nil
}

// overlayOnShared mounts what a runtime would: a tmpfs upper over a read-only bind of /usr.
func overlayOnShared() error {
	dir, err := os.MkdirTemp("", "v2vm-ovl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lower, upper, work, merged := filepath.Join(dir, "l"), filepath.Join(dir, "u"), filepath.Join(dir, "w"), filepath.Join(dir, "m")
	for _, d := range []string{lower, upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("/usr", lower, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind /usr: %w", err)
	}
	defer unix.Unmount(lower, unix.MNT_DETACH)
	if err := unix.Mount("", lower, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("remount /usr bind read-only: %w", err)
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("overlay %s: %w", opts, err)
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	out, err := exec.Command(filepath.Join(merged, "bin", "python3"), "-c", "print('ovl')").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ovl" {
		return fmt.Errorf("python3 from the overlay: %v: %q", err, out)
	}
	if err := os.WriteFile(filepath.Join(merged, "v2vm-selftest"), []byte("x"), 0o644); err != nil {
		return fmt.Errorf("write through the overlay: %w", err)
	}
	if _, err := os.Stat(filepath.Join(upper, "v2vm-selftest")); err != nil {
		return fmt.Errorf("write did not land in the upper dir: %w", err)
	}
	return nil
}
