package sessions

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFreezeRequest(t *testing.T) {
	tests := []struct {
		version int
		in      string
		want    bool
		bad     bool
	}{
		{1, "THAWED\n", false, false},
		{1, "FREEZING\n", true, false},
		{1, "FROZEN\n", true, false},
		{1, "frozen", false, true},
		{1, "", false, true},
		{2, "0\n", false, false},
		{2, "1\n", true, false},
		{2, "2", false, true},
	}
	for _, tt := range tests {
		got, err := ParseFreezeRequest(tt.version, tt.in)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("ParseFreezeRequest(%d, %q) = %v, %v; want %v, error %v", tt.version, tt.in, got, err, tt.want, tt.bad)
		}
	}
}

// TestReadFreezeRequest: the state file read on every agent call, through bare system calls:
// its content parsed as parseFreezeRequest does, a missing file is fs.ErrNotExist (the
// sandbox is gone: not paused), and a file longer than any state is refused.
func TestReadFreezeRequest(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		version int
		content *string // nil: no file
		want    bool
		missing bool
		bad     bool
	}{
		{"v1 thawed", 1, ptr("THAWED\n"), false, false, false},
		{"v1 freezing", 1, ptr("FREEZING\n"), true, false, false},
		{"v1 frozen", 1, ptr("FROZEN\n"), true, false, false},
		{"v2 frozen", 2, ptr("1\n"), true, false, false},
		{"v2 thawed", 2, ptr("0\n"), false, false, false},
		{"empty", 1, ptr(""), false, false, true},
		{"longer than any state", 1, ptr(strings.Repeat("FROZEN", 20)), false, false, true},
		{"missing", 1, nil, false, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if tt.content != nil {
				if err := os.WriteFile(name, []byte(*tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ReadFreezeRequest(tt.version, name)
			if (err != nil) != tt.bad || got != tt.want || errors.Is(err, fs.ErrNotExist) != tt.missing {
				t.Errorf("ReadFreezeRequest = %v, %v; want %v, error %v, not-exist %v", got, err, tt.want, tt.bad, tt.missing)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestFreezerMark: a gVisor sandbox's pause is its mark file, whatever its cgroup's freezer
// says (the cgroup below does not even exist).
func TestFreezerMark(t *testing.T) {
	dir := t.TempDir()
	f := Freezer{Version: 1, Dir: filepath.Join(dir, "no-cgroup"), Mark: filepath.Join(dir, PauseMark)}
	for _, tt := range []struct {
		name string
		mark bool
		want bool
	}{{"no mark", false, false}, {"mark", true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(f.Mark)
			if tt.mark {
				if err := os.WriteFile(f.Mark, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got, err := f.Paused(); err != nil || got != tt.want {
				t.Errorf("Paused() = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}
