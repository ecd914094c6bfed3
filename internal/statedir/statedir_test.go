package statedir

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
)

func TestCheckSessionID(t *testing.T) {
	id, err := NewSessionID()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{id, true},
		{"s-0123456789abcdef", true},
		{"s-0123456789ABCDEF", false},
		{"s-0123", false},
		{"../s-0123456789abcdef", false},
		{"s-0123456789abcdef/..", false},
		{"", false},
		{"s-0123456789abcdeg", false},
		{"s-0123456789abcde/", false},
		{"s-0123456789abcdef0", false},
		{"S-0123456789abcdef", false},
		{"s_0123456789abcdef", false},
		{"s-0123456789abcde:", false},
		{"s-0123456789abcde`", false},
		{"s-0123456789abcdef\n", false},
	} {
		if err := CheckSessionID(tc.id); (err == nil) != tc.ok {
			t.Errorf("CheckSessionID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

func TestLoadMaster(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadMaster(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadMaster before any secret: %v, want not exist", err)
	}
	a, err := LoadMaster(dir)
	if err != nil || len(a) != 32 {
		t.Fatalf("first load: %d bytes, %v", len(a), err)
	}
	b, err := LoadMaster(dir)
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("second load differs or fails: %v", err)
	}
	if r, err := ReadMaster(dir); err != nil || !bytes.Equal(a, r) {
		t.Fatalf("ReadMaster differs or fails: %v", err)
	}
	p := filepath.Join(dir, MasterFile)
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadMaster(dir); !errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("group-readable secret: %v, want refused", err)
	}
	if err := os.WriteFile(p, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadMaster(dir); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("short secret: %v, want invalid", err)
	}
}
