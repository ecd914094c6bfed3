//go:build unix

package kernfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadWrite(t *testing.T) {
	dir := t.TempDir()
	for _, content := range []string{"", "1\n", strings.Repeat("0123456789", 300)} { // past the first 512-byte buffer
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := Write(p, content); err != nil {
			t.Fatal(err)
		}
		got, err := Read(p)
		if err != nil || string(got) != content {
			t.Errorf("read back %d bytes (%v), want %d", len(got), err, len(content))
		}
	}
	if _, err := Read(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if err := Write(filepath.Join(dir, "missing"), "x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write to a missing file (a control file is never created): %v", err)
	}
}
