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
		{name: "over-cap timeout capped", req: Request{Language: "python", Code: "x", TimeoutSeconds: 301}, lang: "python", timeout: 300},
		{name: "far over-cap timeout capped", req: Request{Language: "python", Code: "x", TimeoutSeconds: 86400}, lang: "python", timeout: 300},
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
			want: "Exit code: 0\n\n--- stdout ---\nhi\n--- stderr ---\nwarn\n"},
		{name: "no output", r: Result{ExitCode: 3}, want: "Exit code: 3\n"},
		{name: "stdout only, no trailing newline", r: Result{ExitCode: 0, Stdout: "4"},
			want: "Exit code: 0\n\n--- stdout ---\n4\n"},
		{name: "stderr only", r: Result{ExitCode: 1, Stderr: "boom\n"},
			want: "Exit code: 1\n\n--- stderr ---\nboom\n"},
		{name: "timeout: status after the sections", r: Result{ExitCode: 124, Signal: "SIGKILL", TimedOut: true, TimeoutSeconds: 30, Stdout: "started\n", Stderr: "e"},
			want: "Exit code: 124\n\n--- stdout ---\nstarted\n--- stderr ---\ne\n\nTimed out after 30s: the program and everything it started were killed\n"},
		{name: "oom without output", r: Result{ExitCode: 137, Signal: "SIGKILL", OOMKilled: true, Memory: "512Mi"},
			want: "Exit code: 137\n\nKilled: out of memory (limit 512Mi)\n"},
		{name: "signal", r: Result{ExitCode: 143, Signal: "SIGTERM"},
			want: "Exit code: 143\n\nKilled by signal SIGTERM\n"},
		{name: "truncated", r: Result{ExitCode: 0, Truncated: true, OutputCapBytes: 10, Stdout: "0123456789"},
			want: "Exit code: 0\n\n--- stdout ---\n0123456789\n\nOutput truncated: each stream is capped at 10 bytes\n"},
		{name: "cut, not UTF-8, capped timeout", r: Result{ExitCode: 0, CutBytes: 7, NotUTF8: true, TimeoutSeconds: 300, TimeoutCappedFrom: 900, Stdout: "x"},
			want: "Exit code: 0\n\n--- stdout ---\nx\n\nOutput shortened: 7 bytes were left out of the middle (marked where), keeping each stream's beginning and end\n" +
				"Output is not valid UTF-8 text: its invalid bytes are shown as U+FFFD\nTimeout capped: 900s asked for, 300s is the most a run gets\n"},
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

// TestCaptureOverrun: the cap is the agent's to keep; output past it is an agent that did
// not, an error rather than a result cut a second time here.
func TestCaptureOverrun(t *testing.T) {
	c := newCapture(Options{MaxOutputBytes: 5})
	for _, p := range []string{"ab", "cd", "e!"} {
		if n, err := c.stdout.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v: a tee to the caller's writer must not fail", p, n, err)
		}
	}
	if _, err := c.resultOf(sbtypes.ExecResult{}, 1); !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
		t.Fatalf("6 bytes under a cap of 5: %v, want ErrOutcomeUnknown", err)
	}
	d := newCapture(Options{MaxOutputBytes: 5})
	d.stdout.Write([]byte("héll")) // 5 bytes: at the cap, not over it
	res, err := d.resultOf(sbtypes.ExecResult{}, 1)
	if err != nil || res.Stdout != "héll" || res.Truncated {
		t.Fatalf("at the cap: %+v %v", res, err)
	}
}

// TestCaptureAgentCap: a stream the agent cut at the cap ends at a
// character boundary too (issue 25: MCP output at the cap ended in U+FFFD).
func TestCaptureAgentCap(t *testing.T) {
	c := newCapture(Options{MaxOutputBytes: 5})
	c.stdout.Write([]byte("abcd\xc3")) // the agent cut "abcdé" after é's first byte
	c.stderr.Write([]byte("ok\xc3"))   // under the cap: the program's own bytes, flagged
	res := c.result(sbtypes.ExecResult{Truncated: true})
	if res.Stdout != "abcd" || !res.Truncated {
		t.Errorf("stdout %q truncated=%v, want %q cut before the partial character", res.Stdout, res.Truncated, "abcd")
	}
	if res.Stderr != "ok\uFFFD" || !res.NotUTF8 {
		t.Errorf("stderr %q not_utf8=%v, want the invalid byte shown and flagged", res.Stderr, res.NotUTF8)
	}
}

// TestCaptureView: with ViewBytes, each stream keeps its beginning and its end around a
// marker of what was cut, cut at character boundaries; shorter streams are whole.
func TestCaptureView(t *testing.T) {
	c := newCapture(Options{MaxOutputBytes: 1 << 20, ViewBytes: 10})
	c.stdout.Write([]byte("héllo, " + strings.Repeat("-", 100) + " the énd"))
	c.stderr.Write([]byte("short"))
	res := c.result(sbtypes.ExecResult{})
	// Head: 5 bytes is "héll" (é is two); tail: the last 5 bytes are " énd" minus nothing split.
	want := "héll\n[... 107 bytes cut here ...]\n énd"
	if res.Stdout != want {
		t.Errorf("stdout %q, want %q", res.Stdout, want)
	}
	if res.Stderr != "short" || res.CutBytes != 107 || res.Truncated || res.NotUTF8 {
		t.Errorf("result %+v", res)
	}
	if !strings.Contains(res.Text(), "Output shortened: 107 bytes") {
		t.Errorf("text does not say what was cut:\n%s", res.Text())
	}
}

// TestTimeoutExitCode: a run killed at its timeout exits 124 on every surface.
func TestTimeoutExitCode(t *testing.T) {
	c := newCapture(Options{})
	res := c.result(sbtypes.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true})
	if res.ExitCode != TimeoutExitCode || res.ExitStatus() != 124 || !strings.HasPrefix(res.Text(), "Exit code: 124\n") {
		t.Errorf("result %+v text %q", res, res.Text())
	}
}
