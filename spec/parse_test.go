package spec

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func wantTestdataStack() *Stack {
	st := validStack()
	st.Sandboxes = append(st.Sandboxes,
		Sandbox{ID: "local", Image: Image{Dir: "./rootfs"}, Limits: Limits{CPU: "2", Memory: "1Gi"}},
		Sandbox{ID: "tar", Image: Image{Tarball: "images/base.tar.gz"}},
		Sandbox{ID: "layout", Image: Image{OCILayout: "./layout"}},
		Sandbox{ID: "obj", Image: Image{Snapshot: "py-warm"}},
	)
	return st
}

func TestParseYAMLAndJSONAgree(t *testing.T) {
	want := wantTestdataStack()
	for _, name := range []string{"stack.yaml", "stack.json"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			st, err := ParseStack(data)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, st); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
			if errs := st.Validate(); len(errs) != 0 {
				t.Fatalf("testdata stack invalid: %v", errs)
			}
		})
	}
}

const stackHead = "apiVersion: airlock.dev/v1alpha1\nsandboxes:\n"

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		path string
		msg  string // prefix of Msg
	}{
		{"yaml unknown top-level", stackHead + "- {id: a, image: host}\nsandbox: []\n", "sandbox", "unknown field; allowed: apiVersion, kind, sandboxes, workloads"},
		{"yaml unknown in limits", stackHead + "- id: a\n  image: host\n  limits:\n    cpuu: 1\n", "sandboxes[0].limits.cpuu", "unknown field"},
		{"yaml unknown in second sandbox egress", stackHead + "- {id: a, image: host}\n- id: b\n  image: host\n  egress: {mode: deny, domain: [x.com]}\n", "sandboxes[1].egress.domain", "unknown field; allowed: mode, domains"},
		{"yaml unknown in session", stackHead + "- id: a\n  image: host\n  session: {idle: 3}\n", "sandboxes[0].session.idle", "unknown field"},
		{"yaml unknown in image object", stackHead + "- id: a\n  image: {hots: true}\n", "sandboxes[0].image.hots", "unknown field; allowed: host, ref, ociLayout, tarball, dir, snapshot"},
		{"yaml unknown in workload", stackHead + "- {id: a, image: host}\nworkloads:\n- {id: w, host: [a]}\n", "workloads[0].host", "unknown field"},
		{"field names are case-sensitive", stackHead + "- {ID: a, image: host}\n", "sandboxes[0].ID", "unknown field"},
		{"json unknown in limits", `{"apiVersion":"x","sandboxes":[{"id":"a","image":"host","limits":{"cpuu":"1"}}]}`, "sandboxes[0].limits.cpuu", "unknown field"},
		{"json unknown in image object", `{"sandboxes":[{"id":"a","image":{"ref":"x","tag":"y"}}]}`, "sandboxes[0].image.tag", "unknown field"},
		{"json duplicate field", `{"sandboxes":[{"id":"a","id":"b","image":"host"}]}`, "sandboxes[0].id", "duplicate field"},
		{"json duplicate in image", `{"sandboxes":[{"id":"a","image":{"host":true,"host":false}}]}`, "sandboxes[0].image.host", "duplicate field"},
		{"yaml duplicate field", stackHead + "- id: a\n  id: b\n  image: host\n", "", "yaml: unmarshal errors:\n  line 4: key \"id\" already set in map"},
		{"yaml boolean for string", stackHead + "- {id: no, image: host}\n", "sandboxes[0].id", "must be a string, got the boolean false (quote it"},
		{"yaml number for env", stackHead + "- id: a\n  image: host\n  env: {PORT: 8080}\n", "sandboxes[0].env[PORT]", "must be a string, got the number 8080 (quote it)"},
		{"string port", stackHead + "- id: a\n  image: host\n  previewPorts: [\"80\"]\n", "sandboxes[0].previewPorts[0]", "must be an integer, got a string \"80\""},
		{"fractional maxProcesses", stackHead + "- id: a\n  image: host\n  limits: {maxProcesses: 1.5}\n", "sandboxes[0].limits.maxProcesses", "must be an integer"},
		{"huge maxProcesses", `{"sandboxes":[{"id":"a","image":"host","limits":{"maxProcesses":99999999999999999999}}]}`, "sandboxes[0].limits.maxProcesses", "must be an integer that fits 64 bits"},
		{"boolean cpu", stackHead + "- id: a\n  image: host\n  limits: {cpu: true}\n", "sandboxes[0].limits.cpu", "must be a quantity"},
		{"object cpu", `{"sandboxes":[{"id":"a","image":"host","limits":{"cpu":{}}}]}`, "sandboxes[0].limits.cpu", "must be a quantity"},
		{"sandboxes not a list", "apiVersion: x\nsandboxes: {id: a}\n", "sandboxes", "must be a list, got an object"},
		{"limits not an object", stackHead + "- {id: a, image: host, limits: big}\n", "sandboxes[0].limits", "must be an object, got a string"},
		{"image number", stackHead + "- {id: a, image: 3}\n", "sandboxes[0].image", "must be a string (\"host\""},
		{"image list", stackHead + "- {id: a, image: [host]}\n", "sandboxes[0].image", "must be a string"},
		{"image empty layout", stackHead + "- {id: a, image: \"oci:\"}\n", "sandboxes[0].image", "image \"oci:\" names no OCI layout directory"},
		{"reconnect string", stackHead + "- id: a\n  image: host\n  session: {reconnect: \"yes\"}\n", "sandboxes[0].session.reconnect", "must be true or false"},
		{"two documents", stackHead + "- {id: a, image: host}\n---\n" + stackHead + "- {id: b, image: host}\n", "", "more than one YAML document"},
		{"trailing empty document", stackHead + "- {id: a, image: host}\n---\n", "", "more than one YAML document"},
		{"empty", "", "", "empty document"},
		{"only comments", "# nothing\n", "", "empty document"},
		{"null document", "---\n", "", "empty document"},
		{"root is a list", "- a\n- b\n", "", "must be an object, got a list"},
		{"root is a scalar", "hello\n", "", "must be an object, got a string"},
		{"yaml syntax", "apiVersion: [\n", "", "yaml:"},
		{"too large", strings.Repeat("#", MaxDocumentBytes+1), "", "document is larger than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := ParseStack([]byte(tc.doc))
			if err == nil {
				t.Fatalf("parsed: %+v", st)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v is not a *ParseError", err, err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if pe.Path != tc.path || !strings.HasPrefix(pe.Msg, tc.msg) {
				t.Fatalf("got path %q msg %q\nwant path %q msg prefix %q", pe.Path, pe.Msg, tc.path, tc.msg)
			}
			if tc.path != "" && !strings.HasPrefix(err.Error(), tc.path+": ") {
				t.Fatalf("Error() %q does not start with the path", err.Error())
			}
		})
	}
}

func TestParseUnknownFieldMessage(t *testing.T) {
	_, err := ParseStack([]byte(stackHead + "- id: a\n  image: host\n  limits: {cpuu: 1}\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "sandboxes[0].limits.cpuu: unknown field") {
		t.Fatalf("got %v", err)
	}
}

func TestParseValues(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want Sandbox
	}{
		{"yaml integer quantity", "id: a\nimage: host\nlimits: {cpu: 2}\n", Sandbox{ID: "a", Image: Image{Host: true}, Limits: Limits{CPU: "2"}}},
		{"yaml float quantity", "id: a\nimage: host\nlimits: {cpu: 0.5}\n", Sandbox{ID: "a", Image: Image{Host: true}, Limits: Limits{CPU: "0.5"}}},
		{"json number quantity kept as written", `{"id":"a","image":"host","limits":{"cpu":1e3,"memory":"1Gi"}}`, Sandbox{ID: "a", Image: Image{Host: true}, Limits: Limits{CPU: "1e3", Memory: "1Gi"}}},
		{"image ref", "id: a\nimage: python:3.12\n", Sandbox{ID: "a", Image: Image{Ref: "python:3.12"}}},
		{"image abs dir", "id: a\nimage: /srv/rootfs\n", Sandbox{ID: "a", Image: Image{Dir: "/srv/rootfs"}}},
		{"image tar", "id: a\nimage: ./img.tar\n", Sandbox{ID: "a", Image: Image{Tarball: "./img.tar"}}},
		{"image oci-layout", "id: a\nimage: oci-layout:/l\n", Sandbox{ID: "a", Image: Image{OCILayout: "/l"}}},
		{"image object with two sources parses", `{"id":"a","image":{"host":true,"ref":"x"}}`, Sandbox{ID: "a", Image: Image{Host: true, Ref: "x"}}},
		{"null fields are unset", "id: a\nimage: host\nlimits:\nenv:\nsession: {reconnect: null}\n", Sandbox{ID: "a", Image: Image{Host: true}}},
		{"yaml bool", "id: a\nimage: host\nsession: {reconnect: false}\n", Sandbox{ID: "a", Image: Image{Host: true}, Session: Session{Reconnect: ptr(false)}}},
		{"byte order mark", "\xef\xbb\xbf{\"id\":\"a\",\"image\":\"host\"}", Sandbox{ID: "a", Image: Image{Host: true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSandbox([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(&tc.want, s); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestParseSandboxErrors(t *testing.T) {
	for doc, path := range map[string]string{
		"id: a\nimage: host\nlimits: {cpuu: 1}\n":          "limits.cpuu",
		"apiVersion: airlock.dev/v1alpha1\nid: a\n":        "apiVersion",
		`{"id":"a","image":"host","egress":{"modes":"x"}}`: "egress.modes",
	} {
		_, err := ParseSandbox([]byte(doc))
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Path != path {
			t.Errorf("ParseSandbox(%q) = %v, want path %q", doc, err, path)
		}
	}
}

func TestLoadStack(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stack.yaml")
	doc := stackHead + "- {id: a, image: ./rootfs}\n- {id: b, image: /abs}\n- {id: c, image: oci:layout}\n- {id: d, image: x.tar}\n- {id: e, image: python}\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := LoadStack(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Image{
		{Dir: filepath.Join(dir, "rootfs")}, {Dir: "/abs"}, {OCILayout: filepath.Join(dir, "layout")},
		{Tarball: filepath.Join(dir, "x.tar")}, {Ref: "python"},
	}
	var got []Image
	for _, s := range st.Sandboxes {
		got = append(got, s.Image)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}

	if _, err := LoadStack(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(stackHead+"- {id: a, image: host, cpu: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadStack(bad)
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Path != "sandboxes[0].cpu" || !strings.Contains(err.Error(), bad) {
		t.Fatalf("bad file: %v", err)
	}
}

func TestImageFromString(t *testing.T) {
	cases := map[string]Image{
		"":                       {},
		"host":                   {Host: true},
		"Host":                   {Ref: "Host"},
		"python:3.12":            {Ref: "python:3.12"},
		"ghcr.io/o/i@sha256:abc": {Ref: "ghcr.io/o/i@sha256:abc"},
		"./rootfs":               {Dir: "./rootfs"},
		"../rootfs":              {Dir: "../rootfs"},
		"/srv/root":              {Dir: "/srv/root"},
		".":                      {Dir: "."},
		"img.tar":                {Tarball: "img.tar"},
		"/x/img.tar.gz":          {Tarball: "/x/img.tar.gz"},
		"img.tgz":                {Tarball: "img.tgz"},
		"oci:./layout":           {OCILayout: "./layout"},
		"oci-layout:/l":          {OCILayout: "/l"},
		"oci:./x.tar":            {OCILayout: "./x.tar"},
	}
	for in, want := range cases {
		got, err := ImageFromString(in)
		if err != nil || got != want {
			t.Errorf("ImageFromString(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"oci:", "oci-layout:"} {
		if _, err := ImageFromString(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ImageFromString(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestImageJSON(t *testing.T) {
	var img Image
	if err := json.Unmarshal([]byte(`"./root"`), &img); err != nil || img != (Image{Dir: "./root"}) {
		t.Fatalf("string form: %+v %v", img, err)
	}
	out, err := json.Marshal(img)
	if err != nil || string(out) != `{"dir":"./root"}` {
		t.Fatalf("marshal: %s %v", out, err)
	}
	img = Image{}
	if err := json.Unmarshal([]byte(`{"ref":"x"}`), &img); err != nil || img != (Image{Ref: "x"}) {
		t.Fatalf("object form: %+v %v", img, err)
	}
	for _, bad := range []string{`{"Ref":"x"}`, `{"reff":"x"}`, `3`, `["host"]`, `"oci:"`} {
		if err := json.Unmarshal([]byte(bad), &img); err == nil {
			t.Errorf("Unmarshal(%s) accepted", bad)
		}
	}
	if k := (Image{Tarball: "x"}).Kind(); k != ImageTarball {
		t.Errorf("Kind = %q", k)
	}
	if k := (Image{Tarball: "x", Host: true}).Kind(); k != "" {
		t.Errorf("Kind of two sources = %q", k)
	}
}

func TestQuantityJSON(t *testing.T) {
	var l Limits
	if err := json.Unmarshal([]byte(`{"cpu":0.25,"memory":"1Gi","disk":2e9}`), &l); err != nil {
		t.Fatal(err)
	}
	if l.CPU != "0.25" || l.Memory != "1Gi" || l.Disk != "2e9" {
		t.Fatalf("got %+v", l)
	}
	for _, bad := range []string{`{"cpu":true}`, `{"cpu":{}}`, `{"cpu":[1]}`} {
		if err := json.Unmarshal([]byte(bad), &l); err == nil {
			t.Errorf("Unmarshal(%s) accepted", bad)
		}
	}
}
