package spec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func addSeeds(f *testing.F) {
	for _, name := range []string{"stack.yaml", "stack.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		stackHead + "- {id: a, image: host, limits: {cpu: 0.0005, memory: 8Ei}}\n",
		stackHead + "- {id: a, image: \"oci:\", env: {A: \"\\0\"}}\n",
		`{"apiVersion":"airlock.dev/v1alpha1","sandboxes":[{"id":"a","image":{"host":true,"ref":"x"},"previewPorts":[0,80,80]}]}`,
		stackHead + "- id: a\n  image: host\n  session: {maxLifetimeSeconds: 10, idleTimeoutSeconds: 20}\n",
		"a: &a [*a]\n",
		"---\n---\n",
		"{\"a\":\"\\/\"}",
	} {
		f.Add([]byte(s))
	}
}

var equateEmpty = cmpopts.EquateEmpty()

// FuzzParseStack: parsing never panics, and whatever parses re-marshals and re-parses to an
// equal value (nil and empty collections are the same declaration).
func FuzzParseStack(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStack(data)
		if err != nil {
			if _, ok := err.(*ParseError); !ok {
				t.Fatalf("error %T is not a *ParseError: %v", err, err)
			}
			return
		}
		out, err := json.Marshal(st)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := ParseStack(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if d := cmp.Diff(st, again, equateEmpty); d != "" {
			t.Fatalf("round trip changed the value (-first +second):\n%s", d)
		}
	})
}

// FuzzParseSandbox is FuzzParseStack for single sandbox documents.
func FuzzParseSandbox(f *testing.F) {
	f.Add([]byte("id: a\nimage: ./root\nlimits: {cpu: 2}\n"))
	f.Add([]byte(`{"id":"a","image":{"snapshot":"s"},"env":{"A":"b"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSandbox(data)
		if err != nil {
			return
		}
		out, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseSandbox(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if d := cmp.Diff(s, again, equateEmpty); d != "" {
			t.Fatalf("round trip changed the value:\n%s", d)
		}
	})
}

// FuzzValidate: validation never panics, is deterministic, and ApplyDefaults never changes the
// verdict: a default never introduces or hides a problem. ApplyDefaults is idempotent.
func FuzzValidate(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStack(data)
		if err != nil {
			return
		}
		before := summarize(st.Validate())
		if again := summarize(st.Validate()); !slices.Equal(before, again) {
			t.Fatalf("Validate not deterministic:\n%v\n%v", before, again)
		}
		st.ApplyDefaults()
		after := summarize(st.Validate())
		// Kind is defaulted to "Stack", which is always valid, so the lists must agree exactly.
		if !slices.Equal(before, after) {
			t.Fatalf("ApplyDefaults changed the verdict:\nbefore %v\nafter  %v", before, after)
		}
		snapshot, _ := json.Marshal(st)
		st.ApplyDefaults()
		if twice, _ := json.Marshal(st); string(twice) != string(snapshot) {
			t.Fatalf("ApplyDefaults not idempotent")
		}
		if len(after) == 0 {
			for _, s := range st.Sandboxes {
				if _, err := s.Limits.CPUMillis(); err != nil {
					t.Fatalf("valid cpu %q: %v", s.Limits.CPU, err)
				}
				if _, err := s.Limits.MemoryBytes(); err != nil {
					t.Fatalf("valid memory %q: %v", s.Limits.Memory, err)
				}
				if _, err := s.Limits.DiskBytes(); err != nil {
					t.Fatalf("valid disk %q: %v", s.Limits.Disk, err)
				}
			}
		}
	})
}

// FuzzMatchDomain checks the properties egress relies on: only valid patterns match, an exact
// pattern matches only its own name, and a wildcard never matches its apex or a look-alike.
func FuzzMatchDomain(f *testing.F) {
	for _, s := range [][2]string{
		{"*.example.com", "a.example.com"}, {"*.example.com", "example.com"}, {"example.com", "EXAMPLE.com."},
		{"*.example.com", "evil-example.com"}, {"10.0.0.1", "10.0.0.1"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, host string) {
		if !MatchDomain(pattern, host) {
			return
		}
		if err := ValidateDomain(pattern); err != nil {
			t.Fatalf("invalid pattern %q matched %q", pattern, host)
		}
		if err := ValidateDomain(host); err != nil || strings.Contains(host, "*") {
			t.Fatalf("invalid host %q matched %q", host, pattern)
		}
		p := strings.TrimSuffix(strings.ToLower(pattern), ".")
		h := strings.TrimSuffix(strings.ToLower(host), ".")
		if rest, ok := strings.CutPrefix(p, "*."); ok {
			if h == rest || !strings.HasSuffix(h, "."+rest) {
				t.Fatalf("%q matched %q", pattern, host)
			}
			if MatchDomain(pattern, rest) {
				t.Fatalf("%q matched its apex", pattern)
			}
		} else if h != p {
			t.Fatalf("exact %q matched %q", pattern, host)
		}
	})
}
