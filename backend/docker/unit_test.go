package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// fakeCLIs puts scripts named after CLIs in a fresh directory and makes it the whole PATH.
// Each script answers `info` with the given exit status and logs its calls to <name>.log.
func fakeCLIs(t *testing.T, status map[string]int) string {
	t.Helper()
	dir := t.TempDir()
	for name, code := range status {
		script := "#!/bin/sh\necho \"$@\" >> \"" + filepath.Join(dir, name+".log") + "\"\n" +
			"if [ \"$1\" = info ]; then echo '" + name + " engine down' >&2; exit " + strconv.Itoa(code) + "; fi\nexit 0\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	return dir
}

func TestDetectOrder(t *testing.T) {
	noSocket := "unix://" + filepath.Join(t.TempDir(), "absent.sock")
	tests := []struct {
		name   string
		clis   map[string]int // name -> exit status of `info`
		choice string
		want   string
	}{
		{"docker first", map[string]int{"docker": 0, "podman": 0, "nerdctl": 0}, EngineAuto, "docker"},
		{"podman when docker's engine is down", map[string]int{"docker": 1, "podman": 0, "nerdctl": 0}, EngineAuto, "podman"},
		{"podman when docker is absent", map[string]int{"podman": 0, "nerdctl": 0}, EngineAuto, "podman"},
		{"nerdctl last", map[string]int{"docker": 1, "podman": 1, "nerdctl": 0}, EngineAuto, "nerdctl"},
		{"nerdctl alone", map[string]int{"nerdctl": 0}, EngineAuto, "nerdctl"},
		{"chosen podman skips docker", map[string]int{"docker": 0, "podman": 0}, EnginePodman, "podman"},
		{"chosen nerdctl", map[string]int{"docker": 0, "nerdctl": 0}, EngineNerdctl, "nerdctl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := fakeCLIs(t, tc.clis)
			e, err := detect(context.Background(), tc.choice, noSocket, false)
			if err != nil {
				t.Fatalf("detect: %v", err)
			}
			defer e.close()
			if e.kind() != tc.want {
				t.Fatalf("detected %s, want %s", e.describe(), tc.want)
			}
			if want := filepath.Join(dir, tc.want); !strings.Contains(e.describe(), want) {
				t.Errorf("describe() = %q, want it to name %s", e.describe(), want)
			}
		})
	}
}

// TestDetectAsUserPassesRootlessOver: for a user other than root, an engine whose containers
// run in its user's namespace (rootless) is passed over, naming why, and detection goes on.
func TestDetectAsUserPassesRootlessOver(t *testing.T) {
	noSocket := "unix://" + filepath.Join(t.TempDir(), "absent.sock")
	// answers writes CLIs whose `info --format` prints the given text.
	answers := func(t *testing.T, clis map[string]string) {
		dir := t.TempDir()
		for name, info := range clis {
			script := "#!/bin/sh\nif [ \"$1\" = info ] && [ \"$2\" = --format ]; then echo '" + info + "'; fi\nexit 0\n"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv("PATH", dir)
	}
	const (
		rootlessDocker = `["name=seccomp,profile=builtin","name=rootless","name=cgroupns"]`
		rootfulDocker  = `["name=seccomp,profile=builtin","name=cgroupns"]`
	)
	for _, tc := range []struct {
		name   string
		clis   map[string]string
		asUser bool
		want   string // the engine picked, "" for none
	}{
		{"rootless docker kept for root", map[string]string{"docker": rootlessDocker}, false, "docker"},
		{"rootful docker for a user", map[string]string{"docker": rootfulDocker, "podman": "false"}, true, "docker"},
		{"rootless docker passed over", map[string]string{"docker": rootlessDocker, "podman": "false"}, true, "podman"},
		{"rootless podman passed over", map[string]string{"docker": rootlessDocker, "podman": "true"}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answers(t, tc.clis)
			e, err := detect(context.Background(), EngineAuto, noSocket, tc.asUser)
			if tc.want == "" {
				if !errors.Is(err, sandbox.ErrUnsupported) || strings.Count(err.Error(), reasonRootless) != 2 {
					t.Fatalf("detect: %v, want both engines passed over as rootless", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("detect: %v", err)
			}
			defer e.close()
			if e.kind() != tc.want {
				t.Errorf("picked %s, want %s", e.describe(), tc.want)
			}
		})
	}
}

func TestDetectNothingNamesWhatWasLookedFor(t *testing.T) {
	noSocket := "unix://" + filepath.Join(t.TempDir(), "absent.sock")
	for _, tc := range []struct {
		name    string
		clis    map[string]int
		choice  string
		want    []string
		notWant []string
	}{
		{"nothing installed", nil, EngineAuto,
			[]string{"Docker Engine API at " + noSocket, "no such socket", "docker (not on PATH)", "podman (not on PATH)", "nerdctl (not on PATH)", "apt-get install docker.io", "podman"}, nil},
		{"installed but engines down", map[string]int{"docker": 1, "podman": 125}, EngineAuto,
			[]string{"`docker info` failed: ", "docker engine down", "`podman info` failed", "nerdctl (not on PATH)"}, nil},
		{"only the API chosen", map[string]int{"docker": 0}, EngineAPI,
			[]string{"Docker Engine API at " + noSocket}, []string{"docker (", "podman (", "nerdctl ("}},
		{"only docker chosen", map[string]int{"podman": 0}, EngineDocker,
			[]string{"docker (not on PATH)"}, []string{"Engine API", "podman (", "nerdctl ("}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeCLIs(t, tc.clis)
			_, err := detect(context.Background(), tc.choice, noSocket, false)
			if !errors.Is(err, sandbox.ErrUnsupported) {
				t.Fatalf("detect: %v, want ErrUnsupported", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q names %q, which was not looked for", err, w)
				}
			}
		})
	}
}

func TestDetectRefusesRemoteHostAndUnknownChoice(t *testing.T) {
	fakeCLIs(t, nil)
	_, err := detect(context.Background(), EngineAPI, "tcp://127.0.0.1:2375", false)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "not a unix:// socket") {
		t.Errorf("tcp host: %v, want ErrUnsupported naming the unix socket requirement", err)
	}
	fakeCLIs(t, map[string]int{"docker": 0})
	_, err = detect(context.Background(), EngineAuto, "tcp://127.0.0.1:2375", false)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "docker (DOCKER_HOST tcp://127.0.0.1:2375 is not a unix:// socket") {
		t.Errorf("docker CLI with a tcp host: %v, want it passed over", err)
	}
	_, err = detect(context.Background(), "lxc", "", false)
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), `"lxc"`) {
		t.Errorf("unknown engine: %v, want ErrInvalid naming it", err)
	}
	// A regular file where the socket should be is not an engine.
	f := filepath.Join(t.TempDir(), "docker.sock")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = detect(context.Background(), EngineAPI, "unix://"+f, false)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("file as socket: %v", err)
	}
}

// TestDetectUsesDockerHost: the API address comes from DOCKER_HOST when the option is empty.
func TestDetectUsesDockerHost(t *testing.T) {
	fakeCLIs(t, nil)
	h := "unix://" + filepath.Join(t.TempDir(), "from-env.sock")
	t.Setenv("DOCKER_HOST", h)
	_, err := detect(context.Background(), EngineAuto, "", false)
	if err == nil || !strings.Contains(err.Error(), "Docker Engine API at "+h) {
		t.Errorf("detect: %v, want it to name %s", err, h)
	}
}

func testSpec(t *testing.T) *runSpec {
	t.Helper()
	d := spec.Sandbox{ID: "sb", Image: spec.Image{Ref: "img:1"}, Workdir: "/work"}
	d.ApplyDefaults()
	r, err := resolve(d)
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{agentPath: "/opt/airlock-agent"}
	return b.runSpecFor("s-0123456789abcdef", d, r, "img:1", "/run/ad/s-0123456789abcdef", "/run/ad/s-0123456789abcdef/rw/workspace", "/run/ad/s-0123456789abcdef/rw/tmp", map[string]string{labelSession: "s-0123456789abcdef"})
}

// hardening lists what every container must be given, as CLI argument pairs.
var hardening = [][]string{
	{"--network", "none"},
	{"--memory", "536870912"},
	{"--memory-swap", "536870912"},
	{"--cpus", "1"},
	{"--pids-limit", "256"},
	{"--read-only"},
	{"--cap-drop", "ALL"},
	{"--security-opt", "no-new-privileges"},
	{"--user", "0:0"},
	{"--rm"},
	{"--entrypoint", agentBinPath},
	{"--volume", "/opt/airlock-agent:" + agentBinPath + ":ro"},
	{"--volume", "/run/ad/s-0123456789abcdef/agent.json:" + agentConfigPath + ":ro"},
	{"--volume", "/run/ad/s-0123456789abcdef/run:" + agentRunPath},
	{"--volume", "/run/ad/s-0123456789abcdef/rw/workspace:/work"},
	{"--volume", "/run/ad/s-0123456789abcdef/rw/tmp:/tmp"},
}

func containsSeq(args, seq []string) bool {
	for i := range args {
		if i+len(seq) <= len(args) && slices.Equal(args[i:i+len(seq)], seq) {
			return true
		}
	}
	return false
}

func TestCLIArgsCarryEveryHardeningFlag(t *testing.T) {
	for _, kind := range []string{"docker", "podman", "nerdctl"} {
		t.Run(kind, func(t *testing.T) {
			args, err := cliCreateArgs(kind, testSpec(t))
			if err != nil {
				t.Fatal(err)
			}
			if args[0] != "create" {
				t.Errorf("args[0] = %q, want create", args[0])
			}
			for _, h := range hardening {
				if !containsSeq(args, h) {
					t.Errorf("%s create args lack %q: %q", kind, h, args)
				}
			}
			// Exactly the agent's capabilities are added back, nothing else.
			var added []string
			for i, a := range args {
				if a == "--cap-add" {
					added = append(added, args[i+1])
				}
			}
			slices.Sort(added)
			if !slices.Equal(added, agentCaps) {
				t.Errorf("--cap-add %q, want exactly %q", added, agentCaps)
			}
			for _, a := range args {
				if a == "--privileged" || strings.HasPrefix(a, "--network=host") || a == "host" {
					t.Errorf("args contain %q", a)
				}
			}
			// The image, then the agent's command, end the line.
			tail := args[len(args)-4:]
			if want := []string{"img:1", "serve", "--config", agentConfigPath}; !slices.Equal(tail, want) {
				t.Errorf("args end %q, want %q", tail, want)
			}
			podmanTmpfs := containsSeq(args, []string{"--read-only-tmpfs=false"})
			if podmanTmpfs != (kind == "podman") {
				t.Errorf("--read-only-tmpfs=false present = %v for %s", podmanTmpfs, kind)
			}
		})
	}
}

func TestAPIConfigCarriesEveryHardeningSetting(t *testing.T) {
	rs := testSpec(t)
	cfg, hc := apiConfigs(rs)
	checks := []struct {
		what string
		ok   bool
	}{
		{"network none", hc.NetworkMode == "none"},
		{"memory", hc.Memory == 512<<20},
		{"memory-swap equal to memory", hc.MemorySwap == hc.Memory},
		{"cpus", hc.NanoCPUs == 1e9},
		{"pids limit", hc.PidsLimit != nil && *hc.PidsLimit == 256},
		{"read-only root", hc.ReadonlyRootfs},
		{"cap-drop ALL", slices.Equal(hc.CapDrop, []string{"ALL"})},
		{"cap-add only the agent's", slices.Equal(hc.CapAdd, agentCaps)},
		{"no-new-privileges", slices.Equal(hc.SecurityOpt, []string{"no-new-privileges"})},
		{"auto-remove", hc.AutoRemove},
		{"not privileged", !hc.Privileged},
		{"shm size", hc.ShmSize == shmBytes},
		{"user root (the agent)", cfg.User == "0:0"},
		{"entrypoint is the agent", slices.Equal(cfg.Entrypoint, []string{agentBinPath})},
		{"command serves the config", slices.Equal(cfg.Cmd, []string{"serve", "--config", agentConfigPath})},
		{"labels", cfg.Labels[labelSession] == "s-0123456789abcdef"},
		{"agent binary read-only", slices.Contains(hc.Binds, "/opt/airlock-agent:"+agentBinPath+":ro")},
		{"agent config read-only", slices.Contains(hc.Binds, "/run/ad/s-0123456789abcdef/agent.json:"+agentConfigPath+":ro")},
		{"workdir from the scratch tmpfs", slices.Contains(hc.Binds, "/run/ad/s-0123456789abcdef/rw/workspace:/work")},
		{"/tmp from the scratch tmpfs", slices.Contains(hc.Binds, "/run/ad/s-0123456789abcdef/rw/tmp:/tmp")},
		{"no extra mounts", len(hc.Binds) == 5 && len(hc.Mounts) == 0 && len(hc.Tmpfs) == 0},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not set (config %+v, host config %+v)", c.what, cfg, hc)
		}
	}
}

// TestUserScratchIsTheEngines: a backend of a user other than root mounts no scratch of its
// own: the engine mounts a tmpfs at the workdir (the code's, executable) and at /tmp (sticky),
// each no larger than the memory limit whose memory holds it; both renderings carry them.
func TestUserScratchIsTheEngines(t *testing.T) {
	d := spec.Sandbox{ID: "sb", Image: spec.Image{Ref: "img:1"}, Workdir: "/work"}
	d.ApplyDefaults()
	r, err := resolve(d)
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{agentPath: "/opt/airlock-agent", asUser: true, codeUID: CodeUID + 1, codeGID: CodeGID + 1}
	rs := b.runSpecFor("s-0123456789abcdef", d, r, "img:1", "/run/ad/s-0123456789abcdef", "", "", nil)
	work := fmt.Sprintf("exec,size=%d,mode=0755,uid=%d,gid=%d", 512<<20, CodeUID+1, CodeGID+1)
	tmp := fmt.Sprintf("exec,size=%d,mode=1777", 512<<20)
	_, hc := apiConfigs(rs)
	if len(hc.Tmpfs) != 2 || hc.Tmpfs["/work"] != work || hc.Tmpfs["/tmp"] != tmp {
		t.Errorf("API tmpfs %v", hc.Tmpfs)
	}
	for _, bd := range hc.Binds {
		if strings.HasSuffix(bd, ":/work") || strings.HasSuffix(bd, ":/tmp") {
			t.Errorf("a bind at the workdir or /tmp: %s", bd)
		}
	}
	args, err := cliCreateArgs("docker", rs)
	if err != nil {
		t.Fatal(err)
	}
	if !containsSeq(args, []string{"--tmpfs", "/work:" + work}) || !containsSeq(args, []string{"--tmpfs", "/tmp:" + tmp}) {
		t.Errorf("CLI args lack the tmpfs mounts: %q", args)
	}
}

func TestCLIArgsRefuseUnsafePaths(t *testing.T) {
	rs := testSpec(t)
	rs.Binds[0].Source = "/opt/a:b"
	if _, err := cliCreateArgs("docker", rs); err == nil {
		t.Error("a bind source with ':' was accepted")
	}
}

func TestFormatCPUs(t *testing.T) {
	for nano, want := range map[int64]string{1e9: "1", 250e6: "0.25", 2e9: "2", 10e6: "0.01", 1500e6: "1.5"} {
		if got := formatCPUs(nano); got != want {
			t.Errorf("formatCPUs(%d) = %q, want %q", nano, got, want)
		}
	}
}

func TestResolveRefuses(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	base := func() spec.Sandbox {
		return spec.Sandbox{ID: "sb", Image: spec.Image{Ref: "img:1"}}
	}
	tests := []struct {
		name  string
		mod   func(*spec.Sandbox)
		class error
		words []string
	}{
		{"egress allow", func(d *spec.Sandbox) { d.Egress.Mode = spec.EgressAllow }, sandbox.ErrUnsupported, []string{"allow", string(capability.PublicOnlyEgress)}},
		{"egress domains", func(d *spec.Sandbox) {
			d.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"example.com"}}
		}, sandbox.ErrUnsupported, []string{"allowDomains", string(capability.DomainEgressRules)}},
		{"egress open with domains", func(d *spec.Sandbox) {
			d.Egress = spec.Egress{Mode: spec.EgressOpen, Domains: []string{"example.com"}}
		}, sandbox.ErrInvalid, []string{"egress.domains"}},
		{"egress mode unknown", func(d *spec.Sandbox) { d.Egress.Mode = "wide" }, sandbox.ErrInvalid, []string{`"wide"`, "open"}},
		{"gvisor", func(d *spec.Sandbox) { d.Runtime = spec.RuntimeGVisor }, sandbox.ErrUnsupported, []string{"gvisor"}},
		{"preview ports", func(d *spec.Sandbox) { d.PreviewPorts = []int{8080} }, sandbox.ErrUnsupported, []string{"previewPorts"}},
		{"host image", func(d *spec.Sandbox) { d.Image = spec.Image{Host: true} }, sandbox.ErrUnsupported, []string{"host", string(capability.ImageHost)}},
		{"dir image", func(d *spec.Sandbox) { d.Image = spec.Image{Dir: "/x"} }, sandbox.ErrUnsupported, []string{"dir", string(capability.ImageDir)}},
		{"tiny memory", func(d *spec.Sandbox) { d.Limits.Memory = "4Mi" }, sandbox.ErrInvalid, []string{"limits.memory", "4Mi", "6Mi"}},
		{"few processes", func(d *spec.Sandbox) { d.Limits.MaxProcesses = i(8) }, sandbox.ErrInvalid, []string{"limits.maxProcesses", "8", "16"}},
		{"tiny cpu", func(d *spec.Sandbox) { d.Limits.CPU = "5m" }, sandbox.ErrInvalid, []string{"limits.cpu", "5m"}},
		{"workdir /tmp", func(d *spec.Sandbox) { d.Workdir = "/tmp" }, sandbox.ErrInvalid, []string{"workdir", "/tmp"}},
		{"workdir under /.airlock", func(d *spec.Sandbox) { d.Workdir = "/.airlock/x" }, sandbox.ErrInvalid, []string{"workdir", "/.airlock"}},
		{"workdir with a colon", func(d *spec.Sandbox) { d.Workdir = "/a:b" }, sandbox.ErrInvalid, []string{"workdir", "':'"}},
		{"relative workdir", func(d *spec.Sandbox) { d.Workdir = "work" }, sandbox.ErrInvalid, []string{"workdir"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := base()
			tc.mod(&d)
			d.ApplyDefaults()
			_, err := resolve(d)
			if !errors.Is(err, tc.class) {
				t.Fatalf("resolve: %v, want %v", err, tc.class)
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	d := base()
	d.ApplyDefaults()
	if _, err := resolve(d); err != nil {
		t.Errorf("a default declaration is refused: %v", err)
	}
}

// TestCapabilitiesMatchRefusals: what resolve refuses is what Capabilities says is missing.
func TestCapabilitiesMatchRefusals(t *testing.T) {
	caps := capabilities(true, false)
	if caps.Platform != capability.Docker {
		t.Errorf("platform %q", caps.Platform)
	}
	for _, n := range capability.Names {
		st, ok := caps.Entries[n]
		if !ok {
			t.Errorf("capability %s missing from the set", n)
		}
		if !st.Supported && st.Reason == "" {
			t.Errorf("capability %s unsupported without a reason", n)
		}
	}
	for _, n := range []capability.Name{capability.PublicOnlyEgress, capability.DomainEgressRules, capability.GVisor, capability.ImageHost, capability.ImageDir, capability.Preview} {
		if caps.Has(n) {
			t.Errorf("capability %s claimed, but the backend does not enforce it", n)
		}
	}
	for _, n := range []capability.Name{capability.EgressDeny, capability.EnforcedLimits, capability.ProcessLimit, capability.DiskLimit, capability.Files, capability.Env, capability.Workdir, capability.ImageRef, capability.ImageOCI, capability.DockerRuntime, capability.SessionLifetime, capability.IdleTimeout, capability.BackgroundProcesses} {
		if !caps.Has(n) {
			t.Errorf("capability %s not claimed: %s", n, caps.Entries[n].Reason)
		}
	}
}

func TestCheckStatic(t *testing.T) {
	// /bin/sh is dynamically linked on every Debian: refused, naming the fix.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	if real, err := filepath.EvalSymlinks(sh); err == nil {
		sh = real
	}
	err = checkStatic(sh)
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("checkStatic(%s) = %v, want a refusal naming CGO_ENABLED=0", sh, err)
	}
	// A script is not an ELF binary.
	f := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkStatic(f); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("checkStatic(script) = %v, want ErrInvalid", err)
	}
}

func TestSessionIDs(t *testing.T) {
	id, err := newSessionID()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSessionID(id); err != nil {
		t.Errorf("a fresh id is refused: %v", err)
	}
	for _, bad := range []string{"", "s-123", "../s-0123456789abcdef", "s-0123456789ABCDEF", "s-0123456789abcdef0"} {
		if err := checkSessionID(bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("checkSessionID(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if stateTag("/a") == stateTag("/b") {
		t.Error("two state dirs share a tag")
	}
}

func TestStartHints(t *testing.T) {
	for stderr, want := range map[string]string{
		"Error: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied":                   "default_ulimits",
		"runc create failed: error setting rlimit type 6: operation not permitted":                                 "default_ulimits",
		"Error: OCI runtime error: crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2": `runtime = "runc"`,
		"Error: no such image": "",
	} {
		got := startHint(&cliError{args: []string{"podman", "start"}, err: errors.New("exit status 125"), stderr: stderr})
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("startHint(%q) = %q, want it to mention %q", stderr, got, want)
		}
	}
}

// TestCapabilitiesPerHost: without a v1 freezer the agent kills by process group, and the
// set says backgroundProcesses is not held, naming why; with one it is. A user other than
// root makes no freezer cgroup and mounts no scratch: background processes and the disk limit
// are not held, and an undeclared disk is the platform's (the memory limit).
func TestCapabilitiesPerHost(t *testing.T) {
	for _, tc := range []struct {
		freezer, asUser bool
		bg, disk        bool
		reason          string
	}{
		{true, false, true, true, ""},
		{false, false, false, true, "no cgroup v1 freezer"},
		{false, true, false, false, "other than root"},
	} {
		set := capabilities(tc.freezer, tc.asUser)
		st := set.Entries[capability.BackgroundProcesses]
		if st.Supported != tc.bg || set.Has(capability.DiskLimit) != tc.disk {
			t.Errorf("freezer %v, user %v: backgroundProcesses %v, diskLimit %v; want %v %v", tc.freezer, tc.asUser, st.Supported, set.Has(capability.DiskLimit), tc.bg, tc.disk)
		}
		if !tc.bg && (!strings.Contains(st.Reason, "setsid") || !strings.Contains(st.Reason, tc.reason)) {
			t.Errorf("freezer %v, user %v: reason %q does not say why (%q) and what escapes", tc.freezer, tc.asUser, st.Reason, tc.reason)
		}
		if v := set.PlatformValues[capability.PropDisk]; (v != "") != !tc.disk || (v != "" && !strings.Contains(v, "memory limit")) {
			t.Errorf("freezer %v, user %v: the platform's disk %q", tc.freezer, tc.asUser, v)
		}
	}
}

// TestPublishedFacts: what a user relies on in this backend's set (the one copy: capability.For
// keeps none).
func TestPublishedFacts(t *testing.T) {
	set := Capable()
	for _, tt := range []struct {
		n    capability.Name
		want bool
		why  string // substring of the reason when false
	}{
		{capability.EgressDeny, true, ""},
		{capability.PublicOnlyEgress, false, "private and metadata addresses"},
		{capability.EnforcedLimits, true, ""},
		{capability.ImageHost, false, "local runtime"},
		{capability.DockerRuntime, true, ""},
		{capability.BackgroundProcesses, true, ""},
		{capability.DiskLimit, true, ""},
	} {
		st := set.Entries[tt.n]
		if st.Supported != tt.want || !strings.Contains(st.Reason, tt.why) {
			t.Errorf("%s = %+v, want supported %v with reason containing %q", tt.n, st, tt.want, tt.why)
		}
	}
	if set.Platform != capability.Docker || set.Bounds != (capability.Bounds{}) || len(set.PlatformValues) != 0 {
		t.Errorf("platform %q, bounds %+v, platform values %v", set.Platform, set.Bounds, set.PlatformValues)
	}
}

// TestCodeIDs: the code never runs as the uid that owns the session's directories.
func TestCodeIDs(t *testing.T) {
	for uid, want := range map[int]uint32{0: CodeUID, 1000: CodeUID + 1, 65534: CodeUID, 1001: CodeUID} {
		if u, g := codeIDs(uid); u != want || int(u) == uid || g != want-CodeUID+CodeGID {
			t.Errorf("codeIDs(%d) = %d, %d; want %d", uid, u, g, want)
		}
	}
}

// TestAgentPolicy: a container's agent gets its run policy from wire.NewPolicy (no copy of
// the environment defaults, the refused paths, the output cap or the idle rule here), with
// the engine's own files among the refused paths.
func TestAgentPolicy(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	d := spec.Sandbox{ID: "sb", Image: spec.Image{Ref: "img:1"}, Env: map[string]string{"A": "decl"}}
	d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = i(3600), i(600)
	d.ApplyDefaults()
	r, err := resolve(d)
	if err != nil {
		t.Fatal(err)
	}
	imageEnv := []string{"A=image", "B=image"}
	got := agentPolicy(d, r, imageEnv)
	want := wire.NewPolicy(wire.PolicyFor{Workdir: r.workdir, User: "sandbox", ImageEnv: imageEnv, Env: d.Env,
		Lifetime: time.Hour, IdleTimeout: 600 * time.Second, RuntimePaths: runtimePaths})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("policy %+v, want the builder's %+v", got, want)
	}
	for _, p := range []string{agentDir, "/etc/resolv.conf", "/proc"} {
		if !slices.Contains(got.DenyPaths, p) {
			t.Errorf("%s is not refused: %v", p, got.DenyPaths)
		}
	}
	if got.Env["A"] != "decl" || got.Env["B"] != "image" || got.IdleTimeout != 600*time.Second {
		t.Errorf("policy %+v: the declaration over the image, the idle timeout kept", got)
	}
}

// netEngine is an engine that knows networks and nothing else.
type netEngine struct {
	engine
	k    string
	nets map[string]networkInfo
}

func (e *netEngine) kind() string     { return e.k }
func (e *netEngine) describe() string { return e.k + " engine" }
func (e *netEngine) networkInspect(ctx context.Context, name string) (networkInfo, error) {
	if n, ok := e.nets[name]; ok {
		return n, nil
	}
	return networkInfo{}, fmt.Errorf("%w: network %s", sandbox.ErrNotFound, name)
}

// TestOpenNetwork: egress open joins OpenNetwork or the engine's default network, which must
// exist and reach out; deny stays on --network none.
func TestOpenNetwork(t *testing.T) {
	nets := map[string]networkInfo{
		"bridge": {Name: "bridge"}, "podman": {Name: "podman"}, "mine": {Name: "mine"},
		"closed": {Name: "closed", Internal: true},
	}
	for _, tc := range []struct {
		kind, opt string
		nets      map[string]networkInfo
		want      string
		class     error
		words     []string
	}{
		{"api", "", nets, "bridge", nil, nil},
		{"docker", "", nets, "bridge", nil, nil},
		{"nerdctl", "", nets, "bridge", nil, nil},
		{"podman", "", nets, "podman", nil, nil},
		{"api", "mine", nets, "mine", nil, nil},
		{"podman", "mine", nets, "mine", nil, nil},
		{"api", "", map[string]networkInfo{}, "", sandbox.ErrUnsupported, []string{`network "bridge"`, "--bridge=none", "OpenNetwork"}},
		{"podman", "absent", nets, "", sandbox.ErrUnsupported, []string{`network "absent"`, "OpenNetwork"}},
		{"api", "closed", nets, "", sandbox.ErrUnsupported, []string{`network "closed"`, "internal"}},
	} {
		t.Run(tc.kind+"/"+tc.opt, func(t *testing.T) {
			b := &Backend{opts: Options{OpenNetwork: tc.opt}, eng: &netEngine{k: tc.kind, nets: tc.nets}}
			got, err := b.openNetwork(context.Background())
			if tc.class == nil {
				if err != nil || got != tc.want {
					t.Fatalf("openNetwork = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, tc.class) {
				t.Fatalf("openNetwork = %q, %v; want %v", got, err, tc.class)
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	// resolve leaves open's network to Create and keeps deny on none; the container carries it.
	for mode, want := range map[spec.EgressMode]string{spec.EgressDeny: "none", spec.EgressOpen: ""} {
		d := spec.Sandbox{ID: "sb", Image: spec.Image{Ref: "img:1"}, Egress: spec.Egress{Mode: mode}}
		d.ApplyDefaults()
		r, err := resolve(d)
		if err != nil || r.network != want {
			t.Fatalf("resolve(%s): network %q, %v; want %q", mode, r.network, err, want)
		}
	}
	rs := testSpec(t)
	rs.Network = "mine"
	args, err := cliCreateArgs("docker", rs)
	if err != nil || !containsSeq(args, []string{"--network", "mine"}) {
		t.Errorf("create args %q (%v) lack --network mine", args, err)
	}
	if _, hc := apiConfigs(rs); hc.NetworkMode != "mine" {
		t.Errorf("API network mode %q, want mine", hc.NetworkMode)
	}
}
