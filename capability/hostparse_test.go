package capability

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// Sample texts as the kernel writes them, one per host layout.
const (
	// A cgroup v1 host (this workplace's layout).
	mountinfoV1 = `22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/a,upperdir=/b,workdir=/c
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
`
	procCgroupV1 = `9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/459d
2:cpuacct:/
1:cpu:/
`
	// A pure cgroup2 host (systemd unified).
	mountinfoV2 = `25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	procCgroupV2 = "0::/user.slice/user-1000.slice/session-2.scope\n"
	// systemd's hybrid layout: v1 controllers plus a controller-less cgroup2 at unified/.
	mountinfoHybrid = `31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
`
	procCgroupHybrid = `5:pids:/user.slice/user-1000.slice/session-2.scope
4:memory:/user.slice/user-1000.slice/session-2.scope
3:cpu,cpuacct:/user.slice
1:name=systemd:/user.slice/user-1000.slice/session-2.scope
0::/user.slice/user-1000.slice/session-2.scope
`
	// Inside a docker container: the hierarchy's root is the container's cgroup, read-only.
	mountinfoContainer = `700 650 0:50 /docker/abc /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:20 - cgroup cgroup rw,memory
701 650 0:51 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:21 - cgroup cgroup rw,cpu,cpuacct
`
)

func TestParseCgroupMounts(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []CgroupMount
		wantErr string
	}{
		{name: "v1", in: mountinfoV1, want: []CgroupMount{
			{Version: 1, MountPoint: "/sys/fs/cgroup/cpu", Root: "/", Controllers: []string{"cpu"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/cpuacct", Root: "/", Controllers: []string{"cpuacct"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/memory", Root: "/", Controllers: []string{"memory"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/freezer", Root: "/", Controllers: []string{"freezer"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/pids", Root: "/", Controllers: []string{"pids"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/systemd", Root: "/", Name: "systemd"},
		}},
		{name: "v2", in: mountinfoV2, want: []CgroupMount{
			{Version: 2, MountPoint: "/sys/fs/cgroup", Root: "/"},
		}},
		{name: "hybrid", in: mountinfoHybrid, want: []CgroupMount{
			{Version: 2, MountPoint: "/sys/fs/cgroup/unified", Root: "/"},
			{Version: 1, MountPoint: "/sys/fs/cgroup/systemd", Root: "/", Name: "systemd"},
			{Version: 1, MountPoint: "/sys/fs/cgroup/cpu,cpuacct", Root: "/", Controllers: []string{"cpu", "cpuacct"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/memory", Root: "/", Controllers: []string{"memory"}},
			{Version: 1, MountPoint: "/sys/fs/cgroup/pids", Root: "/", Controllers: []string{"pids"}},
		}},
		{name: "container read-only with a non-root hierarchy root", in: mountinfoContainer, want: []CgroupMount{
			{Version: 1, MountPoint: "/sys/fs/cgroup/memory", Root: "/docker/abc", Controllers: []string{"memory"}, ReadOnly: true},
			{Version: 1, MountPoint: "/sys/fs/cgroup/cpu,cpuacct", Root: "/docker/abc", Controllers: []string{"cpu", "cpuacct"}, ReadOnly: true},
		}},
		{name: "escaped mount point", in: `40 31 0:37 / /mnt/my\040cgroups rw - cgroup2 none rw` + "\n", want: []CgroupMount{
			{Version: 2, MountPoint: "/mnt/my cgroups", Root: "/"},
		}},
		{name: "no cgroups", in: "22 1 0:21 / / rw - ext4 /dev/sda rw\n"},
		{name: "empty"},
		{name: "no separator", in: "31 23 0:28 / /sys/fs/cgroup rw,relatime tmpfs tmpfs rw\n", wantErr: "line 1: malformed"},
		{name: "truncated after separator", in: "31 23 0:28 / /sys/fs/cgroup rw - cgroup2\n", wantErr: "line 1: malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCgroupMounts(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseProcCgroups(t *testing.T) {
	in := "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t1\t1\nmemory\t0\t45\t0\n"
	got, err := ParseProcCgroups(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"cpu": true, "memory": false}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := ParseProcCgroups(strings.NewReader("cpu 1 1\n")); err == nil {
		t.Error("a 3-field line parsed without error")
	}
}

func TestParseKernelConfig(t *testing.T) {
	in := `#
# Automatically generated file; DO NOT EDIT.
CONFIG_VETH=y
CONFIG_NF_TABLES=m
# CONFIG_MODULES is not set
CONFIG_LSM="landlock,yama"
not a config line
`
	want := map[string]string{"CONFIG_VETH": "y", "CONFIG_NF_TABLES": "m", "CONFIG_MODULES": "n", "CONFIG_LSM": "landlock,yama"}
	got, err := ParseKernelConfig(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(in))
	zw.Close()
	got, err = ParseGzipKernelConfig(&gz)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("gzip: got %v, want %v", got, want)
	}
	if _, err := ParseGzipKernelConfig(strings.NewReader(in)); err == nil {
		t.Error("plain text parsed as gzip")
	}
}

func TestParseSwaps(t *testing.T) {
	header := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
	for _, tt := range []struct {
		in   string
		want bool
	}{
		{header, false},
		{header + "/swapfile                               file\t\t2097148\t\t0\t\t-2\n", true},
		{"", false},
	} {
		got, err := ParseSwaps(strings.NewReader(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("ParseSwaps(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseProcStatus(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procStatus
		wantErr bool
	}{
		{name: "root, unfiltered", in: "Name:\tx\nCapEff:\t000001fffeffffff\nSeccomp:\t0\nSeccomp_filters:\t0\n",
			want: procStatus{HasSeccomp: true, SeccompMode: 0, CapEff: 0x1fffeffffff}},
		{name: "filtered, no caps", in: "CapEff:\t0000000000000000\nSeccomp:\t2\n", want: procStatus{HasSeccomp: true, SeccompMode: 2}},
		{name: "kernel without seccomp", in: "CapEff:\t0000000000200000\n", want: procStatus{CapEff: 1 << capSysAdmin}},
		{name: "bad seccomp", in: "Seccomp:\tx\n", wantErr: true},
		{name: "bad capeff", in: "CapEff:\tzz\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseProcStatus(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestModuleInList(t *testing.T) {
	dep := "kernel/drivers/net/veth.ko.xz: \nkernel/net/netfilter/nf_tables.ko: kernel/net/netfilter/nfnetlink.ko\n"
	for _, tt := range []struct {
		name string
		want bool
	}{{"veth", true}, {"nf_tables", true}, {"nfnetlink", false}, {"eth", false}, {"tables", false}} {
		got, err := moduleInList(strings.NewReader(dep), tt.name)
		if err != nil || got != tt.want {
			t.Errorf("moduleInList(%q) = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
}

// TestParseKernelConfigWanted: only the wanted options are kept, and reading stops once each
// was seen (set or not set): the rest of /proc/config.gz is never decompressed.
func TestParseKernelConfigWanted(t *testing.T) {
	want := map[string]bool{"CONFIG_VETH": true, "CONFIG_NF_TABLES": true, "CONFIG_CFS_BANDWIDTH": true}
	head := "CONFIG_CFS_BANDWIDTH=y\nCONFIG_OTHER=y\n# CONFIG_NF_TABLES is not set\n"
	tests := []struct {
		name    string
		in      io.Reader
		want    map[string]string
		wantErr bool
	}{
		{"all seen, then an unreadable rest", io.MultiReader(strings.NewReader(head+"CONFIG_VETH=m\n"), iotest.ErrReader(errors.New("read past the end"))),
			map[string]string{"CONFIG_CFS_BANDWIDTH": "y", "CONFIG_NF_TABLES": "n", "CONFIG_VETH": "m"}, false},
		{"one never seen: read to the end", strings.NewReader(head + "CONFIG_LAST=y\n"),
			map[string]string{"CONFIG_CFS_BANDWIDTH": "y", "CONFIG_NF_TABLES": "n"}, false},
		{"one never seen, then an unreadable rest", io.MultiReader(strings.NewReader(head), iotest.ErrReader(errors.New("broken"))),
			nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKernelConfig(tt.in, want)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func BenchmarkReadKernelConfig(b *testing.B) {
	if _, err := os.Stat("/proc/config.gz"); err != nil {
		b.Skip("no /proc/config.gz")
	}
	fsys := os.DirFS("/")
	for b.Loop() {
		readKernelConfig(fsys, "")
	}
}
