package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// MaxDocumentBytes bounds a declaration document; larger ones are refused before parsing.
const MaxDocumentBytes = 4 << 20

// ParseStack reads one Stack document, YAML or JSON. It is strict: unknown and duplicate fields,
// values of the wrong type and a second document are refused with the field's path. It neither
// applies defaults nor validates. Errors are *ParseError.
func ParseStack(data []byte) (*Stack, error) {
	var st Stack
	if err := decodeDocument(data, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// ParseSandbox reads one Sandbox document, YAML or JSON, as strictly as ParseStack.
func ParseSandbox(data []byte) (*Sandbox, error) {
	var s Sandbox
	if err := decodeDocument(data, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// LoadStack reads and parses the stack file at path. Relative image paths (dir, ociLayout,
// tarball) are resolved against the file's directory, so a stack means the same thing from any
// working directory.
func LoadStack(path string) (*Stack, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read stack: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read stack %s: %w", path, err)
	}
	st, err := ParseStack(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dir := filepath.Dir(path)
	for i := range st.Sandboxes {
		img := &st.Sandboxes[i].Image
		for _, p := range []*string{&img.Dir, &img.OCILayout, &img.Tarball} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(dir, *p)
			}
		}
	}
	return st, nil
}

// decodeDocument turns data into JSON, checks its shape against target's type (so every problem
// carries a full path, which the decoder's own errors lack), then decodes it.
func decodeDocument(data []byte, target any) error {
	if len(data) > MaxDocumentBytes {
		return &ParseError{Msg: fmt.Sprintf("document is larger than %d bytes", MaxDocumentBytes)}
	}
	jsonData, err := toJSON(data)
	if err != nil {
		return err
	}
	tree, err := jsonTree(jsonData)
	if err != nil {
		return err
	}
	if tree == nil {
		return &ParseError{Msg: "empty document"}
	}
	if err := checkShape("", tree, reflect.TypeOf(target).Elem()); err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(jsonData, target)
	if err != nil {
		return &ParseError{Msg: err.Error()}
	}
	if len(strict) > 0 {
		var fe sigsjson.FieldError
		if errors.As(strict[0], &fe) {
			return &ParseError{Path: fe.FieldPath(), Msg: strings.TrimSuffix(strict[0].Error(), " "+strconv.Quote(fe.FieldPath()))}
		}
		return &ParseError{Msg: strict[0].Error()}
	}
	return nil
}

var utf8BOM = []byte("\xef\xbb\xbf")

// toJSON returns data as JSON. JSON input is used as is: not every JSON document is valid
// YAML 1.1 ("\/" escapes), and this keeps numbers as written.
func toJSON(data []byte) ([]byte, error) {
	data = bytes.TrimPrefix(data, utf8BOM)
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') && json.Valid(trimmed) {
		return trimmed, nil
	}
	if err := singleYAMLDocument(data); err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, &ParseError{Msg: err.Error()}
	}
	return j, nil
}

func singleYAMLDocument(data []byte) (err error) {
	defer func() {
		// yaml.v2 reports some malformed input by panicking; a parser must not take the caller down.
		if r := recover(); r != nil {
			err = &ParseError{Msg: fmt.Sprintf("yaml: malformed document: %v", r)}
		}
	}()
	dec := yamlv2.NewDecoder(bytes.NewReader(data))
	var first, second any
	if err := dec.Decode(&first); err != nil {
		if err == io.EOF {
			return &ParseError{Msg: "empty document"}
		}
		return &ParseError{Msg: err.Error()}
	}
	if err := dec.Decode(&second); err != io.EOF {
		return &ParseError{Msg: "more than one YAML document; a file holds exactly one (remove the extra \"---\")"}
	}
	return nil
}

// jsonTree decodes JSON into maps, slices, strings, bools and json.Numbers, refusing duplicate
// object keys with their path (encoding/json would keep the last one silently).
func jsonTree(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := treeValue(dec, "", 0)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) {
			return nil, pe
		}
		return nil, &ParseError{Msg: "json: " + err.Error()}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &ParseError{Msg: "json: data after the document"}
	}
	return v, nil
}

const maxDepth = 64

func treeValue(dec *json.Decoder, path string, depth int) (any, error) {
	if depth > maxDepth {
		return nil, &ParseError{Path: path, Msg: "nested too deeply"}
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				kp := joinKey(path, k)
				if _, dup := m[k]; dup {
					return nil, &ParseError{Path: kp, Msg: "duplicate field"}
				}
				if m[k], err = treeValue(dec, kp, depth+1); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token()
			return m, err
		case '[':
			s := []any{}
			for i := 0; dec.More(); i++ {
				e, err := treeValue(dec, path+"["+strconv.Itoa(i)+"]", depth+1)
				if err != nil {
					return nil, err
				}
				s = append(s, e)
			}
			_, err := dec.Token()
			return s, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var (
	imageType    = reflect.TypeFor[Image]()
	quantityType = reflect.TypeFor[Quantity]()
)

// checkShape compares a decoded JSON value with the Go type it will be decoded into and returns
// the first mismatch in a stable order (object keys sorted). null is accepted everywhere and
// leaves the zero value.
func checkShape(path string, v any, t reflect.Type) *ParseError {
	if v == nil {
		return nil
	}
	switch t {
	case imageType:
		switch x := v.(type) {
		case string:
			if _, err := ImageFromString(x); err != nil {
				return &ParseError{Path: path, Msg: strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")}
			}
			return nil
		case map[string]any:
			return checkStruct(path, x, t)
		}
		return wrongType(path, v, `a string ("host", "python:3.12", "./rootfs", "image.tar", "oci:./layout") or an object with one of `+imageObjectFieldList)
	case quantityType:
		switch v.(type) {
		case string, json.Number:
			return nil
		}
		return wrongType(path, v, `a quantity such as "500m", "512Mi" or 2`)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkShape(path, v, t.Elem())
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return wrongType(path, v, "an object")
		}
		return checkStruct(path, m, t)
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return wrongType(path, v, "an object")
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if err := checkShape(path+"["+k+"]", m[k], t.Elem()); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return wrongType(path, v, "a list")
		}
		for i, e := range s {
			if err := checkShape(path+"["+strconv.Itoa(i)+"]", e, t.Elem()); err != nil {
				return err
			}
		}
		return nil
	case reflect.String:
		if _, ok := v.(string); !ok {
			return wrongType(path, v, "a string")
		}
		return nil
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return wrongType(path, v, "true or false")
		}
		return nil
	case reflect.Int, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			return wrongType(path, v, "an integer")
		}
		if _, err := strconv.ParseInt(n.String(), 10, t.Bits()); err != nil {
			return &ParseError{Path: path, Msg: fmt.Sprintf("must be an integer that fits %d bits, got %s", t.Bits(), n)}
		}
		return nil
	}
	return &ParseError{Path: path, Msg: "unsupported type " + t.String()}
}

func checkStruct(path string, m map[string]any, t reflect.Type) *ParseError {
	fields := jsonFields(t)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ft, ok := fields[k]
		if !ok {
			names := make([]string, 0, len(fields))
			for i := range t.NumField() {
				if n := jsonName(t.Field(i)); n != "" {
					names = append(names, n)
				}
			}
			return &ParseError{Path: joinKey(path, k), Msg: "unknown field; allowed: " + strings.Join(names, ", ")}
		}
		if err := checkShape(joinKey(path, k), m[k], ft); err != nil {
			return err
		}
	}
	return nil
}

func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if n := jsonName(f); n != "" {
			out[n] = f.Type
		}
	}
	return out
}

func jsonName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return f.Name
	}
	return name
}

func wrongType(path string, v any, want string) *ParseError {
	got, hint := "", ""
	switch x := v.(type) {
	case string:
		got = "a string " + strconv.Quote(x)
	case json.Number:
		got = "the number " + x.String()
		if want == "a string" {
			hint = " (quote it)"
		}
	case bool:
		got = "the boolean " + strconv.FormatBool(x)
		if want == "a string" || strings.HasPrefix(want, "a string ") {
			hint = " (quote it: YAML reads unquoted yes, no, on, off, true and false as booleans)"
		}
	case map[string]any:
		got = "an object"
	case []any:
		got = "a list"
	}
	return &ParseError{Path: path, Msg: "must be " + want + ", got " + got + hint}
}
