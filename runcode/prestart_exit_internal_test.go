package runcode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pyOutcome is what a caller sees of a python run: output and how it ended.
type pyOutcome struct {
	stdout, stderr string
	status         string // "exit N" or "signal S"
}

func outcomeOf(t *testing.T, err error, stdout, stderr []byte) pyOutcome {
	t.Helper()
	o := pyOutcome{stdout: string(stdout), stderr: string(stderr), status: "exit 0"}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			o.status = "signal " + ws.Signal().String()
		} else {
			o.status = fmt.Sprintf("exit %d", ws.ExitStatus())
		}
	} else if err != nil {
		t.Fatal(err)
	}
	return o
}

// runPythonThroughLoader runs code as `python3 main.py` in work through the loader (as a
// pre-started interpreter runs it, exit holder included), with env and stdin (nil: none);
// base is env's PYTHONPATH.
func runPythonThroughLoader(t *testing.T, py, work string, env []string, base *string, code string, stdin *string) pyOutcome {
	t.Helper()
	o, _ := runThroughLoader(t, py, work, env, base, code, stdin)
	return o
}

// runThroughLoader is runPythonThroughLoader that also reports whether a process of python's
// own process group outlived it (the exit holder, killed here). Python runs in a process group
// of its own; a run whose output is still open 20 s after python's exit fails the test.
func runThroughLoader(t *testing.T, py, work string, env []string, base *string, code string, stdin *string) (pyOutcome, bool) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "loader")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "usercustomize.py"), []byte(pythonLoader(dir, "main.py", base, true)), 0o644); err != nil {
		t.Fatal(err)
	}
	pp := dir
	if base != nil && *base != "" {
		pp += ":" + *base
	}
	cmd := exec.Command(py, "main.py")
	cmd.Dir, cmd.Env = work, append(slicesDeleteEnv(env, "PYTHONPATH"), "PYTHONPATH="+pp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// As the agent does for every command: nothing but 0, 1, 2 is inherited (descriptors this
	// test process got without close-on-exec would otherwise reach python, and the exit holder
	// is not made for a process holding other files).
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	errR, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	defer syscall.Kill(-pgid, syscall.SIGKILL) //nolint:errcheck // whatever is left of the group
	var guarded atomic.Bool
	guard := time.AfterFunc(20*time.Second, func() {
		guarded.Store(true)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	defer guard.Stop()
	br := bufio.NewReader(errR)
	marker := make([]byte, len(readyMarker))
	if _, err := io.ReadFull(br, marker); err != nil || string(marker) != readyMarker {
		rest, _ := io.ReadAll(br)
		_ = cmd.Wait()
		t.Fatalf("no ready marker: %q %v %s", marker, err, rest)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the loader's directory is still there while it waits: %v", err)
	}
	hasStdin := 0
	if stdin != nil {
		hasStdin = 1
	}
	payload := fmt.Sprintf("%d %d\n", len(code), hasStdin) + code
	if stdin != nil {
		payload += *stdin
	}
	if _, err := io.WriteString(in, payload); err != nil {
		t.Fatal(err)
	}
	in.Close()
	stderr, _ := io.ReadAll(br)
	err = cmd.Wait()
	guard.Stop()
	if guarded.Load() {
		t.Errorf("the run's output was still open 20 s after it started (held by a process it left?)")
	}
	return outcomeOf(t, err, out.Bytes(), stderr), groupLives(t, pgid)
}

// groupLives reports whether process group pgid holds a live process with signals blocked:
// the exit holder (a child the program started has exited or is exiting by the time the
// run's output ends, and blocks nothing).
func groupLives(t *testing.T, pgid int) bool {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) <= 2 || fields[0] == "Z" || fields[2] != strconv.Itoa(pgid) {
			continue
		}
		st, err := os.ReadFile(strings.TrimSuffix(f, "stat") + "status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "SigBlk:"); ok && strings.Trim(strings.TrimSpace(v), "0") != "" {
				return true
			}
		}
	}
	return false
}

// exitCorpus: programs whose end the loader's exit hook must not change. fast says whether the
// hook must freeze the heap for it ("yes"), must leave finalisation alone ("no": something of
// the program's could still run or be finalised), or either ("any": a race or not worth pinning).
var exitCorpus = []struct {
	name, code, fast string
}{
	{"print", "print(2+2)", "yes"},
	{"unflushed output", "import sys\nsys.stdout.write('x' * 100000)\nsys.stderr.write('y' * 100)", "yes"},
	{"exception", "def f():\n    raise ValueError('v')\nprint('before')\nf()", "yes"},
	{"exit 3", "import sys\nprint('a')\nsys.exit(3)", "yes"},
	{"exit message", "import sys\nsys.exit('bye')", "yes"},
	{"exit none", "raise SystemExit", "yes"},
	{"exit overflow", "import sys\nsys.exit(2**40)", "yes"},
	{"SystemExit subclass", "class Bye(SystemExit):\n    pass\nraise Bye(5)", "yes"},
	{"SystemExit code attribute", "class Bye(SystemExit):\n    code = 9\nraise Bye()", "yes"},
	{"keyboard interrupt", "print('x')\nraise KeyboardInterrupt", "yes"},
	{"atexit prints", "import atexit\natexit.register(print, 'at exit')\nprint('main')", "yes"},
	{"atexit raises and exits", "import atexit, sys\natexit.register(sys.exit, 4)\natexit.register(int, 'x')\nprint('main')", "yes"},
	{"stdout closed", "import os\nprint('lost')\nos.close(1)", "yes"},
	{"gc disabled", "import gc\ngc.disable()\nx = [1]\nx.append(x)\nprint('ok')", "yes"},
	{"imports", "import json, re, collections, dataclasses, typing\n@dataclasses.dataclass\nclass P:\n    x: int\nprint(json.dumps({'p': P(1).x}), isinstance({}, collections.abc.Mapping), re.sub('a', 'b', 'aa'))", "yes"},
	{"logging", "import logging\nlogging.basicConfig()\nlogging.warning('careful')", "yes"},
	{"tempfile", "import tempfile, os\nd = tempfile.TemporaryDirectory()\nopen(os.path.join(d.name, 'f'), 'w').close()\nprint(len(os.listdir(d.name)))", "any"},
	{"subprocess", "import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)", "any"},
	{"non-daemon thread", "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\nprint('main done')", "any"},
	{"non-daemon thread with exit code", "import threading, time, sys\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\nsys.exit(6)", "any"},

	{"daemon thread", "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\nprint('main')", "no"},
	{"__del__ of a global", "class D:\n    def __del__(self):\n        print('del at exit')\nd = D()", "no"},
	{"__del__ in garbage cycle", "class D:\n    def __del__(self):\n        print('cycle collected')\nd = D()\nd.me = d\ndel d", "no"},
	{"__del__ behind a class attribute", "class D:\n    def __del__(self):\n        print('class attr finalised')\nclass Holder:\n    pass\nHolder.d = D()", "no"},
	{"suspended generator in a cycle", "def g():\n    try:\n        yield 1\n    finally:\n        print('generator closed')\nit = g()\nnext(it)\nc = [it]\nc.append(c)", "no"},
	{"weakref callback on a cycle", "import weakref\nclass N:\n    pass\na = N()\na.me = a\nr = weakref.ref(a, lambda _: print('callback'))\ndel a", "no"},
	{"generator moved on by collections", "def g():\n    try:\n        yield 1\n    finally:\n        print('generator closed')\nit = g()\nnext(it)\nc = [it]\nc.append(c)\njunk = [[] for _ in range(300000)]\nprint(len(junk))", "no"},
	{"gc.collect moved it on", "import gc\nclass D:\n    def __del__(self):\n        print('del')\nclass H:\n    pass\nH.d = D()\ngc.collect()\nprint('main')", "no"},
	{"weak proxy", "import weakref\nclass N:\n    pass\na = N()\np = weakref.proxy(a, lambda _: print('proxy callback'))\nprint('main')", "no"},
	{"weakref.finalize without atexit", "import weakref\nclass N:\n    pass\na = N()\na.me = a\nf = weakref.finalize(a, print, 'finalized')\nf.atexit = False\ndel a", "yes"},
	{"unflushed file in a cycle", "import os\nlate = os.fdopen(os.dup(1), 'w')\nlate.write('written at finalisation\\n')\nc = [late]\nc.append(c)\nprint('main')", "no"},
	{"stdout replaced", "import io, sys\nsys.stdout = io.TextIOWrapper(open(1, 'wb', closefd=False))\nprint('through the new stdout')", "no"},
	{"gc callback", "import gc\ngc.callbacks.append(lambda phase, info: phase == 'stop' and print('gc', flush=True) if False else None)\nprint('x')", "no"},
	{"gc garbage saved", "import gc\ngc.set_debug(gc.DEBUG_SAVEALL)\nprint('x')", "no"},
	{"callbacks run by the program", "import atexit\natexit.register(print, 'ran once')\natexit._run_exitfuncs()\nprint('after')", "no"},
	{"metaclass with __eq__ and __hash__", "class M(type):\n    def __eq__(cls, other):\n        print('eq called')\n        return False\n    def __hash__(cls):\n        print('hash called')\n        return 1\nclass C(metaclass=M):\n    pass\nc = C()\nprint('main')", "yes"},
}

// TestPythonExitHookHost runs each program of exitCorpus in the host's python cold and through
// the loader, and wants the same output and end; a sitecustomize (imported before the loader,
// so its atexit callback runs after the hook) reports whether the hook froze the heap.
func TestPythonExitHookHost(t *testing.T) {
	py := hostPython(t)
	site := t.TempDir()
	report := filepath.Join(t.TempDir(), "frozen")
	if err := os.WriteFile(filepath.Join(site, "sitecustomize.py"), []byte(`import atexit, os
def _report():
    import gc, os
    with open(os.environ['AIRLOCK_TEST_FROZEN'], 'w') as f:
        f.write(str(gc.get_freeze_count()))
atexit.register(_report)
del atexit, os
`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(slicesDeleteEnv(slicesDeleteEnv(os.Environ(), "PYTHONPATH"), "AIRLOCK_TEST_FROZEN"), "PYTHONPATH="+site, "AIRLOCK_TEST_FROZEN="+report)
	frozen := func(t *testing.T) bool {
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatalf("the sitecustomize probe did not report: %v", err)
		}
		if err := os.Remove(report); err != nil {
			t.Fatal(err)
		}
		return string(b) != "0"
	}
	for _, tt := range exitCorpus {
		t.Run(tt.name, func(t *testing.T) {
			work := t.TempDir()
			want := runCold(t, py, work, env, tt.code, nil)
			if frozen(t) {
				t.Fatal("a cold run reports a frozen heap: the probe is broken")
			}
			got := runPythonThroughLoader(t, py, work, env, ptr(site), tt.code, nil)
			if got != want {
				t.Errorf("through the loader:\n%+v\ncold:\n%+v", got, want)
			}
			if f := frozen(t); (tt.fast == "yes" && !f) || (tt.fast == "no" && f) {
				t.Errorf("hook froze the heap: %v, want %s", f, tt.fast)
			}
		})
	}
}

// TestPythonExitHolderHost: the exit holder (pythonExitHolder) is made exactly when the exit
// hook found nothing of the program's left to run and python holds no file but 0, 1 and 2, and
// with it or without it the run's output and end are a cold run's. The guards checked to fail
// when removed: without the open-files check "pipe to a child" differs (the holder keeps the
// child's pipe open: "timeout" instead of "eof"); without moving 0, 1, 2 out of the holder's
// reach every run with a holder keeps its output open (the 20 s guard).
func TestPythonExitHolderHost(t *testing.T) {
	py := hostPython(t)
	env := slicesDeleteEnv(os.Environ(), "PYTHONPATH")
	const child = `import os, select, sys\nr = int(sys.argv[1])\nready, _, _ = select.select([r], [], [], 5)\nprint("eof" if ready and os.read(r, 1) == b"" else "timeout", flush=True)`
	tests := []struct {
		name, code string
		stdin      *string
		held       bool
		stdout     string // when set, what the cold run must print (the case tests what it says)
	}{
		{"print", "print(2+2)", nil, true, ""},
		{"atexit and exit code", "import atexit, sys\natexit.register(print, 'bye')\nprint('main')\nsys.exit(3)", nil, true, ""},
		{"exit message", "import sys\nsys.exit('msg')", nil, true, ""},
		{"unflushed output", "import sys\nsys.stdout.write('x' * 300000)\nsys.stderr.write('y' * 100)", nil, true, ""},
		{"exception", "print('before')\n1 / 0", nil, true, ""},
		{"keyboard interrupt", "print('x')\nraise KeyboardInterrupt", nil, true, ""},
		{"stdin", "import sys\nprint(sys.stdin.read()[::-1])", ptr("olleh"), true, ""},
		{"stdout closed", "import os\nprint('lost')\nos.close(1)", nil, false, ""},
		{"another file open", "import os\nfd = os.open(os.devnull, os.O_RDONLY)\nprint('x')", nil, false, ""},
		{"pipe to a child", "import os, sys\nr, w = os.pipe()\nos.set_inheritable(r, True)\nos.posix_spawn(sys.executable, [sys.executable, '-c', '" + child + "', str(r)], dict(os.environ))\nos.close(r)\nprint('main done', flush=True)", nil, false, "main done\neof\n"},
		{"__del__ at exit", "class D:\n    def __del__(self):\n        print('del at exit')\nd = D()", nil, false, ""},
		{"os._exit", "import os\nprint('lost')\nos._exit(4)", nil, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			work := t.TempDir()
			want := runCold(t, py, work, env, tt.code, tt.stdin)
			if tt.stdout != "" && want.stdout != tt.stdout {
				t.Fatalf("cold run printed %q (stderr %q), want %q: the case is broken", want.stdout, want.stderr, tt.stdout)
			}
			got, held := runThroughLoader(t, py, work, env, nil, tt.code, tt.stdin)
			if got != want {
				t.Errorf("through the loader:\n%+v\ncold:\n%+v", got, want)
			}
			if held != tt.held {
				t.Errorf("a holder outlived python: %v, want %v", held, tt.held)
			}
		})
	}
}

// TestPythonExitHookOutput: the output a program prints in its last moments (atexit callbacks,
// a non-daemon thread, exit messages) is all there through the loader; a guard on the corpus
// test above, which could pass with both runs losing it.
func TestPythonExitHookOutput(t *testing.T) {
	py := hostPython(t)
	work := t.TempDir()
	env := slicesDeleteEnv(os.Environ(), "PYTHONPATH")
	code := "import atexit, threading, time, sys\natexit.register(print, 'at exit')\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\nprint('main done')\nsys.exit('bye')"
	got := runPythonThroughLoader(t, py, work, env, nil, code, nil)
	want := pyOutcome{stdout: "main done\nthread done\nat exit\n", stderr: "bye\n", status: "exit 1"}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if !strings.HasSuffix(got.stdout, "at exit\n") {
		t.Error("atexit output missing")
	}
}

// BenchmarkPythonExitHost measures python's exit in the host's /usr/bin/python3 (no sandbox)
// through the loader with its exit hook and without it, interleaved: the CPU the process
// spends from the program's last line to its end (finalisation and exit; the hook's own scan
// included), as CPU time, which the shared machine's load distorts far less than wall time.
// The program is the benchmarks' print(2+2) with the two clocks read at its end.
func BenchmarkPythonExitHost(b *testing.B) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		b.Skip(err)
	}
	code := "print(2+2)\nimport time\nprint(time.process_time_ns())\n"
	with := pythonLoader("/x", "main.py", nil, false)
	without := strings.Replace(with, "    _airlock_fast_gc_at_exit(sys, had)\n", "", 1)
	if without == with {
		b.Fatal("the loader no longer calls the exit hook where this benchmark expects it")
	}
	env := slicesDeleteEnv(os.Environ(), "PYTHONPATH")
	run := func(loader string) (tail, total float64) {
		dir := filepath.Join(b.TempDir(), "loader")
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		src := strings.ReplaceAll(loader, `"/x"`, pyStr(dir))
		if err := os.WriteFile(filepath.Join(dir, "usercustomize.py"), []byte(src), 0o644); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(py, "main.py")
		cmd.Dir, cmd.Env = b.TempDir(), append(env, "PYTHONPATH="+dir)
		cmd.Stdin = strings.NewReader(fmt.Sprintf("%d 0\n%s", len(code), code))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			b.Fatalf("%v: %s", err, errb.String())
		}
		lines := strings.Fields(out.String())
		if len(lines) != 2 || lines[0] != "4" {
			b.Fatalf("output %q", out.String())
		}
		var at int64
		if _, err := fmt.Sscan(lines[1], &at); err != nil {
			b.Fatal(err)
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		cpu := ru.Utime.Nano() + ru.Stime.Nano()
		return float64(cpu-at) / 1e6, float64(cpu) / 1e6
	}
	var tw, tn, cw, cn []float64
	for b.Loop() {
		t, c := run(with)
		tw, cw = append(tw, t), append(cw, c)
		t, c = run(without)
		tn, cn = append(tn, t), append(cn, c)
	}
	b.ReportMetric(medianF(tw), "exit-cpu-ms/hook")
	b.ReportMetric(medianF(tn), "exit-cpu-ms/nohook")
	b.ReportMetric(medianF(cw), "cpu-ms/hook")
	b.ReportMetric(medianF(cn), "cpu-ms/nohook")
}

func medianF(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	slices.Sort(s)
	return s[len(s)/2]
}

// runCold runs code as main.py in work with a cold python, stdin (nil: none), and removes
// main.py again (the loader's run writes its own).
func runCold(t *testing.T, py, work string, env []string, code string, stdin *string) pyOutcome {
	t.Helper()
	if err := os.WriteFile(filepath.Join(work, "main.py"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	cold := exec.Command(py, "main.py")
	cold.Dir, cold.Env = work, env
	if stdin != nil {
		cold.Stdin = strings.NewReader(*stdin)
	}
	var so, se bytes.Buffer
	cold.Stdout, cold.Stderr = &so, &se
	want := outcomeOf(t, cold.Run(), so.Bytes(), se.Bytes())
	if err := os.Remove(filepath.Join(work, "main.py")); err != nil {
		t.Fatal(err)
	}
	return want
}
