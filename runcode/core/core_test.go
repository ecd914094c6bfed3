package core

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		name    string
		req     Request
		lang    string
		timeout int
		errHas  []string // all must appear; nil means no error
	}{
		{name: "python", req: Request{Language: "python", Code: "print(1)"}, lang: "python", timeout: 30},
		{name: "py alias", req: Request{Language: "py", Code: "x"}, lang: "python", timeout: 30},
		{name: "python3 alias upper", req: Request{Language: "PYTHON3", Code: "x"}, lang: "python", timeout: 30},
		{name: "js alias", req: Request{Language: "js", Code: "x"}, lang: "node", timeout: 30},
		{name: "javascript mixed case", req: Request{Language: "JavaScript", Code: "x"}, lang: "node", timeout: 30},
		{name: "node", req: Request{Language: "node", Code: "x"}, lang: "node", timeout: 30},
		{name: "sh alias", req: Request{Language: "sh", Code: "x"}, lang: "bash", timeout: 30},
		{name: "shell alias padded", req: Request{Language: " shell ", Code: "x"}, lang: "bash", timeout: 30},
		{name: "bash", req: Request{Language: "bash", Code: "x"}, lang: "bash", timeout: 30},
		{name: "timeout kept", req: Request{Language: "bash", Code: "x", TimeoutSeconds: 7}, lang: "bash", timeout: 7},
		{name: "timeout min", req: Request{Language: "bash", Code: "x", TimeoutSeconds: 1}, lang: "bash", timeout: 1},
		{name: "timeout cap", req: Request{Language: "bash", Code: "x", TimeoutSeconds: 300}, lang: "bash", timeout: 300},
		{name: "unknown language", req: Request{Language: "ruby", Code: "x"},
			errHas: []string{`"ruby"`, "python", "node", "bash", "py", "python3", "js", "javascript", "sh", "shell"}},
		{name: "empty language", req: Request{Code: "x"}, errHas: []string{"language is empty", "python"}},
		{name: "empty code", req: Request{Language: "python"}, errHas: []string{"code is empty"}},
		{name: "blank code", req: Request{Language: "python", Code: " \n\t"}, errHas: []string{"code is empty"}},
		{name: "over-cap timeout", req: Request{Language: "python", Code: "x", TimeoutSeconds: 301},
			errHas: []string{"timeout_seconds 301", "cap of 300 seconds"}},
		{name: "negative timeout", req: Request{Language: "python", Code: "x", TimeoutSeconds: -1},
			errHas: []string{"timeout_seconds -1", "at least 1"}},
		{name: "huge code", req: Request{Language: "python", Code: strings.Repeat("#", MaxCodeBytes+1)},
			errHas: []string{"over the cap of 1048576 bytes"}},
		{name: "file with dotdot", req: Request{Language: "python", Code: "x", Files: map[string][]byte{"../etc/x": nil}},
			errHas: []string{`"../etc/x"`, "'..'"}},
		{name: "file empty path", req: Request{Language: "python", Code: "x", Files: map[string][]byte{"": nil}},
			errHas: []string{"file path is empty"}},
		{name: "file overwriting code", req: Request{Language: "py", Code: "x", Files: map[string][]byte{"./main.py": nil}},
			errHas: []string{"overwrite the code", "main.py"}},
		{name: "file ok", req: Request{Language: "py", Code: "x", Files: map[string][]byte{"data/in.txt": nil, "/tmp/x": nil}},
			lang: "python", timeout: 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize(tt.req)
			if tt.errHas != nil {
				if err == nil {
					t.Fatalf("Normalize(%+v) succeeded, want error containing %q", tt.req, tt.errHas)
				}
				if !errors.Is(err, sbtypes.ErrInvalid) {
					t.Errorf("error %v does not wrap sbtypes.ErrInvalid", err)
				}
				for _, s := range tt.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			if got.Language != tt.lang || got.TimeoutSeconds != tt.timeout {
				t.Errorf("got language %q timeout %d, want %q %d", got.Language, got.TimeoutSeconds, tt.lang, tt.timeout)
			}
			if got.Code != tt.req.Code {
				t.Errorf("code changed")
			}
		})
	}
}

func TestLanguageNames(t *testing.T) {
	got := strings.Join(LanguageNames(), ",")
	want := "python,node,bash,javascript,js,py,python3,sh,shell"
	if got != want {
		t.Fatalf("LanguageNames() = %s, want %s", got, want)
	}
	for _, n := range LanguageNames() {
		if _, err := ParseLanguage(n); err != nil {
			t.Errorf("listed name %q does not parse: %v", n, err)
		}
	}
}

func TestResultText(t *testing.T) {
	tests := []struct {
		name string
		r    Result
		want string
	}{
		{name: "both streams", r: Result{ExitCode: 0, Stdout: "hi\n", Stderr: "warn\n"},
			want: "Exit code: 0\n--- stdout ---\nhi\n--- stderr ---\nwarn\n"},
		{name: "no output", r: Result{ExitCode: 3}, want: "Exit code: 3\n"},
		{name: "stdout only, no trailing newline", r: Result{ExitCode: 0, Stdout: "4"},
			want: "Exit code: 0\n--- stdout ---\n4\n"},
		{name: "stderr only", r: Result{ExitCode: 1, Stderr: "boom\n"},
			want: "Exit code: 1\n--- stderr ---\nboom\n"},
		{name: "timeout", r: Result{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, TimeoutSeconds: 30, Stdout: "started\n"},
			want: "Exit code: 137\nTimed out after 30s: the program and everything it started were killed\n--- stdout ---\nstarted\n"},
		{name: "oom", r: Result{ExitCode: 137, Signal: "SIGKILL", OOMKilled: true, Memory: "512Mi"},
			want: "Exit code: 137\nKilled: out of memory (limit 512Mi)\n"},
		{name: "signal", r: Result{ExitCode: 143, Signal: "SIGTERM"},
			want: "Exit code: 143\nKilled by signal SIGTERM\n"},
		{name: "truncated", r: Result{ExitCode: 0, Truncated: true, OutputCapBytes: 10, Stdout: "0123456789"},
			want: "Exit code: 0\nOutput truncated: each stream is capped at 10 bytes\n--- stdout ---\n0123456789\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Text(); got != tt.want {
				t.Errorf("Text() =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		r    Result
		want int
	}{
		{Result{ExitCode: 0}, 0},
		{Result{ExitCode: 3}, 3},
		{Result{ExitCode: 137, TimedOut: true}, 124},
		{Result{ExitCode: 137, OOMKilled: true}, 137},
		{Result{ExitCode: -1}, 1},
	}
	for _, tt := range tests {
		if got := tt.r.ExitStatus(); got != tt.want {
			t.Errorf("%+v.ExitStatus() = %d, want %d", tt.r, got, tt.want)
		}
	}
}

func TestCapped(t *testing.T) {
	c := &capped{max: 5}
	for _, p := range []string{"ab", "cd", "é!"} { // é is two bytes: the cap splits it
		if n, err := c.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v: a cap must never fail the writer", p, n, err)
		}
	}
	if !c.over {
		t.Fatal("over not set past the cap")
	}
	if got := c.String(); got != "abcd" {
		t.Fatalf("String() = %q, want the partial é dropped: %q", got, "abcd")
	}
	d := &capped{max: 10}
	d.Write([]byte("héllo"))
	if d.over || d.String() != "héllo" {
		t.Fatalf("under the cap: %q over=%v", d.String(), d.over)
	}
}
