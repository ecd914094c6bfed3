package idrange

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestIDAllocator: two allocators over one state dir (two processes) never hand out the same
// range; a full set is refused naming the option; only the holder frees a range; sweep frees
// the ranges of sessions whose state dir is gone and keeps the others.
func TestIDAllocator(t *testing.T) {
	state := t.TempDir()
	const ranges = 6
	a1, err := NewAllocator(state, 100000, ranges)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := NewAllocator(state, 100000, ranges)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		id      string
		k, base int
		err     error
	}
	res := make(chan got, ranges)
	var wg sync.WaitGroup
	for i := range ranges {
		a := a1
		if i%2 == 1 {
			a = a2
		}
		id := fmt.Sprintf("s-%016x", i)
		wg.Go(func() {
			k, base, err := a.Claim(id)
			res <- got{id, k, base, err}
		})
	}
	wg.Wait()
	close(res)
	owner := map[int]string{}
	byID := map[string]int{}
	for g := range res {
		if g.err != nil {
			t.Fatalf("claim %s: %v", g.id, g.err)
		}
		if prev, ok := owner[g.k]; ok {
			t.Fatalf("range %d given to %s and %s", g.k, prev, g.id)
		}
		if want := 100000 + (g.k+1)*Size; g.base != want {
			t.Errorf("range %d: base %d, want %d", g.k, g.base, want)
		}
		owner[g.k] = g.id
		byID[g.id] = g.k
	}
	if _, _, err := a1.Claim("s-00000000000000aa"); !errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), "uidRanges 6") {
		t.Fatalf("claim with every range taken: %v, want ErrRefused naming uidRanges", err)
	}
	// Only the holder frees.
	k0 := byID["s-0000000000000000"]
	if err := a2.Release(k0, "s-0000000000000001"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a2.Claim("s-00000000000000aa"); !errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("a range was freed by a session that does not hold it: %v", err)
	}
	if err := a2.Release(k0, "s-0000000000000000"); err != nil {
		t.Fatal(err)
	}
	if k, _, err := a1.Claim("s-00000000000000aa"); err != nil || k != k0 {
		t.Fatalf("claim after release: range %d, %v; want the freed range %d", k, err, k0)
	}
	if err := a1.ReleaseAll("s-0000000000000001"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(state, Dir, strconv.Itoa(byID["s-0000000000000001"]))); !os.IsNotExist(err) {
		t.Errorf("releaseAll left the claim: %v", err)
	}
	// Sweep: sessions 2 and aa have a state dir, the others do not.
	for _, id := range []string{"s-0000000000000002", "s-00000000000000aa"} {
		if err := os.Mkdir(filepath.Join(state, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../not-a-session", filepath.Join(state, Dir, "junk")); err != nil {
		t.Fatal(err)
	}
	if err := a1.Sweep(state); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(state, Dir))
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		o, _ := os.Readlink(filepath.Join(state, Dir, e.Name()))
		left = append(left, o)
	}
	if len(left) != 2 || !strings.Contains(strings.Join(left, " "), "s-0000000000000002") || !strings.Contains(strings.Join(left, " "), "s-00000000000000aa") {
		t.Errorf("after sweep the claims are %v, want those of s-...02 and s-...aa", left)
	}
}
