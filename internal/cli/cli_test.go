package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/platform"
)

func TestCheckLoopback(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8765", true},
		{"127.0.0.1:0", true},
		{"127.1.2.3:80", true},
		{"[::1]:8765", true},
		{"localhost:8765", true},
		{"0.0.0.0:8765", false},
		{":8765", false},
		{"[::]:8765", false},
		{"192.168.1.10:8765", false},
		{"example.com:80", false},
		{"127.0.0.1", false},
	} {
		err := CheckLoopback(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
	}
}

func TestParseImage(t *testing.T) {
	wd, _ := os.Getwd()
	tests := []struct {
		in, want string // want: the image's String(), or "error"
	}{
		{"host", "host"},
		{"./rootfs", "dir=" + filepath.Join(wd, "rootfs")},
		{"/srv/rootfs", "dir=/srv/rootfs"},
		{"oci:./layout", "ociLayout=" + filepath.Join(wd, "layout")},
		{"img.tar", "tarball=" + filepath.Join(wd, "img.tar")},
		{"python:3.12", "ref=python:3.12"},
		{"", "error"},
		{"oci:", "error"},
	}
	for _, tt := range tests {
		img, err := ParseImage(tt.in)
		got := "error"
		if err == nil {
			got = img.String()
		}
		if got != tt.want {
			t.Errorf("ParseImage(%q) = %q (%v), want %q", tt.in, got, err, tt.want)
		}
	}
}

// The flags' platform settings: --state-dir follows the runtime on this machine, the local
// runtime's own flags are refused elsewhere, and a bad setting is a usage error.
func TestBackendFlagsConfig(t *testing.T) {
	t.Setenv(platform.EnvConfig, writeFile(t, "config.yaml", "docker:\n  stateDir: /run/from-config\n"))
	t.Setenv(platform.EnvPlatform, "")
	for _, tc := range []struct {
		args      []string
		env       string
		platform  string
		dockerDir string
		usage     string
	}{
		{args: nil, platform: platform.Auto, dockerDir: "/run/from-config"},
		{args: []string{"--platform", "docker"}, platform: "docker", dockerDir: "/run/from-config"},
		{args: []string{"--platform", "docker", "--state-dir", "/run/d"}, platform: "docker", dockerDir: "/run/d"},
		{args: []string{"--state-dir", "/run/d"}, env: "docker", platform: "docker", dockerDir: "/run/d"},
		{args: []string{"--platform", "docker", "--cgroup-parent", "x"}, usage: "--cgroup-parent is the local runtime's; the platform is docker (from --platform)"},
		{args: []string{"--platform", "kubernetes", "--state-dir", "/run/d"}, usage: "--state-dir is the local runtime's; the platform is kubernetes (from --platform)"},
		{args: nil, env: "lambda", usage: `platform "lambda" (from $AIRLOCK_PLATFORM)`},
	} {
		t.Setenv(platform.EnvPlatform, tc.env)
		var b BackendFlags
		cmd := &cobra.Command{Use: "x"}
		b.Add(cmd)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		c, err := b.Config(io.Discard, nil)
		if tc.usage != "" {
			var ee *ExitError
			if !errors.As(err, &ee) || ee.Code != ExitUsage || !strings.Contains(err.Error(), tc.usage) {
				t.Errorf("%q $AIRLOCK_PLATFORM=%q: err %v; want a usage error saying %q", tc.args, tc.env, err, tc.usage)
			}
			continue
		}
		if err != nil || c.Platform != tc.platform || c.Docker.StateDir != tc.dockerDir {
			t.Errorf("%q $AIRLOCK_PLATFORM=%q: %+v, %v; want platform %s, docker state dir %s", tc.args, tc.env, c, err, tc.platform, tc.dockerDir)
		}
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
