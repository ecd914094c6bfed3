// Package deploy_test holds the install manifests' tests: the generated CRD against the Go types, the Helm chart's lint and goldens, the pinned tools.
package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/operator"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/spec"
)

// crdPath is where controller-gen writes the Sandbox CRD: the chart's crds/ (helm installs it
// before the templates); deploy/base gets it through the rendered chart.
const crdPath = "deploy/helm/airlock/crds/airlock.dev_sandboxes.yaml"

// TestCRDGenerated: the committed CRD is controller-gen's output for operator/api/v1alpha1 (and
// the spec types it embeds). -update rewrites it.
func TestCRDGenerated(t *testing.T) {
	root := repoRoot(t)
	gen := tool(t, "controller-gen", "sigs.k8s.io/controller-tools/cmd/controller-gen")
	out := t.TempDir()
	run(t, root, gen, "crd:crdVersions=v1", "paths=./operator/api/...", "output:crd:artifacts:config="+out)
	got, err := os.ReadFile(filepath.Join(out, filepath.Base(crdPath)))
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(filepath.Join(root, crdPath), got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(filepath.Join(root, crdPath))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: the Go types or their markers changed; run go test ./deploy -run TestCRDGenerated -update", crdPath)
	}
}

// sandboxCRD is the committed CRD's v1alpha1 schema, as the API server holds it: validated,
// structural, with its CEL rules compiled.
type sandboxCRD struct {
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
	cel        *cel.Validator
	v1         *apiextensionsv1.CustomResourceDefinition
}

func loadCRD(t *testing.T) *sandboxCRD {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), crdPath))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	var internal apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&crd, &internal, nil); err != nil {
		t.Fatal(err)
	}
	internal.Status.StoredVersions = []string{v1alpha1.Version} // the API server's bookkeeping
	// The API server's own admission of a CRD: structural schema, defaults valid and pruned, CEL
	// rules compile within the cost budget, printer columns, names.
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD: %v", errs.ToAggregate())
	}
	// The internal form holds a schema shared by every version at the top.
	if len(internal.Spec.Versions) != 1 || internal.Spec.Validation == nil {
		t.Fatalf("want one version and a schema, got %d versions", len(internal.Spec.Versions))
	}
	props := internal.Spec.Validation.OpenAPIV3Schema
	s, err := structuralschema.NewStructural(props)
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		t.Fatal(err)
	}
	return &sandboxCRD{structural: s, validator: v, cel: cel.NewValidator(s, true, celconfig.PerCallLimit), v1: &crd}
}

// admit does to obj what the API server does on create: prune unknown fields, default, then
// validate (OpenAPI, then CEL). It returns the pruned field paths and the errors.
func (c *sandboxCRD) admit(obj map[string]any) (pruned []string, errs field.ErrorList) {
	pruned = pruning.PruneWithOptions(obj, c.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	structuraldefaulting.Default(obj, c.structural)
	errs = apiservervalidation.ValidateCustomResource(nil, obj, c.validator)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, c.structural, obj)...)
	celErrs, _ := c.cel.Validate(context.Background(), nil, c.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return pruned, append(errs, celErrs...)
}

func toMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	// As the API server decodes: whole numbers are int64.
	if err := utiljson.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// fullSandbox sets every field of the declaration (a field added to spec.Sandbox but missing from
// the schema would be pruned: TestCRDKeepsEveryField checks that it is set here too).
func fullSandbox() *v1alpha1.Sandbox {
	n := func(v int64) *int64 { return &v }
	f := false
	sb := &v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{PoolSize: 3, Sandbox: spec.Sandbox{
		ID:           "py",
		Image:        spec.Image{Ref: "python:3.12"},
		Limits:       spec.Limits{CPU: "500m", Memory: "256Mi", Disk: "2Gi", MaxProcesses: n(64)},
		Egress:       spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"pypi.org"}},
		Session:      spec.Session{MaxLifetimeSeconds: n(120), IdleTimeoutSeconds: n(60), Reconnect: &f},
		Labels:       map[string]string{"team": "a"},
		PreviewPorts: []int{8080},
		Env:          map[string]string{"A": "b"},
		Workdir:      "/work",
		Runtime:      spec.RuntimeGVisor,
		HostedBy:     "web",
	}}}
	sb.APIVersion, sb.Kind = v1alpha1.GroupVersion.String(), v1alpha1.Kind
	sb.Name, sb.Namespace = "py", "team-a"
	return sb
}

// TestCRDKeepsEveryField: a Sandbox with every declaration field set goes through the API
// server's pruning, defaulting and validation unchanged: the schema covers the whole Go type.
func TestCRDKeepsEveryField(t *testing.T) {
	c := loadCRD(t)
	sb := fullSandbox()
	assertAllSet(t, reflect.ValueOf(sb.Spec.Sandbox), "spec")
	obj := toMap(t, sb)
	want := toMap(t, sb)
	pruned, errs := c.admit(obj)
	if len(pruned) > 0 {
		t.Errorf("the schema drops fields of the Go type: %v", pruned)
	}
	if len(errs) > 0 {
		t.Errorf("a valid Sandbox is refused: %v", errs.ToAggregate())
	}
	delete(want, "status") // the Go type writes an empty status; the status subresource ignores it
	delete(obj, "status")
	if !reflect.DeepEqual(obj, want) {
		t.Errorf("admission changed the object:\n got %v\nwant %v", obj, want)
	}
}

func assertAllSet(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	for i := 0; i < v.NumField(); i++ {
		f, p := v.Field(i), path+"."+v.Type().Field(i).Name
		if f.IsZero() {
			t.Errorf("fullSandbox leaves %s unset: set it so the CRD is checked to keep it", p)
		}
		if f.Kind() == reflect.Struct && v.Type().Field(i).Name != "Image" {
			assertAllSet(t, f, p)
		}
	}
}

// TestCRDDefaultsAreTheDeclarationDefaults: what the API server fills in is exactly what
// spec.ApplyDefaults fills in (the idle timeout excepted: its default depends on the lifetime,
// which a schema default cannot express, so it stays unset and the operator defaults it).
func TestCRDDefaultsAreTheDeclarationDefaults(t *testing.T) {
	c := loadCRD(t)
	sb := &v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{PoolSize: 1, Sandbox: spec.Sandbox{Image: spec.Image{Ref: "python:3.12"}}}}
	sb.APIVersion, sb.Kind, sb.Name = v1alpha1.GroupVersion.String(), v1alpha1.Kind, "py"
	obj := map[string]any{"apiVersion": sb.APIVersion, "kind": sb.Kind, "metadata": map[string]any{"name": "py"},
		"spec": map[string]any{"poolSize": int64(1), "image": map[string]any{"ref": "python:3.12"}}}
	if _, errs := c.admit(obj); len(errs) > 0 {
		t.Fatalf("minimal Sandbox refused: %v", errs.ToAggregate())
	}
	var got v1alpha1.Sandbox
	b, _ := json.Marshal(obj)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := sb.Spec.Sandbox
	want.ApplyDefaults()
	want.Session.IdleTimeoutSeconds = nil
	if !reflect.DeepEqual(got.Spec.Sandbox, want) {
		t.Errorf("CRD defaults differ from spec.ApplyDefaults:\n got %+v\nwant %+v", got.Spec.Sandbox, want)
	}
	// Defaulting twice changes nothing: the operator's own defaulting of what the server stored
	// gives the same declaration (and the same pod template) as before the CRD had defaults.
	d := got.Spec.Sandbox
	d.ApplyDefaults()
	full := sb.Spec.Sandbox
	full.ApplyDefaults()
	if !reflect.DeepEqual(d, full) {
		t.Errorf("stored-then-defaulted %+v != defaulted %+v", d, full)
	}
}

// TestCRDRefuses: what the schema refuses at admission, each naming the field.
func TestCRDRefuses(t *testing.T) {
	c := loadCRD(t)
	max := operator.MaxPoolSize
	tests := []struct {
		name  string
		edit  func(spec map[string]any, obj map[string]any)
		field string // in the error
	}{
		{"pool size above the operator's bound", func(s, _ map[string]any) { s["poolSize"] = int64(max + 1) }, "spec.poolSize"},
		{"negative pool size", func(s, _ map[string]any) { s["poolSize"] = int64(-1) }, "spec.poolSize"},
		{"no pool size", func(s, _ map[string]any) { delete(s, "poolSize") }, "spec.poolSize"},
		{"no image", func(s, _ map[string]any) { delete(s, "image") }, "spec.image"},
		{"image string form", func(s, _ map[string]any) { s["image"] = "python:3.12" }, "spec.image"},
		{"two image sources", func(s, _ map[string]any) { s["image"] = map[string]any{"ref": "a", "dir": "/x"} }, "spec.image"},
		{"empty image", func(s, _ map[string]any) { s["image"] = map[string]any{} }, "spec.image"},
		{"id differs from name", func(s, _ map[string]any) { s["id"] = "other" }, "spec.id must equal metadata.name"},
		{"bad id", func(s, o map[string]any) { s["id"] = "a b" }, "spec.id"},
		{"unknown egress mode", func(s, _ map[string]any) { s["egress"] = map[string]any{"mode": "sometimes"} }, "spec.egress.mode"},
		{"domains without allowDomains", func(s, _ map[string]any) {
			s["egress"] = map[string]any{"mode": "allow", "domains": []any{"a.example"}}
		}, "spec.egress"},
		{"allowDomains without domains", func(s, _ map[string]any) { s["egress"] = map[string]any{"mode": "allowDomains"} }, "spec.egress"},
		{"malformed quantity", func(s, _ map[string]any) { s["limits"] = map[string]any{"memory": "lots"} }, "spec.limits.memory"},
		{"zero processes", func(s, _ map[string]any) { s["limits"] = map[string]any{"maxProcesses": int64(0)} }, "spec.limits.maxProcesses"},
		{"idle beyond lifetime", func(s, _ map[string]any) {
			s["session"] = map[string]any{"maxLifetimeSeconds": int64(10), "idleTimeoutSeconds": int64(20)}
		}, "spec.session"},
		{"zero lifetime", func(s, _ map[string]any) { s["session"] = map[string]any{"maxLifetimeSeconds": int64(0)} }, "spec.session.maxLifetimeSeconds"},
		{"unknown runtime", func(s, _ map[string]any) { s["runtime"] = "kata" }, "spec.runtime"},
		{"relative workdir", func(s, _ map[string]any) { s["workdir"] = "work" }, "spec.workdir"},
		{"port 0", func(s, _ map[string]any) { s["previewPorts"] = []any{int64(0)} }, "spec.previewPorts[0]"},
		{"duplicate ports", func(s, _ map[string]any) { s["previewPorts"] = []any{int64(80), int64(80)} }, "spec.previewPorts[1]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obj := map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.Kind, "metadata": map[string]any{"name": "py"},
				"spec": map[string]any{"poolSize": int64(1), "image": map[string]any{"ref": "python:3.12"}}}
			tc.edit(obj["spec"].(map[string]any), obj)
			_, errs := c.admit(obj)
			if len(errs) == 0 {
				t.Fatalf("admitted: %v", obj["spec"])
			}
			if msg := errs.ToAggregate().Error(); !strings.Contains(msg, tc.field) {
				t.Errorf("error does not name %q: %s", tc.field, msg)
			}
		})
	}
}

// TestCRDMatchesOperator: the bounds and names the CRD states are the operator's own constants.
func TestCRDMatchesOperator(t *testing.T) {
	c := loadCRD(t)
	crd := c.v1
	if crd.Spec.Group != v1alpha1.Group || crd.Spec.Names.Plural != v1alpha1.Resource || crd.Spec.Names.Kind != v1alpha1.Kind {
		t.Errorf("CRD names %s/%s/%s, the Go API %s/%s/%s", crd.Spec.Group, crd.Spec.Names.Plural, crd.Spec.Names.Kind, v1alpha1.Group, v1alpha1.Resource, v1alpha1.Kind)
	}
	v := crd.Spec.Versions[0]
	if v.Name != v1alpha1.Version || v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("version %s: want %s with the status subresource", v.Name, v1alpha1.Version)
	}
	pool := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["poolSize"]
	if pool.Maximum == nil || int(*pool.Maximum) != operator.MaxPoolSize {
		t.Errorf("poolSize maximum %v, operator.MaxPoolSize %d", pool.Maximum, operator.MaxPoolSize)
	}
	q := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["limits"].Properties["memory"]
	if q.Pattern != spec.QuantityPattern {
		t.Errorf("quantity pattern %q, spec.QuantityPattern %q", q.Pattern, spec.QuantityPattern)
	}
	var modes []string
	for _, e := range v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["egress"].Properties["mode"].Enum {
		modes = append(modes, strings.Trim(string(e.Raw), `"`))
	}
	var want []string
	for _, m := range spec.EgressModes {
		want = append(want, string(m))
	}
	if !reflect.DeepEqual(modes, want) {
		t.Errorf("egress modes %v, spec.EgressModes %v", modes, want)
	}
	var rts []string
	for _, e := range v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["runtime"].Enum {
		rts = append(rts, strings.Trim(string(e.Raw), `"`))
	}
	want = want[:0]
	for _, r := range spec.Runtimes {
		want = append(want, string(r))
	}
	if !reflect.DeepEqual(rts, want) {
		t.Errorf("runtimes %v, spec.Runtimes %v", rts, want)
	}
	// Every condition reason is named in the conditions' description and documented.
	desc := v.Schema.OpenAPIV3Schema.Properties["status"].Properties["conditions"].Description
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs/kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{v1alpha1.ReasonAccepted, v1alpha1.ReasonInvalidDeclaration, v1alpha1.ReasonUnsupported,
		v1alpha1.ReasonRuntimeClassAbsent, v1alpha1.ReasonKeysUnavailable, v1alpha1.ReasonPoolReady,
		v1alpha1.ReasonPoolFilling, v1alpha1.ReasonPoolEmpty} {
		if !strings.Contains(desc, r) {
			t.Errorf("condition reason %s is not in the CRD's conditions description", r)
		}
		if !bytes.Contains(doc, []byte("`"+r+"`")) {
			t.Errorf("condition reason %s is not documented in docs/kubernetes.md", r)
		}
	}
}

// TestCRDAdmitsGoWrittenSandbox: a Sandbox written by a Go client with no id sends "id": "" (the
// field has no omitempty: a stack file requires it); the schema admits it as "left out".
func TestCRDAdmitsGoWrittenSandbox(t *testing.T) {
	c := loadCRD(t)
	sb := &v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{PoolSize: 1, Sandbox: spec.Sandbox{Image: spec.Image{Ref: "python:3.12"}}}}
	sb.APIVersion, sb.Kind, sb.Name = v1alpha1.GroupVersion.String(), v1alpha1.Kind, "py"
	obj := toMap(t, sb)
	if id, ok := obj["spec"].(map[string]any)["id"]; !ok || id != "" {
		t.Fatalf("the Go type no longer writes an empty id (%v, %v): this test guards nothing", id, ok)
	}
	delete(obj, "status")
	if _, errs := c.admit(obj); len(errs) > 0 {
		t.Fatalf("a Go-written Sandbox without an id is refused: %v", errs.ToAggregate())
	}
}
