package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/backend/docker"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

var update = flag.Bool("update", false, "rewrite examples/golden from the current output")

func TestMain(m *testing.M) {
	// Re-executed by TestAgentCommand as the CLI itself: __agent exits the process.
	if os.Getenv("AIRLOCK_CLI_TEST_EXEC") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// airlock run parks parked sandboxes by default, by starting this executable as a filler: only the
	// tests calling useParked want that (which also set AIRLOCK_CLI_TEST_EXEC, so that the
	// filler is the CLI).
	os.Setenv(runcli.EnvPool, "0")
	goleak.VerifyTestMain(m)
}

// The hidden __agent command hands its arguments to the agent's command line untouched.
func TestAgentCommand(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"__agent", "version"}, 0, "airlock-agent "},
		{[]string{"__agent", "--help"}, 0, "airlock-agent serve --config"},
		{[]string{"__agent"}, 2, ""},
	} {
		cmd := exec.Command(os.Args[0], tt.args...)
		cmd.Env = append(os.Environ(), "AIRLOCK_CLI_TEST_EXEC=1")
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tt.code || !strings.Contains(string(out), tt.out) {
			t.Errorf("%q: exit %d, stdout %q; want exit %d and %q", tt.args, code, out, tt.code, tt.out)
		}
	}
}

// runCLI executes the CLI in-process from the repository root, as the README's commands do.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// fixedLocalSet writes the local set of a fixed, fully capable host (no runsc, no docker CLI)
// so the local goldens do not depend on the machine running the tests.
func fixedLocalSet(t *testing.T) string {
	t.Helper()
	w := func(dir string) capability.CgroupController {
		return capability.CgroupController{Version: 1, Dir: dir, Writable: true}
	}
	h := capability.HostProbe{
		OS: "linux", Root: true, CapSysAdmin: true, CapNetAdmin: true,
		Cgroup: capability.CgroupFacts{
			Version: "v1",
			Controllers: map[string]capability.CgroupController{
				"cpu": w("/sys/fs/cgroup/cpu"), "memory": w("/sys/fs/cgroup/memory"),
				"pids": w("/sys/fs/cgroup/pids"), "freezer": w("/sys/fs/cgroup/freezer"),
			},
			CPUQuota: true, MemorySwap: true, Freezer: true,
		},
		Seccomp:  capability.SeccompFacts{Supported: true, Filter: true},
		UserNS:   capability.UserNSFacts{Max: 1000},
		Tmpfs:    true,
		NFTables: capability.Feature{Available: true, Source: "builtin"},
		Veth:     capability.Feature{Available: true, Source: "builtin"},
	}
	return writeSet(t, h.Set())
}

// writeSet writes set as a --capabilities-file.
func writeSet(t *testing.T, set capability.Set) string {
	t.Helper()
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), string(set.Platform)+".json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func examples(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("examples/*.yaml")
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	return files
}

// TestPlanGolden runs plan on every example for every platform and compares with
// examples/golden/<example>.<platform>.txt (go test ./cmd/airlock-full -update rewrites them).
func TestPlanGolden(t *testing.T) {
	t.Chdir("../..")
	localSet := fixedLocalSet(t)
	dockerSet := writeSet(t, docker.Published())
	seen := map[string]bool{}
	for _, ex := range examples(t) {
		for _, p := range capability.Platforms {
			name := strings.TrimSuffix(filepath.Base(ex), ".yaml") + "." + string(p) + ".txt"
			seen[name] = true
			t.Run(name, func(t *testing.T) {
				args := []string{"plan", "-f", ex, "--platform", string(p)}
				switch p {
				case capability.Local:
					args = append(args, "--capabilities-file", localSet)
				case capability.Docker:
					// The published set: an engine on this machine would answer with its own.
					args = append(args, "--capabilities-file", dockerSet)
				}
				code, out, errOut := runCLI(t, args...)
				if errOut != "" {
					t.Errorf("stderr: %s", errOut)
				}
				wantCode := cli.ExitOK
				if strings.Contains(out, "REFUSED") {
					wantCode = cli.ExitRefused
				}
				if code != wantCode {
					t.Errorf("exit %d, want %d", code, wantCode)
				}
				golden := filepath.Join("examples", "golden", name)
				if *update {
					if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run go test ./cmd/airlock-full -update)", err)
				}
				if out != string(want) {
					t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", golden, out, want)
				}
			})
		}
	}
	// No golden file outlives its example or platform.
	files, _ := filepath.Glob("examples/golden/*")
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("stale golden file %s", f)
		}
	}
}

// What the examples promise, independent of the goldens' exact text.
func TestExamplePromises(t *testing.T) {
	t.Chdir("../..")
	localSet := fixedLocalSet(t)
	tests := []struct {
		args     []string
		code     int
		contains []string
		absent   []string
	}{
		{[]string{"plan", "-f", "examples/python-tool.yaml", "--platform", "local", "--capabilities-file", localSet}, 0,
			[]string{"OK  1 sandbox can run on local as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/allowlisted-egress.yaml", "--platform", "docker"}, 1,
			[]string{"needs=domainEgressRules", "no egress proxy in the container's network path"}, nil},
		{[]string{"plan", "-f", "examples/allowlisted-egress.yaml", "--platform", "kubernetes"}, 0,
			[]string{"OK  1 sandbox can run on kubernetes as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/gcp-without-host.yaml", "--platform", "gcp"}, 1,
			[]string{"field=sandboxes[0].hostedBy", "needs=gcp.requiresHost"}, nil},
		{[]string{"plan", "-f", "examples/gcp-without-host.yaml", "--platform", "aws"}, 1,
			nil, []string{"gcp.requiresHost"}},
		{[]string{"plan", "-f", "examples/kitchen-sink.yaml", "--platform", "aws"}, 1,
			[]string{"needs=bound.lifetime", "exceeds aws's ceiling of 28800s"}, []string{"not-shown-in-refusals"}},
		{[]string{"plan", "-f", "examples/kitchen-sink.yaml", "--platform", "gcp"}, 1,
			[]string{"sandbox=builder   field=sandboxes[1].hostedBy"}, []string{"sandbox=notebook  field=sandboxes[0].hostedBy", "bound.lifetime"}},
		{[]string{"plan", "-f", "examples/kitchen-sink.yaml", "--platform", "kubernetes"}, 1,
			[]string{"field=sandboxes[0].hostedBy", "needs=kubernetes.hostedBy"}, nil},
		// One stack per platform plans clean there, and shows what its undeclared properties become.
		{[]string{"plan", "-f", "examples/local.yaml", "--platform", "local", "--capabilities-file", localSet}, 0,
			[]string{"UNDECLARED  sandbox=scratch  limits.cpu                  airlock default  1", "OK  1 sandbox can run on local as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/docker.yaml", "--platform", "docker"}, 0,
			[]string{"OK  1 sandbox can run on docker as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/kubernetes.yaml", "--platform", "kubernetes"}, 0,
			[]string{"OK  1 sandbox can run on kubernetes as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/aws.yaml", "--platform", "aws"}, 0,
			[]string{"limits.cpu                  platform value   platform-sized (aws tier 2048 MiB", "session.idleTimeoutSeconds  platform value   none", "OK  1 sandbox can run on aws as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/azure.yaml", "--platform", "azure"}, 0,
			[]string{"limits.disk                 platform value   platform-sized (azure tier disk", "OK  1 sandbox can run on azure as declared"}, []string{"REFUSED"}},
		{[]string{"plan", "-f", "examples/gcp.yaml", "--platform", "gcp"}, 0,
			[]string{"session.reconnect           platform value   from the same Cloud Run instance only", "OK  1 sandbox can run on gcp as declared"}, []string{"REFUSED"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:5], " "), func(t *testing.T) {
			code, out, _ := runCLI(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\n%s", code, tt.code, out)
			}
			for _, s := range tt.contains {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.absent {
				if strings.Contains(out, s) {
					t.Errorf("output has %q:\n%s", s, out)
				}
			}
		})
	}
}

func TestCLI(t *testing.T) {
	t.Chdir("../..")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badYAML := write("bad.yaml", "apiVersion: airlock.dev/v1alpha1\nsandboxes:\n  - id: a\n    image: host\n    limits: {cpuu: 1}\n")
	invalid := write("invalid.yaml", "apiVersion: airlock.dev/v1alpha1\nsandboxes:\n  - id: a\n    image: host\n    limits: {cpu: 0}\n")
	clean, _ := json.Marshal(capability.Set{Platform: capability.Local, Entries: func() map[capability.Name]capability.Status {
		m := map[capability.Name]capability.Status{}
		for _, n := range capability.Names {
			m[n] = capability.Status{Supported: true}
		}
		return m
	}()})
	cleanSet := write("clean.json", string(clean))
	awsSet := write("aws.json", `{"platform":"aws","capabilities":{}}`)
	garbage := write("garbage.json", "{")

	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   []string
		stderr   []string
		noStdout bool
	}{
		{name: "help lists plan and capabilities", args: []string{"--help"}, stdout: []string{"plan", "capabilities"}},
		{name: "unknown command", args: []string{"nope"}, code: 2, stderr: []string{`unknown command "nope"`}, noStdout: true},
		{name: "unknown flag", args: []string{"plan", "--nope"}, code: 2, stderr: []string{"unknown flag: --nope"}, noStdout: true},
		{name: "bad output format", args: []string{"capabilities", "-o", "yaml"}, code: 2, stderr: []string{`-o/--output "yaml"`}, noStdout: true},
		{name: "plan without a file", args: []string{"plan"}, code: 2, stderr: []string{"-f STACK"}, noStdout: true},
		{name: "plan with an argument", args: []string{"plan", "-f", "examples/python-tool.yaml", "extra"}, code: 2, stderr: []string{"takes no arguments"}, noStdout: true},
		{name: "plan missing file", args: []string{"plan", "-f", filepath.Join(dir, "absent.yaml")}, code: 2, stderr: []string{"absent.yaml"}, noStdout: true},
		{name: "plan parse error names the field", args: []string{"plan", "-f", badYAML}, code: 2, stderr: []string{"bad.yaml", "sandboxes[0].limits.cpuu"}, noStdout: true},
		{name: "plan validation error is a refusal", args: []string{"plan", "-f", invalid, "--capabilities-file", cleanSet}, code: 1,
			stdout: []string{"REFUSED  sandbox=a  field=sandboxes[0].limits.cpu  needs=quantity.positive", "1 refusal on local (1 of 1 sandbox refused)"}},
		{name: "plan unknown platform", args: []string{"plan", "-f", "examples/python-tool.yaml", "--platform", "openstack"}, code: 1,
			stdout: []string{"REFUSED  sandbox=-  field=platform  needs=platform.unknown", "allowed platforms are local, docker, kubernetes, aws, azure, gcp"}},
		{name: "plan clean", args: []string{"plan", "-f", "examples/kitchen-sink.yaml", "--capabilities-file", cleanSet}, code: 0,
			stdout: []string{"OK  2 sandboxes can run on local as declared"}},
		{name: "capabilities file for another platform", args: []string{"plan", "-f", "examples/python-tool.yaml", "--capabilities-file", awsSet}, code: 2,
			stderr: []string{`is for platform "aws", not "local"`}, noStdout: true},
		{name: "capabilities file garbage", args: []string{"plan", "-f", "examples/python-tool.yaml", "--capabilities-file", garbage}, code: 2,
			stderr: []string{"garbage.json"}, noStdout: true},
		{name: "capabilities azure", args: []string{"capabilities", "--platform", "azure"}, code: 0,
			stdout: []string{"azure capabilities", "stdin                no        executeShellCommand takes a command, not a stdin stream", "reconnect            yes\n", "bounds: cpu 2000m, memory 4294967296 bytes"}},
		{name: "capabilities aws", args: []string{"capabilities", "--platform", "aws"}, code: 0,
			stdout: []string{"idleTimeout          no        a MicroVM's idle policy counts only inbound traffic", "bounds: maxLifetime 28800s\n"}},
		{name: "capabilities kubernetes", args: []string{"capabilities", "--platform", "kubernetes"}, code: 0,
			stdout: []string{"domainEgressRules    yes\n", "liveEgress           no        a pod's NetworkPolicy is not changed while it runs", "bounds: none"}},
		{name: "capabilities unknown platform", args: []string{"capabilities", "--platform", "openstack"}, code: 2,
			stderr: []string{`platform "openstack" (from --platform): allowed are auto, local, docker, kubernetes, aws, azure, gcp`}, noStdout: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out, errOut)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
			if tt.noStdout && out != "" {
				t.Errorf("stdout not empty: %s", out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.TrimRight(line, " ") != line {
					t.Errorf("trailing space in %q", line)
				}
			}
		})
	}
}

func TestHelpHidesInternalCommands(t *testing.T) {
	_, out, _ := runCLI(t, "--help")
	for _, hidden := range []string{"__agent", "__pool-fill", "completion", "capabilities-file"} {
		if strings.Contains(out, hidden) {
			t.Errorf("help shows %s:\n%s", hidden, out)
		}
	}
	_, out, _ = runCLI(t, "plan", "--help")
	if strings.Contains(out, "capabilities-file") {
		t.Errorf("plan help shows the hidden flag:\n%s", out)
	}
}

// -o json prints exactly plan.Check's Result and the published set.
func TestJSONOutput(t *testing.T) {
	t.Chdir("../..")
	code, out, _ := runCLI(t, "plan", "-f", "examples/kitchen-sink.yaml", "--platform", "aws", "-o", "json")
	if code != cli.ExitRefused {
		t.Errorf("exit %d", code)
	}
	var got plan.Result
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	st, err := spec.LoadStack("examples/kitchen-sink.yaml")
	if err != nil {
		t.Fatal(err)
	}
	set, _ := capability.For(capability.AWS)
	if want := plan.Check(st, capability.AWS, set); !reflect.DeepEqual(got, want) {
		t.Errorf("json result differs from plan.Check:\n%+v\n%+v", got, want)
	}

	code, out, _ = runCLI(t, "capabilities", "--platform", "gcp", "-o", "json")
	if code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
	var gotSet capability.Set
	if err := json.Unmarshal([]byte(out), &gotSet); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want, _ := capability.For(capability.GCP); !reflect.DeepEqual(gotSet, want) {
		t.Errorf("json set differs from capability.For:\n%+v\n%+v", gotSet, want)
	}
}
