package schemagen

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	gjs "github.com/google/jsonschema-go/jsonschema"
	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/spec"
)

const moduleRoot = "../.."

// TestCommittedSchemasUpToDate is the drift test: the committed schema files must be exactly
// what the generator produces from the current types and comments.
func TestCommittedSchemasUpToDate(t *testing.T) {
	for _, f := range Files {
		want, err := Generate("..", f.Type)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(moduleRoot, f.Path))
		if err != nil {
			t.Fatalf("%s: %v\nregenerate with: go run ./spec/cmd/genschema (or go generate ./spec) and commit the result", f.Path, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: it differs from the spec Go types at line %d.\n"+
				"Regenerate with: go run ./spec/cmd/genschema (or go generate ./spec), then commit %s.",
				f.Path, firstDiffLine(got, want), f.Path)
		}
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := range min(len(la), len(lb)) {
		if !bytes.Equal(la[i], lb[i]) {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

func TestGenerateIndependentOfWorkingDirectory(t *testing.T) {
	a, err := Generate("..", spec.Stack{})
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs("..")
	t.Chdir(t.TempDir())
	b, err := Generate(abs, spec.Stack{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("output depends on the working directory")
	}
	if !bytes.Contains(a, []byte(`"description": "Stack is one file`)) {
		t.Fatal("descriptions from Go comments are missing")
	}
}

func TestGenerateNeedsComments(t *testing.T) {
	if _, err := Generate(t.TempDir(), spec.Stack{}); err == nil {
		t.Fatal("generated without the spec sources")
	}
}

func resolved(t *testing.T, file string) *gjs.Resolved {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(moduleRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	var s gjs.Schema
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	r, err := s.Resolve(&gjs.ResolveOptions{ValidateDefaults: true})
	if err != nil {
		t.Fatalf("resolve %s: %v", file, err)
	}
	return r
}

func instance(t *testing.T, doc string) any {
	t.Helper()
	j := []byte(doc)
	if !json.Valid(j) {
		var err error
		if j, err = yaml.YAMLToJSON(j); err != nil {
			t.Fatal(err)
		}
	}
	var v any
	if err := json.Unmarshal(j, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

const head = "apiVersion: airlock.dev/v1alpha1\nsandboxes:\n"

// TestStackSchemaAgreesWithParser checks the committed schema against documents whose fate in
// the Go parser and validator is known: what Go accepts the schema accepts, and each structural
// refusal the schema can express, it expresses.
func TestStackSchemaAgreesWithParser(t *testing.T) {
	rs := resolved(t, "schema/stack.schema.json")
	for _, name := range []string{"stack.yaml", "stack.json"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := rs.Validate(instance(t, string(data))); err != nil {
			t.Errorf("schema refuses testdata/%s: %v", name, err)
		}
	}
	cases := []struct {
		name  string
		doc   string
		valid bool
	}{
		{"image string", head + "- {id: a, image: host}\n", true},
		{"image object", head + "- {id: a, image: {dir: ./root}}\n", true},
		{"quantity number", head + "- {id: a, image: host, limits: {cpu: 0.5, memory: 1Gi}}\n", true},
		{"kind omitted", head + "- {id: a, image: python:3.12}\n", true},
		{"unknown nested field", head + "- {id: a, image: host, limits: {cpuu: 1}}\n", false},
		{"unknown image field", head + "- {id: a, image: {hots: true}}\n", false},
		{"empty image object", head + "- {id: a, image: {}}\n", false},
		{"empty image string", head + "- {id: a, image: \"\"}\n", false},
		{"image number", head + "- {id: a, image: 3}\n", false},
		{"image missing", head + "- {id: a}\n", false},
		{"id pattern", head + "- {id: a b, image: host}\n", false},
		{"egress mode enum", head + "- {id: a, image: host, egress: {mode: public}}\n", false},
		{"egress mode open", head + "- {id: a, image: host, egress: {mode: open}}\n", true},
		{"runtime enum", head + "- {id: a, image: host, runtime: kata}\n", false},
		{"quantity pattern", head + "- {id: a, image: host, limits: {memory: 512MB}}\n", false},
		{"maxProcesses minimum", head + "- {id: a, image: host, limits: {maxProcesses: 0}}\n", false},
		{"port range", head + "- {id: a, image: host, previewPorts: [70000]}\n", false},
		{"port duplicate", head + "- {id: a, image: host, previewPorts: [80, 80]}\n", false},
		{"env name", head + "- {id: a, image: host, env: {1A: x}}\n", false},
		{"workdir relative", head + "- {id: a, image: host, workdir: work}\n", false},
		{"lifetime minimum", head + "- {id: a, image: host, session: {maxLifetimeSeconds: 0}}\n", false},
		{"apiVersion const", "apiVersion: v1\nsandboxes:\n- {id: a, image: host}\n", false},
		{"kind enum", "apiVersion: airlock.dev/v1alpha1\nkind: Pod\nsandboxes:\n- {id: a, image: host}\n", false},
		{"no sandboxes", "apiVersion: airlock.dev/v1alpha1\nsandboxes: []\n", false},
		{"workload id", head + "- {id: a, image: host}\nworkloads: [{id: \"w w\"}]\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			schemaErr := rs.Validate(instance(t, tc.doc))
			if (schemaErr == nil) != tc.valid {
				t.Fatalf("schema valid=%v (%v), want %v", schemaErr == nil, schemaErr, tc.valid)
			}
			st, err := spec.ParseStack([]byte(tc.doc))
			goValid := err == nil && len(st.Validate()) == 0
			if goValid != tc.valid {
				t.Fatalf("Go valid=%v (%v), want %v: schema and Go disagree", goValid, err, tc.valid)
			}
		})
	}
}

func TestSandboxSchema(t *testing.T) {
	rs := resolved(t, "schema/sandbox.schema.json")
	if err := rs.Validate(instance(t, "id: a\nimage: ./root\nlimits: {cpu: 250m}\n")); err != nil {
		t.Fatalf("valid sandbox refused: %v", err)
	}
	for _, bad := range []string{"id: a\nimage: host\napiVersion: x\n", "id: a\nimage: host\nsession: {idle: 1}\n"} {
		if err := rs.Validate(instance(t, bad)); err == nil {
			t.Errorf("schema accepted %q", bad)
		}
	}
}

// TestQuantityPatternAgreesWithParser: every quantity the schema's pattern accepts, Kubernetes
// parses, and the other way round, over a set of tricky spellings.
func TestQuantityPatternAgreesWithParser(t *testing.T) {
	rs := resolved(t, "schema/sandbox.schema.json")
	for _, q := range []string{"1", "250m", "0.5", ".5", "5.", "1e3", "1E3", "1E", "2Ei", "1Ki", "+1", "-1", "1.5Gi",
		"1k", "1K", "1KB", "1e-3", "1E+3", "++1", "1.2.3", "1Mi ", "٣", "1 Mi", "Mi", "", "e3", "1e", "1e3.5", "1ei", "0x10", "1mi"} {
		_, perr := spec.Quantity(q).Parse()
		err := rs.Validate(instance(t, "id: a\nimage: host\nlimits: {cpu: \""+q+"\"}\n"))
		if (err == nil) != (perr == nil) {
			t.Errorf("quantity %q: schema valid=%v, Go parse error %v", q, err == nil, perr)
		}
	}
}
