package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestRootRefusal reads os.Root's own refusals as the linked Go makes them: a root that is no
// directory, a name that leads out of it.
func TestRootRefusal(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cause := func(err error) error {
		var pe *fs.PathError
		if !errors.As(err, &pe) {
			t.Fatalf("%v is not a *fs.PathError", err)
		}
		return pe.Err
	}
	_, err := os.OpenRoot(file)
	if got := rootRefusal(cause(err)); got != rootNotDir {
		t.Errorf("OpenRoot of a file: %v read as %d, want rootNotDir", err, got)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	_, err = root.Open("../etc/passwd")
	if got := rootRefusal(cause(err)); got != rootEscape {
		t.Errorf("a name out of the root: %v read as %d, want rootEscape", err, got)
	}
	_, err = root.Open("missing")
	if got := rootRefusal(cause(err)); got != rootOther {
		t.Errorf("a missing name: %v read as %d, want rootOther", err, got)
	}
}
