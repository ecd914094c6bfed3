package local

import (
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	// Fields after the command name: state(3) ppid ... flags(9) ... starttime(22).
	stat := func(state, flags string) string {
		return " " + state + " 1 2 3 4 5 " + flags + " 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21\n"
	}
	rest := stat("S", "4194560")
	cases := []struct {
		name, line string
		want       procStat
		ok         bool
	}{
		{"plain", "123 (sleep)" + rest, procStat{state: 'S', start: 424242}, true},
		{"spaces and parens in comm", "123 (a) b (c d))" + rest, procStat{state: 'S', start: 424242}, true},
		{"running", "123 (x)" + stat("R", "4194304"), procStat{state: 'R', start: 424242}, true},
		{"zombie", "123 (x)" + stat("Z", "4227084"), procStat{state: 'Z', start: 424242, exiting: true}, true},
		{"dead", "123 (x)" + stat("X", "4227084"), procStat{state: 'X', start: 424242, exiting: true}, true},
		{"tearing down (PF_EXITING)", "123 (x)" + stat("D", "4194308"), procStat{state: 'D', start: 424242, exiting: true}, true},
		{"no comm", "123 sleep S 1 2", procStat{}, false},
		{"short", "123 (x) S 1 2 3", procStat{}, false},
		{"not a number", "123 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 notanumber", procStat{}, false},
		{"flags not a number", "123 (x)" + stat("S", "x"), procStat{}, false},
	}
	for _, c := range cases {
		got, err := parseStat(strings.NewReader(c.line))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v ok=%v", c.name, got, err, c.want, c.ok)
		}
	}
}

func TestParseCgroupFile(t *testing.T) {
	v1 := `12:pids:/user.slice
11:cpu,cpuacct:/a/b
10:freezer:/
9:memory:/process_api/x
1:name=systemd:/init.scope
0::/
`
	got, err := parseCgroupFile(strings.NewReader(v1))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"pids": "/user.slice", "cpu": "/a/b", "cpuacct": "/a/b", "freezer": "/", "memory": "/process_api/x"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// A host without one of the controllers this runtime needs is refused.
	if _, err := parseCgroupFile(strings.NewReader("0::/\n")); err == nil {
		t.Error("a v2-only cgroup file was accepted for the v1 driver")
	}
}

func TestSessionIDs(t *testing.T) {
	id, err := newSessionID()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSessionID(id); err != nil {
		t.Errorf("fresh id %q refused: %v", id, err)
	}
	for _, bad := range []string{"", "s-", "s-0123", "s-0123456789abcdeg", "../s-0123456789abcdef", "s-0123456789abcdef/..", "S-0123456789ABCDEF"} {
		if checkSessionID(bad) == nil {
			t.Errorf("session id %q accepted", bad)
		}
	}
}

func TestCgroupParentPerStateDir(t *testing.T) {
	if got := CgroupParentFor(DefaultStateDir); got != "airlock" {
		t.Errorf("default state dir parent = %q", got)
	}
	a, b := CgroupParentFor("/tmp/a"), CgroupParentFor("/tmp/b")
	if a == b || !strings.HasPrefix(a, "airlock-") {
		t.Errorf("parents %q and %q must differ and be prefixed", a, b)
	}
}

func TestMountPoints(t *testing.T) {
	mi := `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
90 27 0:4 net:[4026532] /run/airlock/s-0123456789abcdef/runsc/null-netns rw - nsfs nsfs rw
91 27 0:50 / /tmp/with\040space rw - tmpfs tmpfs rw
`
	got, err := mountPoints(strings.NewReader(mi))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/proc", "/", "/run/airlock/s-0123456789abcdef/runsc/null-netns", "/tmp/with space"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
}
