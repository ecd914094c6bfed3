package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/platform/setting"
)

// TestParse: the front serves exactly the runs it can do itself (spares on, no network, the
// host image or a directory, code from -c or a FILE) and reads them as the full CLI would;
// everything else goes to the full CLI unread.
func TestParse(t *testing.T) {
	t.Setenv("AIRLOCK_SPARES", "")
	os.Unsetenv("AIRLOCK_SPARES")
	t.Setenv(setting.EnvPlatform, "")
	t.Setenv(setting.EnvConfig, "")
	if _, err := os.Stat(setting.DefaultConfigFile); err == nil {
		t.Skipf("%s exists here: every run is the full CLI's", setting.DefaultConfigFile)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "s.py")
	if err := os.WriteFile(script, []byte("print(1)"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		serve bool
		json  bool
		image string // the image key, when served
	}{
		{args: []string{"run", "-c", "print(1)"}, serve: true, image: "host"},
		{args: []string{"run", "-c", "print(1)", "--state-dir", dir}, serve: true, image: "host"},
		{args: []string{"-o", "json", "run", "-c", "1"}, serve: true, json: true, image: "host"},
		{args: []string{"--output=json", "run", "-c", "1"}, serve: true, json: true, image: "host"},
		{args: []string{"run", "-ojson", "-c", "1"}, serve: true, json: true, image: "host"},
		{args: []string{"run", "--image", dir, "-c", "1"}, serve: true, image: "dir:" + dir},
		{args: []string{"run", "--image", "./rootfs", "-c", "1"}, serve: true, image: "dir:" + filepath.Join(mustGetwd(t), "rootfs")},
		{args: []string{"run", script}, serve: true, image: "host"},
		{args: []string{"run", "--lang", "bash", "-c", "echo", "--timeout", "5s", "-i", "--file", script}, serve: true, image: "host"},
		{args: []string{"run", "--spares", "2", "-c", "1"}, serve: true, image: "host"},
		{args: []string{"run", "--platform", "local", "-c", "1"}, serve: true, image: "host"},
		{args: []string{"run", "--platform=auto", "-c", "1"}, serve: true, image: "host"},
		// The full CLI's:
		{args: []string{"run", "--spares", "0", "-c", "1"}},
		{args: []string{"run", "--platform", "docker", "-c", "1"}},
		{args: []string{"run", "--platform=kubernetes", "-c", "1"}},
		{args: []string{"run", "--platform", "bogus", "-c", "1"}},
		{args: []string{"run", "--network", "-c", "1"}},
		{args: []string{"run", "-n", "-c", "1"}},
		{args: []string{"run", "--image", "oci:" + dir, "-c", "1"}},
		{args: []string{"run", "--image", "python:3.12", "-c", "1"}},
		{args: []string{"run", "--image", dir + "/x.tar", "-c", "1"}},
		{args: []string{"run", "-"}},
		{args: []string{"run", "--help"}},
		{args: []string{"run", "-h"}},
		{args: []string{"run", "--bogus", "-c", "1"}},
		{args: []string{"run", "-c", "1", "extra"}},
		{args: []string{"run", script, "extra"}},
		{args: []string{"run", "--spares", "9", "-c", "1"}},
		{args: []string{"run", "--max-output", "0", "-c", "1"}},
		{args: []string{"-o", "yaml", "run", "-c", "1"}},
		{args: []string{"--state-dir", dir, "run", "-c", "1"}}, // not a root flag: cobra refuses it
		{args: []string{"sandbox", "list"}},
		{args: []string{"help", "run"}},
		{args: []string{"--help"}},
		{args: []string{}},
	} {
		inv, ok := parse(tc.args)
		if ok {
			_, _, err := inv.flags.Request(inv.args, strings.NewReader(""))
			ok = err == nil // run hands a request the full CLI refuses to it, unread
		}
		if ok != tc.serve {
			t.Errorf("%q: served %v, want %v", tc.args, ok, tc.serve)
			continue
		}
		if ok && (inv.json != tc.json || inv.image.Key != tc.image) {
			t.Errorf("%q: json %v image %q, want %v %q", tc.args, inv.json, inv.image.Key, tc.json, tc.image)
		}
	}
	t.Setenv("AIRLOCK_SPARES", "0")
	if _, ok := parse([]string{"run", "-c", "1"}); ok {
		t.Error("served a run with AIRLOCK_SPARES=0")
	}
}

// TestParsePlatformSettings: the environment and a config file can name another platform than
// the local runtime, whose runs are the full CLI's; --platform wins over the environment.
func TestParsePlatformSettings(t *testing.T) {
	if _, err := os.Stat(setting.DefaultConfigFile); err == nil {
		t.Skipf("%s exists here: every run is the full CLI's", setting.DefaultConfigFile)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("platform: local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env, config string
		args        []string
		serve       bool
	}{
		{"", "", []string{"run", "-c", "1"}, true},
		{"local", "", []string{"run", "-c", "1"}, true},
		{"auto", "", []string{"run", "-c", "1"}, true},
		{"docker", "", []string{"run", "-c", "1"}, false},
		{"kubernetes", "", []string{"run", "-c", "1"}, false},
		{"docker", "", []string{"run", "--platform", "local", "-c", "1"}, true},
		{"local", "", []string{"run", "--platform", "docker", "-c", "1"}, false},
		{"", cfg, []string{"run", "-c", "1"}, false},
		{"", cfg, []string{"run", "--platform", "local", "-c", "1"}, false},
	} {
		t.Setenv(setting.EnvPlatform, tc.env)
		t.Setenv(setting.EnvConfig, tc.config)
		if _, ok := parse(tc.args); ok != tc.serve {
			t.Errorf("AIRLOCK_PLATFORM=%q AIRLOCK_CONFIG=%q %q: served %v, want %v", tc.env, tc.config, tc.args, ok, tc.serve)
		}
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// TestFullArgv: the spares the front claimed and could not use go to the full CLI as flags of
// run, wherever run is and whatever follows it.
func TestFullArgv(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		runAt     int
		discarded []string
		want      string
	}{
		{[]string{"run", "-c", "1"}, 0, nil, "F run -c 1"},
		{[]string{"run", "-c", "1"}, 0, []string{"s-1"}, "F run --spare-discarded s-1 -c 1"},
		{[]string{"-o", "json", "run", "x.py", "--", "a"}, 2, []string{"s-1", "s-2"}, "F -o json run --spare-discarded s-1 --spare-discarded s-2 x.py -- a"},
		{[]string{"sandbox", "list"}, -1, []string{"s-1"}, "F sandbox list"},
	} {
		if got := strings.Join(fullArgv("F", tc.args, tc.runAt, tc.discarded), " "); got != tc.want {
			t.Errorf("%q %d %v: %q, want %q", tc.args, tc.runAt, tc.discarded, got, tc.want)
		}
	}
}

// TestHandsOver: whatever the front does not serve, the full CLI gets with the same argv (a
// stand-in that prints its arguments), as the same process.
func TestHandsOver(t *testing.T) {
	if os.Getenv("AIRLOCK_FRONT_TEST_MAIN") == "1" {
		main()
	}
	dir := t.TempDir()
	full := filepath.Join(dir, "airlock-full")
	if err := os.WriteFile(full, []byte("#!/bin/sh\necho \"pid $$ args $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"sandbox", "list"}, {"run", "--network", "-c", "1"}, {"--help"}} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHandsOver$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), "AIRLOCK_FRONT_TEST_MAIN=1", envFull+"="+full)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		want := "args -test.run=^TestHandsOver$ -- " + strings.Join(args, " ") + "\n"
		if !strings.HasSuffix(string(out), want) || !strings.HasPrefix(string(out), "pid ") {
			t.Errorf("%q: the full CLI printed %q, want ...%q", args, out, want)
		}
		if pid := strings.Fields(string(out))[1]; pid != strconv.Itoa(cmd.Process.Pid) {
			t.Errorf("%q: the full CLI ran as pid %s, want the front's own %d", args, pid, cmd.Process.Pid)
		}
	}
}

// TestLeanDependencies keeps the front off the libraries it exists to avoid (DESIGN.md,
// "Start-up is on the hot path"): every airlock run pays their package inits.
func TestLeanDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	forbiddenExact := map[string]bool{}
	for _, p := range []string{"sandbox", "spec", "capability", "plan", "runcode", "backend/local", "backend/local/nsinit", "image", "egress", "agent", "internal/cli"} {
		forbiddenExact["github.com/airlock-sandbox/airlock/"+p] = true
	}
	forbidden := []string{"k8s.io/", "sigs.k8s.io/", "gopkg.in/yaml", "go.yaml.in/", "github.com/spf13/cobra",
		"github.com/containerd/", "github.com/google/", "github.com/elastic/", "github.com/landlock-lsm/",
		"github.com/mdlayher/", "github.com/vishvananda/", "github.com/opencontainers/", "github.com/moby/",
		"github.com/fxamacker/", "google.golang.org/", "github.com/modelcontextprotocol/"}
	for _, pkg := range strings.Fields(string(out)) {
		if forbiddenExact[pkg] {
			t.Errorf("the front links %s", pkg)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("the front links %s", pkg)
			}
		}
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
