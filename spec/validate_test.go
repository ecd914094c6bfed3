package spec

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func i64(v int64) *int64 { return &v }

// validStack is a stack that passes every rule and uses most fields, so each case below breaks
// exactly what it names.
func validStack() *Stack {
	return &Stack{
		APIVersion: APIVersion,
		Kind:       StackKind,
		Sandboxes: []Sandbox{
			{
				ID:    "py",
				Image: Image{Ref: "docker.io/library/python:3.12"},
				Limits: Limits{
					CPU: "250m", Memory: "256Mi", Disk: "2Gi", MaxProcesses: i64(64),
				},
				Egress:       Egress{Mode: EgressAllowDomains, Domains: []string{"pypi.org", "*.pythonhosted.org"}},
				Session:      Session{MaxLifetimeSeconds: i64(600), IdleTimeoutSeconds: i64(60), Reconnect: ptr(false)},
				Labels:       map[string]string{"team": "ml", "airlock.dev/tier": "free"},
				PreviewPorts: []int{8000, 8080},
				Env:          map[string]string{"PYTHONUNBUFFERED": "1", "_X": ""},
				Workdir:      "/work",
				Runtime:      RuntimeGVisor,
			},
			{ID: "web", Image: Image{Host: true}, HostedBy: "app"},
		},
		Workloads: []Workload{{ID: "app", Image: "ghcr.io/acme/app:1", Hosts: []string{"web"}}},
	}
}

type ruleCase struct {
	name   string
	mutate func(st *Stack)
	want   []string // "path rule", in order
}

func sb0(f func(s *Sandbox)) func(*Stack) { return func(st *Stack) { f(&st.Sandboxes[0]) } }

var ruleCases = []ruleCase{
	{"valid", func(*Stack) {}, nil},
	{"minimal valid sandbox", func(st *Stack) { st.Sandboxes[0] = Sandbox{ID: "py", Image: Image{Dir: "./rootfs"}} }, nil},
	{"kind may be empty", func(st *Stack) { st.Kind = "" }, nil},

	{"apiVersion wrong", func(st *Stack) { st.APIVersion = "airlock.dev/v1" }, []string{"apiVersion apiVersion"}},
	{"apiVersion missing", func(st *Stack) { st.APIVersion = "" }, []string{"apiVersion apiVersion"}},
	{"kind wrong", func(st *Stack) { st.Kind = "Sandbox" }, []string{"kind kind"}},
	{"no sandboxes", func(st *Stack) { st.Sandboxes = nil; st.Workloads = nil }, []string{"sandboxes sandboxes.required"}},

	{"id empty", sb0(func(s *Sandbox) { s.ID = "" }), []string{"sandboxes[0].id id.format"}},
	{"id bad char", sb0(func(s *Sandbox) { s.ID = "py.3" }), []string{"sandboxes[0].id id.format"}},
	{"id too long", sb0(func(s *Sandbox) { s.ID = strings.Repeat("a", 65) }), []string{"sandboxes[0].id id.format"}},
	{"id 64 ok", sb0(func(s *Sandbox) { s.ID = strings.Repeat("a", 64) }), nil},
	{"id duplicate", func(st *Stack) { st.Sandboxes[1].ID = "py"; st.Workloads[0].Hosts = []string{"py"} }, []string{"sandboxes[1].id id.duplicate"}},

	{"image missing", sb0(func(s *Sandbox) { s.Image = Image{} }), []string{"sandboxes[0].image image.required"}},
	{"image two sources", sb0(func(s *Sandbox) { s.Image.Host = true }), []string{"sandboxes[0].image image.oneOf"}},
	{"image ref with space", sb0(func(s *Sandbox) { s.Image.Ref = "python 3" }), []string{"sandboxes[0].image.ref image.ref"}},
	{"image dir with NUL", sb0(func(s *Sandbox) { s.Image = Image{Dir: "/a\x00b"} }), []string{"sandboxes[0].image.dir image.path"}},
	{"image snapshot name", sb0(func(s *Sandbox) { s.Image = Image{Snapshot: "a/b"} }), []string{"sandboxes[0].image.snapshot image.snapshot"}},

	{"cpu syntax", sb0(func(s *Sandbox) { s.Limits.CPU = "lots" }), []string{"sandboxes[0].limits.cpu quantity.syntax"}},
	{"cpu bare suffix", sb0(func(s *Sandbox) { s.Limits.CPU = "m" }), []string{"sandboxes[0].limits.cpu quantity.syntax"}},
	{"memory bare suffix", sb0(func(s *Sandbox) { s.Limits.Memory = "Mi" }), []string{"sandboxes[0].limits.memory quantity.syntax"}},
	{"cpu zero", sb0(func(s *Sandbox) { s.Limits.CPU = "0" }), []string{"sandboxes[0].limits.cpu quantity.positive"}},
	{"cpu negative", sb0(func(s *Sandbox) { s.Limits.CPU = "-1" }), []string{"sandboxes[0].limits.cpu quantity.positive"}},
	{"cpu below a millicore", sb0(func(s *Sandbox) { s.Limits.CPU = "0.0005" }), []string{"sandboxes[0].limits.cpu cpu.millicores"}},
	{"cpu fraction of a millicore", sb0(func(s *Sandbox) { s.Limits.CPU = "1500500u" }), []string{"sandboxes[0].limits.cpu cpu.millicores"}},
	{"cpu decimal ok", sb0(func(s *Sandbox) { s.Limits.CPU = "0.5" }), nil},
	{"cpu too large", sb0(func(s *Sandbox) { s.Limits.CPU = "10E" }), []string{"sandboxes[0].limits.cpu quantity.tooLarge"}},
	{"memory syntax", sb0(func(s *Sandbox) { s.Limits.Memory = "512MB" }), []string{"sandboxes[0].limits.memory quantity.syntax"}},
	{"memory zero", sb0(func(s *Sandbox) { s.Limits.Memory = "0Mi" }), []string{"sandboxes[0].limits.memory quantity.positive"}},
	{"memory fractional bytes", sb0(func(s *Sandbox) { s.Limits.Memory = "2000000.5" }), []string{"sandboxes[0].limits.memory quantity.wholeBytes"}},
	{"memory below minimum", sb0(func(s *Sandbox) { s.Limits.Memory = "1023Ki" }), []string{"sandboxes[0].limits.memory quantity.minimum"}},
	{"memory at minimum", sb0(func(s *Sandbox) { s.Limits.Memory = "1Mi" }), nil},
	{"memory too large", sb0(func(s *Sandbox) { s.Limits.Memory = "8Ei" }), []string{"sandboxes[0].limits.memory quantity.tooLarge"}},
	{"disk syntax", sb0(func(s *Sandbox) { s.Limits.Disk = "1 Gi" }), []string{"sandboxes[0].limits.disk quantity.syntax"}},
	{"disk below minimum", sb0(func(s *Sandbox) { s.Limits.Disk = "1k" }), []string{"sandboxes[0].limits.disk quantity.minimum"}},
	{"maxProcesses zero", sb0(func(s *Sandbox) { s.Limits.MaxProcesses = i64(0) }), []string{"sandboxes[0].limits.maxProcesses maxProcesses.positive"}},
	{"maxProcesses negative", sb0(func(s *Sandbox) { s.Limits.MaxProcesses = i64(-5) }), []string{"sandboxes[0].limits.maxProcesses maxProcesses.positive"}},
	{"maxProcesses one", sb0(func(s *Sandbox) { s.Limits.MaxProcesses = i64(1) }), nil},

	{"egress mode unknown", sb0(func(s *Sandbox) { s.Egress = Egress{Mode: "wide"} }), []string{"sandboxes[0].egress.mode egress.mode"}},
	{"egress mode case matters", sb0(func(s *Sandbox) { s.Egress = Egress{Mode: "Deny"} }), []string{"sandboxes[0].egress.mode egress.mode"}},
	{"egress allow ok", sb0(func(s *Sandbox) { s.Egress = Egress{Mode: EgressAllow} }), nil},
	{"egress open ok", sb0(func(s *Sandbox) { s.Egress = Egress{Mode: EgressOpen} }), nil},
	{"egress domains with open", sb0(func(s *Sandbox) { s.Egress.Mode = EgressOpen }), []string{"sandboxes[0].egress.domains egress.domainsWithoutAllowDomains"}},
	{"egress allowDomains empty", sb0(func(s *Sandbox) { s.Egress.Domains = nil }), []string{"sandboxes[0].egress.domains egress.domainsEmpty"}},
	{"egress domains with deny", sb0(func(s *Sandbox) { s.Egress.Mode = EgressDeny }), []string{"sandboxes[0].egress.domains egress.domainsWithoutAllowDomains"}},
	{"egress domains with default mode", sb0(func(s *Sandbox) { s.Egress.Mode = "" }), []string{"sandboxes[0].egress.domains egress.domainsWithoutAllowDomains"}},
	{"domain syntax", sb0(func(s *Sandbox) { s.Egress.Domains = []string{"bad_name.com"} }), []string{"sandboxes[0].egress.domains[0] domain.syntax"}},
	{"domain ipv4", sb0(func(s *Sandbox) { s.Egress.Domains = []string{"ok.com", "10.0.0.1"} }), []string{"sandboxes[0].egress.domains[1] domain.ipLiteral"}},
	{"domain ipv6 bracketed", sb0(func(s *Sandbox) { s.Egress.Domains = []string{"[::1]"} }), []string{"sandboxes[0].egress.domains[0] domain.ipLiteral"}},
	{"domain wildcard inside", sb0(func(s *Sandbox) { s.Egress.Domains = []string{"a.*.com"} }), []string{"sandboxes[0].egress.domains[0] domain.wildcard"}},
	{"domain wildcard tld", sb0(func(s *Sandbox) { s.Egress.Domains = []string{"*.com"} }), []string{"sandboxes[0].egress.domains[0] domain.wildcard"}},

	{"lifetime zero", sb0(func(s *Sandbox) { s.Session.MaxLifetimeSeconds = i64(0) }), []string{"sandboxes[0].session.maxLifetimeSeconds session.lifetimePositive"}},
	{"idle zero", sb0(func(s *Sandbox) { s.Session.IdleTimeoutSeconds = i64(0) }), []string{"sandboxes[0].session.idleTimeoutSeconds session.idlePositive"}},
	{"idle exceeds lifetime", sb0(func(s *Sandbox) { s.Session.IdleTimeoutSeconds = i64(601) }), []string{"sandboxes[0].session.idleTimeoutSeconds session.idleExceedsLifetime"}},
	{"idle equals lifetime", sb0(func(s *Sandbox) { s.Session.IdleTimeoutSeconds = i64(600) }), nil},
	{"idle exceeds default lifetime", sb0(func(s *Sandbox) { s.Session = Session{IdleTimeoutSeconds: i64(3601)} }), []string{"sandboxes[0].session.idleTimeoutSeconds session.idleExceedsLifetime"}},
	{"short lifetime alone is valid", sb0(func(s *Sandbox) { s.Session = Session{MaxLifetimeSeconds: i64(30)} }), nil},

	{"label key", sb0(func(s *Sandbox) { s.Labels["-bad"] = "x" }), []string{"sandboxes[0].labels[-bad] label.key"}},
	{"label value", sb0(func(s *Sandbox) { s.Labels["team"] = "a b" }), []string{"sandboxes[0].labels[team] label.value"}},

	{"preview port zero", sb0(func(s *Sandbox) { s.PreviewPorts = []int{0} }), []string{"sandboxes[0].previewPorts[0] previewPort.range"}},
	{"preview port high", sb0(func(s *Sandbox) { s.PreviewPorts = []int{65535, 65536} }), []string{"sandboxes[0].previewPorts[1] previewPort.range"}},
	{"preview port duplicate", sb0(func(s *Sandbox) { s.PreviewPorts = []int{80, 81, 80} }), []string{"sandboxes[0].previewPorts[2] previewPort.duplicate"}},

	{"env name digit", sb0(func(s *Sandbox) { s.Env["1X"] = "" }), []string{"sandboxes[0].env[1X] env.name"}},
	{"env name equals", sb0(func(s *Sandbox) { s.Env["A=B"] = "" }), []string{"sandboxes[0].env[A=B] env.name"}},
	{"env value NUL", sb0(func(s *Sandbox) { s.Env["SECRET"] = "a\x00b" }), []string{"sandboxes[0].env[SECRET] env.value"}},

	{"workdir relative", sb0(func(s *Sandbox) { s.Workdir = "work" }), []string{"sandboxes[0].workdir workdir.absolute"}},
	{"workdir unclean", sb0(func(s *Sandbox) { s.Workdir = "/work/../etc" }), []string{"sandboxes[0].workdir workdir.absolute"}},
	{"workdir trailing slash", sb0(func(s *Sandbox) { s.Workdir = "/work/" }), []string{"sandboxes[0].workdir workdir.absolute"}},
	{"workdir root ok", sb0(func(s *Sandbox) { s.Workdir = "/" }), nil},

	{"runtime unknown", sb0(func(s *Sandbox) { s.Runtime = "kata" }), []string{"sandboxes[0].runtime runtime.unknown"}},
	{"hostedBy unknown", func(st *Stack) { st.Sandboxes[1].HostedBy = "ghost" }, []string{"sandboxes[1].hostedBy hostedBy.unknown"}},
	{"hostedBy without workloads", func(st *Stack) { st.Workloads = nil }, []string{"sandboxes[1].hostedBy hostedBy.unknown"}},

	{"workload id", func(st *Stack) { st.Workloads[0].ID = "a b"; st.Sandboxes[1].HostedBy = "a b" }, []string{"workloads[0].id workload.id"}},
	{"workload id duplicate", func(st *Stack) { st.Workloads = append(st.Workloads, Workload{ID: "app"}) }, []string{"workloads[1].id id.duplicate"}},
	{"workload hosts unknown", func(st *Stack) { st.Workloads[0].Hosts = []string{"web", "nope"} }, []string{"workloads[0].hosts[1] workload.hostsUnknown"}},
}

func summarize(errs []*FieldError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Path+" "+e.Rule)
	}
	return out
}

func TestStackValidateRules(t *testing.T) {
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			st := validStack()
			tc.mutate(st)
			got := st.Validate()
			if d := cmp.Diff(tc.want, summarize(got)); d != "" {
				t.Fatalf("rules (-want +got):\n%s\nerrors: %v", d, got)
			}
			for _, e := range got {
				if !errors.Is(e, ErrInvalid) {
					t.Errorf("%v does not wrap ErrInvalid", e)
				}
				if e.Message == "" {
					t.Errorf("%s: empty message", e.Rule)
				}
				if !strings.Contains(e.Error(), e.Path) || !strings.Contains(e.Error(), e.Rule) {
					t.Errorf("Error() %q lacks path or rule", e.Error())
				}
			}
		})
	}
}

// TestEveryRuleHasACase reads the Rule constants from the source so a new rule without a case fails.
func TestEveryRuleHasACase(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{RuleIDImmutable: true} // covered by TestCheckUpdate
	for _, tc := range ruleCases {
		for _, w := range tc.want {
			covered[strings.Fields(w)[1]] = true
		}
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		vs, ok := node.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "Rule") {
			return true
		}
		n++
		rule, err := strconv.Unquote(vs.Values[0].(*ast.BasicLit).Value)
		if err != nil {
			t.Fatal(err)
		}
		if !covered[rule] {
			t.Errorf("rule %s (%s) has no case in ruleCases", rule, vs.Names[0].Name)
		}
		return true
	})
	if n < 30 {
		t.Fatalf("found only %d Rule constants; did errors.go move?", n)
	}
}

func TestSandboxIDOnErrors(t *testing.T) {
	st := validStack()
	st.Sandboxes[0].Limits.CPU = "x"
	st.Sandboxes[1].ID = "bad id"
	st.Workloads[0].Hosts = nil
	errs := st.Validate()
	want := []string{"py sandboxes[0].limits.cpu", " sandboxes[1].id"}
	var got []string
	for _, e := range errs {
		got = append(got, e.SandboxID+" "+e.Path)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

// TestValidateOrder checks the documented order: stack fields, then sandboxes in order with
// fields in declaration order (map keys sorted), then workloads; and that it is the same every time.
func TestValidateOrder(t *testing.T) {
	st := validStack()
	st.APIVersion = "v0"
	st.Sandboxes = append(st.Sandboxes, Sandbox{ID: "py", HostedBy: "nope", Workdir: "rel", Runtime: "x"})
	s := &st.Sandboxes[0]
	s.Runtime = "bad"
	s.Env = map[string]string{"9": "", "1": "", "5": "", "A": "\x00"}
	s.Limits.MaxProcesses = i64(0)
	s.Limits.CPU = "0"
	s.ID = "p y"
	s.PreviewPorts = []int{0}
	s.Session.IdleTimeoutSeconds = i64(-1)
	s.Egress.Domains = []string{"1.1.1.1", "*.x"}
	st.Workloads = append(st.Workloads, Workload{ID: "app", Hosts: []string{"zz"}})
	want := []string{
		"apiVersion apiVersion",
		"sandboxes[0].id id.format",
		"sandboxes[0].limits.cpu quantity.positive",
		"sandboxes[0].limits.maxProcesses maxProcesses.positive",
		"sandboxes[0].egress.domains[0] domain.ipLiteral",
		"sandboxes[0].egress.domains[1] domain.wildcard",
		"sandboxes[0].session.idleTimeoutSeconds session.idlePositive",
		"sandboxes[0].previewPorts[0] previewPort.range",
		"sandboxes[0].env[1] env.name",
		"sandboxes[0].env[5] env.name",
		"sandboxes[0].env[9] env.name",
		"sandboxes[0].env[A] env.value",
		"sandboxes[0].runtime runtime.unknown",
		"sandboxes[2].image image.required",
		"sandboxes[2].workdir workdir.absolute",
		"sandboxes[2].runtime runtime.unknown",
		"sandboxes[2].hostedBy hostedBy.unknown",
		"workloads[1].id id.duplicate",
		"workloads[1].hosts[0] workload.hostsUnknown",
	}
	for range 20 {
		if d := cmp.Diff(want, summarize(st.Validate())); d != "" {
			t.Fatalf("(-want +got):\n%s", d)
		}
	}
}

func TestSandboxValidatePrefix(t *testing.T) {
	s := Sandbox{ID: "a", Image: Image{Host: true}, Workdir: "x", HostedBy: "anything"}
	if got := summarize(s.Validate("")); !slices.Equal(got, []string{"workdir workdir.absolute"}) {
		t.Fatalf("no prefix: %v", got)
	}
	if got := summarize(s.Validate("spec.sandbox")); !slices.Equal(got, []string{"spec.sandbox.workdir workdir.absolute"}) {
		t.Fatalf("prefix: %v", got)
	}
}

func TestValidateDoesNotLeakEnvValues(t *testing.T) {
	s := Sandbox{ID: "a", Image: Image{Host: true}, Env: map[string]string{"TOKEN": "hunter2\x00"}}
	errs := s.Validate("")
	if len(errs) != 1 || strings.Contains(errs[0].Error(), "hunter2") || errs[0].Value != "" {
		t.Fatalf("env value leaked or missing: %v", errs)
	}
}

func TestCheckUpdate(t *testing.T) {
	old := &validStack().Sandboxes[0]
	same := &validStack().Sandboxes[0]
	same.Limits.CPU = "2"
	if errs := CheckUpdate(old, same); len(errs) != 0 {
		t.Fatalf("changing limits refused: %v", errs)
	}
	renamed := &validStack().Sandboxes[0]
	renamed.ID = "py2"
	errs := CheckUpdate(old, renamed)
	if got := summarize(errs); !slices.Equal(got, []string{"id id.immutable"}) {
		t.Fatalf("got %v", got)
	}
	if errs[0].Value != "py2" || errs[0].SandboxID != "py" || !errors.Is(errs[0], ErrInvalid) {
		t.Fatalf("bad error %+v", errs[0])
	}
}

func TestValidateID(t *testing.T) {
	for _, ok := range []string{"a", "A-z_09", strings.Repeat("x", 64)} {
		if err := ValidateID(ok); err != nil {
			t.Errorf("ValidateID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "a/b", "é", strings.Repeat("x", 65), "a\n"} {
		err := ValidateID(bad)
		if err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestFieldErrorText(t *testing.T) {
	e := &FieldError{Path: "sandboxes[1].limits.memory", Value: "1x", Rule: RuleQuantitySyntax, Message: "not a quantity"}
	want := `sandboxes[1].limits.memory: not a quantity (got "1x"; rule quantity.syntax)`
	if e.Error() != want {
		t.Fatalf("got %q want %q", e.Error(), want)
	}
}
