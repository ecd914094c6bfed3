package idrange

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
)

func TestParseSubIDs(t *testing.T) {
	in := "alice:100000:65536\n# comment:1:2\nbob:165536:65536\nbad:x:1\nzero:5:0\nshort:1\n  carol:300000:10  \n"
	got, err := parseSubIDs(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []span{{100000, 65536, "alice"}, {165536, 65536, "bob"}, {300000, 10, "carol"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestParseIDColumn(t *testing.T) {
	in := "root:x:0:0:root:/root:/bin/bash\nldapish:x:200123:200123::/home/l:/bin/sh\nbroken\nnum:x:abc:1::/:/\n"
	got, err := parseIDColumn(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := []span{{first: 0, count: 1}, {first: 200123, count: 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestExcludedRanges: a range is excluded exactly when one of its 65536 ids is given out.
func TestExcludedRanges(t *testing.T) {
	a := &Allocator{base: 100000, ranges: 10}
	r := func(k int) int64 { return int64(a.hostBase(k)) } // range k's first host id
	for _, tt := range []struct {
		name string
		span span
		want []int
	}{
		{"below every range", span{first: 0, count: 100000}, nil},
		{"the image range only", span{first: 100000, count: Size}, nil},
		{"range 0 whole (useradd's second user)", span{first: r(0), count: Size}, []int{0}},
		{"range 0's last id", span{first: r(1) - 1, count: 1}, []int{0}},
		{"straddling ranges 1 and 2", span{first: r(2) - 1, count: 2}, []int{1, 2}},
		{"one uid inside range 3", span{first: r(3) + 1000, count: 1}, []int{3}},
		{"past the last range", span{first: r(10), count: 1 << 20}, nil},
		{"over the whole space", span{first: 0, count: 1 << 40}, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := a.excludedRanges([]span{tt.span})
			want := map[int]bool{}
			for _, k := range tt.want {
				want[k] = true
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("excluded %v, want %v", got, want)
			}
		})
	}
}

// TestClaimSkipsHostIDs: the allocator never hands out a range overlapping an id the host's
// account files give out (here /etc/subuid's second user, and a high uid in /etc/passwd).
func TestClaimSkipsHostIDs(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("subuid", "alice:100000:65536\nbob:165536:65536\n")
	write("passwd", "root:x:0:0::/root:/bin/sh\nhigh:x:231100:231100::/:/bin/sh\n")
	a, err := NewAllocator(t.TempDir(), 100000, 4)
	if err != nil {
		t.Fatal(err)
	}
	a.hostRoot = root // read at the first claim
	var got []int
	for i := range 2 {
		k, base, err := a.Claim("s-000000000000000" + string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		if base != a.hostBase(k) {
			t.Fatalf("base %d for range %d", base, k)
		}
		got = append(got, k)
	}
	if !reflect.DeepEqual(got, []int{2, 3}) {
		t.Errorf("claimed ranges %v, want [2 3] (0 holds bob's subuids, 1 uid 231100)", got)
	}
	if _, _, err := a.Claim("s-000000000000000c"); !errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), "2 overlap host accounts") {
		t.Errorf("third claim: %v", err)
	}

	write("subgid", "everyone:0:4294967295\n")
	if err := a.excludeHostIDs(root); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "choose another uidBase") {
		t.Errorf("every range taken by subgids: %v", err)
	}
}

// TestOwnSubIDs: a rootless user's range is its first one, by name or by uid, with room for
// every id a sandbox maps.
func TestOwnSubIDs(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		want       int
		ok         bool
	}{
		{"by name", "bob:100000:65536\nalice:165536:65536\n", 165536, true},
		{"by uid", "1000:200000:65536\n", 200000, true},
		{"too small, then big enough", "alice:100000:1000\nalice:300000:65535\n", 300000, true},
		{"someone else's", "bob:100000:65536\n", 0, false},
		{"starting at 0", "alice:0:65536\n", 0, false},
		{"past the 32-bit ids", "alice:4294960000:65535\n", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ownSubIDs(strings.NewReader(tt.file), "alice", 1000)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("ownSubIDs = %d, %v; want %d (found %v)", got, err, tt.want, tt.ok)
			}
		})
	}
}
