package platform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/docker"
	"github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{"", Auto, false},
		{"auto", Auto, false},
		{"local", "local", false},
		{"docker", "docker", false},
		{"kubernetes", "kubernetes", false},
		{"gcp", "gcp", false},
		{"podman", "", true},
		{"Local", "", true},
	} {
		got, err := Parse(tc.in, "$AIRLOCK_PLATFORM")
		if tc.bad {
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), `"`+tc.in+`"`) ||
				!strings.Contains(err.Error(), "$AIRLOCK_PLATFORM") || !strings.Contains(err.Error(), "auto, local, docker, kubernetes, aws, azure, gcp") {
				t.Errorf("Parse(%q) = %q, %v: want ErrInvalid naming the value, its origin and the allowed values", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSettingsPrecedence(t *testing.T) {
	file := writeConfig(t, "platform: docker\ndocker:\n  engine: podman\n  stateDir: /run/x\n  openNetwork: airlock-open\nkubernetes:\n  brokerURL: http://broker\n  namespace: apps\n")
	for _, tc := range []struct {
		name       string
		flag       string
		flagSet    bool
		env        string
		config     string
		want, from string
	}{
		{"flag beats env and file", "local", true, "kubernetes", file, "local", "--platform"},
		{"env beats file", "", false, "kubernetes", file, "kubernetes", "$AIRLOCK_PLATFORM"},
		{"file", "", false, "", file, "docker", file},
		{"default is auto", "", false, "", "", Auto, "the default"},
		{"flag auto beats file", "auto", true, "", file, Auto, "--platform"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvPlatform, tc.env)
			t.Setenv(EnvConfig, tc.config)
			if tc.config == "" {
				os.Unsetenv(EnvConfig)
				if _, err := os.Stat(DefaultConfigFile); err == nil {
					t.Skipf("%s exists on this machine", DefaultConfigFile)
				}
			}
			c, err := Settings(tc.flag, tc.flagSet)
			if err != nil {
				t.Fatal(err)
			}
			if c.Platform != tc.want || c.From != tc.from {
				t.Errorf("platform %q from %q; want %q from %q", c.Platform, c.From, tc.want, tc.from)
			}
			if tc.config != "" {
				wantD := DockerConfig{Engine: "podman", StateDir: "/run/x", OpenNetwork: "airlock-open"}
				wantK := KubernetesConfig{BrokerURL: "http://broker", Namespace: "apps"}
				if c.Docker != wantD || c.Kubernetes != wantK {
					t.Errorf("file settings %+v %+v; want %+v %+v", c.Docker, c.Kubernetes, wantD, wantK)
				}
			}
		})
	}
}

func TestSettingsRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, config, env, flag string
		want                    []string
	}{
		{"unknown field", "platform: local\ndockr:\n  engine: podman\n", "", "", []string{"dockr", "unknown field"}},
		{"unknown nested field", "docker:\n  socket: /x\n", "", "", []string{"socket", "unknown field"}},
		{"bad platform in file", "platform: lambda\n", "", "", []string{`"lambda"`, "config.yaml", "allowed are"}},
		{"bad platform in env", "", "lambda", "", []string{`"lambda"`, "$AIRLOCK_PLATFORM"}},
		{"bad flag", "", "", "lambda", []string{`"lambda"`, "--platform"}},
		{"missing named file", "-", "", "", []string{"config file", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch tc.config {
			case "":
				t.Setenv(EnvConfig, writeConfig(t, ""))
			case "-":
				t.Setenv(EnvConfig, filepath.Join(t.TempDir(), "absent.yaml"))
			default:
				t.Setenv(EnvConfig, writeConfig(t, tc.config))
			}
			t.Setenv(EnvPlatform, tc.env)
			_, err := Settings(tc.flag, tc.flag != "")
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("err = %v; want ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err %q does not name %q", err, w)
				}
			}
		})
	}
}

// fake is a backend the injected openers return: a broker client that is never called.
func fake(t *testing.T) Backend {
	t.Helper()
	b, err := kubernetes.New(kubernetes.Config{BrokerURL: "http://127.0.0.1:1", Namespace: "x", TokenFile: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAuto(t *testing.T) {
	refusedLocal := fmt.Errorf("%w: not root: no subordinate ids for uid 1000\nrun airlock as root (sudo), or ...", sandbox.ErrUnsupported)
	noEngine := fmt.Errorf("%w: no container engine found: looked for ...; install one: apt-get install docker.io", sandbox.ErrUnsupported)
	for _, tc := range []struct {
		name              string
		local, docker     error
		want              capability.Platform
		wantErr           error
		errHas, noticeHas []string
		dockerTried       bool
	}{
		{name: "local runs here", want: capability.Local},
		{name: "local refused, docker found", local: refusedLocal, want: capability.Docker, dockerTried: true,
			noticeHas: []string{"the local runtime cannot run here (unsupported: not root: no subordinate ids for uid 1000)", "using docker (podman CLI (/usr/bin/podman))"}},
		{name: "neither", local: refusedLocal, docker: noEngine, wantErr: sandbox.ErrUnsupported, dockerTried: true,
			errHas: []string{"no platform can run sandboxes here", "local: unsupported: not root", "run airlock as root", "docker: unsupported: no container engine found", "apt-get install docker.io", "--platform kubernetes"}},
		{name: "local fails otherwise: no fallback", local: fmt.Errorf("%w: stateDir: permission denied", sandbox.ErrInvalid), wantErr: sandbox.ErrInvalid,
			errHas: []string{"permission denied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dockerTried := false
			o := openers{
				local: func(context.Context, Config) (Backend, string, error) {
					if tc.local != nil {
						return nil, "", tc.local
					}
					return fake(t), "", nil
				},
				docker: func(context.Context, Config) (Backend, string, error) {
					dockerTried = true
					if tc.docker != nil {
						return nil, "", tc.docker
					}
					return fake(t), "podman CLI (/usr/bin/podman)", nil
				},
			}
			b, ch, err := o.open(t.Context(), Config{Platform: Auto})
			if dockerTried != tc.dockerTried {
				t.Errorf("docker tried: %v; want %v", dockerTried, tc.dockerTried)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v; want %v", err, tc.wantErr)
				}
				for _, w := range tc.errHas {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if ch.Platform != tc.want || !ch.Auto {
				t.Errorf("choice %+v; want auto %s", ch, tc.want)
			}
			n := ch.Notice()
			if len(tc.noticeHas) == 0 && n != "" {
				t.Errorf("notice %q; want none when the local runtime runs", n)
			}
			for _, w := range tc.noticeHas {
				if !strings.Contains(n, w) {
					t.Errorf("notice %q does not say %q", n, w)
				}
			}
			if strings.Contains(n, "\n") {
				t.Errorf("notice %q is more than one line", n)
			}
		})
	}
}

func TestOpenExplicitDoesNotFallBack(t *testing.T) {
	o := openers{
		local: func(context.Context, Config) (Backend, string, error) {
			return nil, "", fmt.Errorf("%w: no cgroups", sandbox.ErrUnsupported)
		},
		docker: func(context.Context, Config) (Backend, string, error) {
			t.Error("docker opened for --platform local")
			return nil, "", errors.New("unreachable")
		},
	}
	_, ch, err := o.open(t.Context(), Config{Platform: "local", From: "--platform"})
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "platform local (chosen by --platform)") {
		t.Errorf("err = %v; want the local refusal naming where local was chosen", err)
	}
	if ch.Auto || ch.Platform != capability.Local {
		t.Errorf("choice %+v", ch)
	}
}

// TestOpenEveryPlatform: every platform Parse accepts reaches its own opener.
func TestOpenEveryPlatform(t *testing.T) {
	var got capability.Platform
	at := func(p capability.Platform) opener {
		return func(context.Context, Config) (Backend, string, error) {
			got = p
			return nil, "", errors.New("stop")
		}
	}
	o := openers{local: at(capability.Local), docker: at(capability.Docker), kubernetes: at(capability.Kubernetes),
		aws: at(capability.AWS), gcp: at(capability.GCP), azure: at(capability.Azure)}
	for _, p := range capability.Platforms {
		got = ""
		if _, _, err := o.open(t.Context(), Config{Platform: string(p)}); err == nil || got != p {
			t.Errorf("open(%s) reached %q, err %v; want its own opener", p, got, err)
		}
	}
}

func TestOpenKubernetes(t *testing.T) {
	// Neither a pod nor a kubeconfig.
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, _, err := Open(t.Context(), Config{Platform: "kubernetes"})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "no cluster found") {
		t.Errorf("no broker: err = %v; want ErrInvalid naming the broker URL", err)
	}
	b, ch, err := Open(t.Context(), Config{Platform: "kubernetes", Kubernetes: KubernetesConfig{BrokerURL: "https://broker.example", Namespace: "apps"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ch.Platform != capability.Kubernetes || b.Platform() != capability.Kubernetes {
		t.Errorf("choice %+v, backend platform %s", ch, b.Platform())
	}
}

func TestCapabilities(t *testing.T) {
	noEngine := fmt.Errorf("%w: no container engine found", sandbox.ErrUnsupported)
	o := openers{
		local: openLocal,
		docker: func(context.Context, Config) (Backend, string, error) {
			return nil, "", noEngine
		},
		kubernetes: openKubernetes,
		aws:        openAWS,
	}
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	for _, tc := range []struct {
		c        Config
		want     capability.Set
		instance bool
		text     string
	}{
		{Config{Platform: "docker"}, docker.Published(), false, "as airlock's docker backend publishes it; none can be opened here: unsupported: no container engine found"},
		{Config{Platform: "kubernetes"}, kubernetes.Published(), false, "as airlock's kubernetes backend publishes it"},
		{Config{Platform: "kubernetes", Kubernetes: KubernetesConfig{BrokerURL: "http://127.0.0.1:1", Namespace: "a"}}, kubernetes.Published(), true, "the kubernetes backend configured here"},
		{Config{Platform: "aws"}, awsb.Published(), false, "as airlock's aws backend publishes it; none can be opened here: invalid: aws.region is not set"},
		{Config{Platform: "aws", AWS: AWSConfig{Region: "eu-north-1", Image: "arn:aws:lambda:eu-north-1:123456789012:microvm-image:x",
			EgressConnector: "arn:aws:lambda:eu-north-1:123456789012:network-connector:deny", StateDir: t.TempDir()}},
			awsb.Published(), true, "the aws backend configured here: Lambda MicroVMs in eu-north-1"},
	} {
		set, src, err := o.capabilities(t.Context(), tc.c)
		if err != nil {
			t.Errorf("%s: %v", tc.c.Platform, err)
			continue
		}
		if !reflect.DeepEqual(set, tc.want) || src.Instance != tc.instance || !strings.HasPrefix(src.Text, tc.text) {
			t.Errorf("%s: source %+v; want instance %v, %q (set equal: %v)", tc.c.Platform, src, tc.instance, tc.text, reflect.DeepEqual(set, tc.want))
		}
	}
	// Auto with nothing to open: this host's probed local set, saying why nothing runs.
	o.local = func(context.Context, Config) (Backend, string, error) {
		return nil, "", fmt.Errorf("%w: not root: no subordinate ids", sandbox.ErrUnsupported)
	}
	set, src, err := o.capabilities(t.Context(), Config{Platform: Auto})
	wantText := "probed from this host; nothing can run sandboxes here: local: unsupported: not root: no subordinate ids; docker: unsupported: no container engine found"
	if err != nil || set.Platform != capability.Local || src.Instance || src.Text != wantText || !src.Choice.Auto {
		t.Errorf("auto, nothing opens: %v, source %+v; want the local probe, %q", err, src, wantText)
	}
	// Auto whose local runtime fails for another reason (its state dir): the probe, and why.
	o.local = func(context.Context, Config) (Backend, string, error) {
		return nil, "", fmt.Errorf("%w: stateDir: permission denied", sandbox.ErrInvalid)
	}
	set, src, err = o.capabilities(t.Context(), Config{Platform: Auto})
	wantText = "probed from this host; the local runtime cannot start here: invalid: stateDir: permission denied"
	if err != nil || set.Platform != capability.Local || src.Text != wantText {
		t.Errorf("auto, local fails: %v, source %+v; want the local probe, %q", err, src, wantText)
	}
	if _, _, err := o.capabilities(t.Context(), Config{Platform: "lambda"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("unknown platform: err = %v; want ErrInvalid", err)
	}
}

// TestPublishedSetsArePlatforms: every platform has a published set, complete and its own.
func TestPublishedSetsArePlatforms(t *testing.T) {
	for _, p := range capability.Platforms {
		set, err := Published(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if set.Platform != p {
			t.Errorf("Published(%s).Platform = %s", p, set.Platform)
		}
		for _, n := range capability.Names {
			st, ok := set.Entries[n]
			if !ok || (!st.Supported && st.Reason == "") {
				t.Errorf("%s: %s is %+v: every capability is published, every no with its reason", p, n, st)
			}
		}
	}
}

// TestOpenLocal opens the real local runtime (root): auto takes it, and its capability set is
// the instance's.
func TestOpenLocal(t *testing.T) {
	testutil.RequireRoot(t)
	bin, cleanup, err := testutil.Agent()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	t.Setenv("AIRLOCK_AGENT", bin)
	dir, err := os.MkdirTemp("", "pl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	c := Config{Platform: Auto, Local: LocalConfig{StateDir: dir}}
	b, ch, err := Open(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	want := b.Capabilities(t.Context())
	b.Close()
	if ch.Platform != capability.Local || !ch.Auto || ch.Notice() != "" {
		t.Errorf("choice %+v, notice %q; want auto local, silent", ch, ch.Notice())
	}
	set, src, err := Capabilities(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if !src.Instance || src.Choice.Platform != capability.Local || !reflect.DeepEqual(set, want) {
		t.Errorf("capabilities from %+v differ from the opened backend's", src)
	}
}

// capability.For still carries copies of the docker and kubernetes sets (its docs generator
// reads them) until they go: they must promise exactly what the backends publish.
func TestCapabilityCopiesAgree(t *testing.T) {
	for _, p := range []capability.Platform{capability.Docker, capability.Kubernetes} {
		copySet, err := capability.For(p)
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := Published(p)
		for _, n := range capability.Names {
			if copySet.Has(n) != pub.Has(n) {
				t.Errorf("%s %s: capability.For says %v, the backend publishes %v (%s)", p, n, copySet.Has(n), pub.Has(n), pub.Entries[n].Reason)
			}
		}
	}
}

// TestOpenAzure: without its config section azure is refused naming the first missing key;
// with it the backend opens (without reaching Azure) and says which group it drives, and the
// config file's keys reach it.
func TestOpenAzure(t *testing.T) {
	_, _, err := Open(t.Context(), Config{Platform: "azure"})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "azure.subscription") {
		t.Errorf("no azure section: err = %v; want ErrInvalid naming azure.subscription", err)
	}
	t.Setenv(EnvConfig, writeConfig(t, "platform: azure\nazure:\n  subscription: s\n  resourceGroup: rg\n  sandboxGroup: sg\n  region: westus2\n"))
	t.Setenv(EnvPlatform, "")
	c, err := Settings("", false)
	if err != nil {
		t.Fatal(err)
	}
	b, ch, err := Open(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Platform() != capability.Azure || !strings.Contains(ch.Engine, "sandbox group sg in s/rg (https://management.westus2.azuredevcompute.io)") {
		t.Errorf("opened %s, %q", b.Platform(), ch.Engine)
	}
}
