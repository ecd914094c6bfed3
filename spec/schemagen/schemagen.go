// Package schemagen builds the JSON Schemas of the declaration from the spec Go types.
package schemagen

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/invopop/jsonschema"

	"github.com/airlock-sandbox/airlock/spec"
)

// It lives outside package spec so that binaries which only parse declarations do not link
// the schema reflector.

// BaseID is the base of the schemas' $id.
const BaseID = "https://airlock.dev/schema"

// Files maps each committed schema file (relative to the module root) to the Go type it describes.
var Files = []struct {
	Path string
	Type any
}{
	{"schema/stack.schema.json", spec.Stack{}},
	{"schema/sandbox.schema.json", spec.Sandbox{}},
}

// Generate returns the schema of v (spec.Stack{} or spec.Sandbox{}), indented, with a trailing
// newline. specDir is the directory of package spec; descriptions come from its Go comments.
func Generate(specDir string, v any) ([]byte, error) {
	r := &jsonschema.Reflector{BaseSchemaID: BaseID, Mapper: mapType}
	if err := addComments(r, specDir); err != nil {
		return nil, err
	}
	s := r.Reflect(v)
	if err := refine(s.Definitions); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// addComments loads the Go comments of specDir. AddGoComments keys them by the directory it is
// given, so they are read under the absolute directory and re-keyed by import path; that keeps
// the output independent of the working directory.
func addComments(r *jsonschema.Reflector, specDir string) error {
	abs, err := filepath.Abs(specDir)
	if err != nil {
		return err
	}
	tmp := &jsonschema.Reflector{}
	if err := tmp.AddGoComments("", abs); err != nil {
		return fmt.Errorf("read comments of %s: %w", abs, err)
	}
	pkg := reflect.TypeFor[spec.Stack]().PkgPath()
	r.CommentMap = map[string]string{}
	for k, c := range tmp.CommentMap {
		if rest, ok := strings.CutPrefix(k, abs); ok {
			r.CommentMap[pkg+rest] = c
		}
	}
	if r.CommentMap[pkg+".Stack"] == "" {
		return fmt.Errorf("no comments found for %s.Stack under %s", pkg, abs)
	}
	return nil
}

func mapType(t reflect.Type) *jsonschema.Schema {
	switch t {
	case reflect.TypeFor[spec.Quantity]():
		return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{
			{Type: "string", Pattern: spec.QuantityPattern, MaxLength: ptr(uint64(64))},
			{Type: "number"},
		}}
	case reflect.TypeFor[spec.EgressMode]():
		return enum(spec.EgressModes)
	case reflect.TypeFor[spec.Runtime]():
		return enum(spec.Runtimes)
	}
	return nil
}

func enum[T ~string](vals []T) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "string"}
	for _, v := range vals {
		s.Enum = append(s.Enum, string(v))
	}
	return s
}

// refine adds what the Go types cannot say: patterns, bounds, defaults, and the string form of
// Image. Every property it touches must exist, so a renamed field fails generation.
func refine(defs jsonschema.Definitions) error {
	var missing []string
	prop := func(def, name string) *jsonschema.Schema {
		d, ok := defs[def]
		if !ok {
			missing = append(missing, def)
			return &jsonschema.Schema{}
		}
		p, ok := d.Properties.Get(name)
		if !ok {
			missing = append(missing, def+"."+name)
			return &jsonschema.Schema{Items: &jsonschema.Schema{}, AdditionalProperties: &jsonschema.Schema{}}
		}
		return p
	}
	has := func(def string) bool { _, ok := defs[def]; return ok }

	if has("Stack") {
		prop("Stack", "apiVersion").Const = spec.APIVersion
		prop("Stack", "kind").Enum = []any{spec.StackKind}
		prop("Stack", "sandboxes").MinItems = ptr(uint64(1))
		prop("Workload", "id").Pattern = spec.IDPattern
		prop("Workload", "hosts").Items.Pattern = spec.IDPattern
	}

	prop("Sandbox", "id").Pattern = spec.IDPattern
	prop("Sandbox", "hostedBy").Pattern = spec.IDPattern
	pp := prop("Sandbox", "previewPorts")
	pp.Items.Minimum = "1"
	pp.Items.Maximum = "65535"
	pp.UniqueItems = true
	prop("Sandbox", "env").PropertyNames = &jsonschema.Schema{Pattern: spec.EnvNamePattern}
	wd := prop("Sandbox", "workdir")
	wd.Pattern = "^/"
	wd.Default = spec.DefaultWorkdir
	prop("Sandbox", "runtime").Default = string(spec.DefaultRuntime)

	prop("Limits", "cpu").Default = string(spec.DefaultCPU)
	prop("Limits", "memory").Default = string(spec.DefaultMemory)
	prop("Limits", "disk").Default = string(spec.DefaultDisk)
	mp := prop("Limits", "maxProcesses")
	mp.Minimum = "1"
	mp.Default = spec.DefaultMaxProcesses

	prop("Egress", "mode").Default = string(spec.DefaultEgressMode)
	prop("Egress", "domains").Items.MaxLength = ptr(uint64(253))

	life := prop("Session", "maxLifetimeSeconds")
	life.Minimum = "1"
	life.Default = spec.DefaultMaxLifetimeSeconds
	idle := prop("Session", "idleTimeoutSeconds")
	idle.Minimum = "1"
	idle.Default = spec.DefaultIdleTimeoutSeconds
	prop("Session", "reconnect").Default = spec.DefaultReconnect

	prop("Image", "snapshot").Pattern = spec.IDPattern
	if img, ok := defs["Image"]; ok {
		obj := *img
		obj.Description = ""
		obj.MinProperties = ptr(uint64(1))
		defs["Image"] = &jsonschema.Schema{
			Description: img.Description,
			OneOf: []*jsonschema.Schema{
				{Type: "string", MinLength: ptr(uint64(1)), Description: `"host", an OCI reference, "./dir" or "/abs/dir", "x.tar" or "x.tar.gz", or "oci:./layout"`},
				&obj,
			},
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("schema refinement names fields the types no longer have: %s", strings.Join(missing, ", "))
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
