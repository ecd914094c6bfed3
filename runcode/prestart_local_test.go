package runcode_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

// newPrestartPool is a run_code pool of size whose sandboxes hold langs' interpreters waiting.
func newPrestartPool(t *testing.T, b *local.Backend, size int, langs ...runcode.Language) *local.Pool {
	t.Helper()
	pf, err := runcode.Prestart(runcode.PrestartOptions{Languages: langs})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := local.NewPool(t.Context(), b, runcode.PoolTemplate(runcode.Options{}, time.Minute),
		local.PoolOptions{Size: size, IdleExpiry: time.Minute, Prestart: pf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return pool
}

// waitSettled waits until the pool holds n ready sandboxes and is creating none.
func waitSettled(t *testing.T, pool *local.Pool, n int) {
	t.Helper()
	waitFor(t, func() bool { st := pool.Stats(); return st.Size >= n && st.Creating == 0 })
}

// prestartCorpus: each snippet must give the same stdout, stderr, exit code, signal, timed-out
// and truncated flags from a pre-started interpreter as from a cold `python3 main.py` /
// `node main.js`. Environment probes (argv, sys.path, modules loaded, environment, files in
// /tmp and the working directory, stdin's nature) make any trace the loader left a mismatch.
var prestartCorpus = []struct {
	name string
	req  runcode.Request
	opts runcode.Options
	cold bool // the warm run must not use the pre-started interpreter
}{
	{name: "py imports", req: runcode.Request{Language: "python", Code: "import json, ssl, sqlite3\nprint(json.dumps({'a': [1, 2]}), ssl.OPENSSL_VERSION, sqlite3.sqlite_version)\nc = sqlite3.connect(':memory:')\nprint(c.execute('select 6*7').fetchone())"}},
	{name: "py environment", req: runcode.Request{Language: "python", Code: `import os, sys, site, gc
print(sys.argv, sys.orig_argv, __file__, __name__, __spec__, type(__loader__).__name__)
print(sys.path)
print(sorted(sys.modules))
print(sorted(os.environ.items()))
print(sorted(sys.path_importer_cache))
print(sys.flags, site.ENABLE_USER_SITE, site.USER_SITE)
print(os.listdir('/tmp'), sorted(os.listdir('.')), oct(os.stat('main.py').st_mode), os.stat('main.py').st_uid, os.stat('main.py').st_gid)
print(open(__file__).read() == open('main.py').read(), os.getcwd(), gc.get_freeze_count(), gc.isenabled(), gc.get_threshold())
print(sorted(os.popen('ps -e -o user=,comm=').read().split('\n')))
`}},
	{name: "py no stdin", req: runcode.Request{Language: "python", Code: "import os, sys, stat\ns = sys.stdin\nprint(stat.S_ISCHR(os.fstat(0).st_mode), s.seekable(), s.isatty(), s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.write_through, repr(s.newlines), type(s.buffer).__name__, s.buffer.raw.name, s.buffer.raw.closefd, sys.__stdin__ is s, repr(s.read()), s.tell())"}},
	{name: "py stdin", req: runcode.Request{Language: "python", Code: "import os, sys, stat\nprint(stat.S_ISFIFO(os.fstat(0).st_mode), sys.stdin.seekable())\nprint(sys.stdin.read()[::-1])", Stdin: "olleh\nsecond line ✓\n"}},
	{name: "py stdin line by line", req: runcode.Request{Language: "python", Code: "import sys\nfor i, line in enumerate(sys.stdin):\n    print(i, line.rstrip())", Stdin: strings.Repeat("line\n", 5000)}},
	{name: "py exception", req: runcode.Request{Language: "python", Code: "def f(x):\n    return 1 / x\n\ndef g():\n    try:\n        f(0)\n    except ZeroDivisionError as e:\n        raise KeyError('k') from e\n\nprint('before')\ng()"}},
	{name: "py syntax error", req: runcode.Request{Language: "python", Code: "print('a')\nif True\n    pass\n"}},
	{name: "py exit 0", req: runcode.Request{Language: "python", Code: "import sys\nprint('x')\nsys.exit(0)"}},
	{name: "py exit 3", req: runcode.Request{Language: "python", Code: "import sys\nsys.stderr.write('bad\\n')\nsys.exit(3)"}},
	{name: "py exit message", req: runcode.Request{Language: "python", Code: "import sys\ntry:\n    sys.exit('x')\nfinally:\n    print('finally')"}},
	{name: "py keyboard interrupt", req: runcode.Request{Language: "python", Code: "raise KeyboardInterrupt"}},
	{name: "py os._exit", req: runcode.Request{Language: "python", Code: "import os\nprint('lost in the buffer')\nos._exit(5)"}},
	{name: "py shutdown", req: runcode.Request{Language: "python", Code: `import atexit, os, sys, threading, time
class D:
    def __del__(self):
        print('del at exit')
d = D()
atexit.register(lambda: print('atexit'))
threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()
late = os.fdopen(os.dup(1), 'w')
late.write('written at finalisation\n')
print('main done')
`}},
	// The loader's exit hook (freezes the heap when nothing of the program's can run at exit):
	// a run it speeds up and runs it must leave alone; more in TestPythonExitHookHost.
	{name: "py exit fast path", req: runcode.Request{Language: "python", Code: "import atexit, json, logging, sys, threading, time\nlogging.basicConfig()\nlogging.warning('w')\natexit.register(print, 'atexit', json.dumps([1]))\nthreading.Thread(target=lambda: (time.sleep(0.1), print('thread done'))).start()\nclass Bye(SystemExit):\n    pass\nprint('unflushed')\nraise Bye(7)"}},
	{name: "py exit stdout closed", req: runcode.Request{Language: "python", Code: "import os\nprint('lost')\nos.close(1)"}},
	{name: "py exit garbage cycle finalised", req: runcode.Request{Language: "python", Code: "import sys\nclass D:\n    def __del__(self):\n        print('cycle collected')\nd = D()\nd.me = d\ndel d\nsys.exit('bye')"}},
	{name: "py exit suspended generator", req: runcode.Request{Language: "python", Code: "def g():\n    try:\n        yield 1\n    finally:\n        print('generator closed')\nit = g()\nnext(it)\nc = [it]\nc.append(c)"}},
	{name: "py unicode", req: runcode.Request{Language: "python", Code: "# -*- coding: utf-8 -*-\r\nprint('héllo ✓ 日本')\r\nprint(len('日本'))"}},
	{name: "py files", req: runcode.Request{Language: "python", Code: "print(open('data/in.txt').read(), open('/tmp/abs.txt').read())",
		Files: map[string][]byte{"data/in.txt": []byte("relative"), "/tmp/abs.txt": []byte("absolute")}}},
	{name: "py large output", req: runcode.Request{Language: "python", Code: "import sys\nsys.stdout.write('x' * (5 << 20))\nsys.stderr.write('e' * 1000)"}},
	{name: "py output cap", req: runcode.Request{Language: "python", Code: "import sys\nsys.stdout.write('y' * 3000)\nsys.stderr.write('z' * 3000)"}, opts: runcode.Options{MaxOutputBytes: 1000}},
	// The run's cap goes with its code (the agent's handoff), whatever the interpreter started with.
	{name: "py cap over the default", req: runcode.Request{Language: "python", Code: "import sys\nsys.stdout.write('w' * (3 << 20))"}, opts: runcode.Options{MaxOutputBytes: 2 << 20}},
	// Processes the program started that still hold its output when it exits: killed with it,
	// their later output lost, cold and pre-started alike (a pre-started run reports its exit
	// first, client.ProcessRequest.ExitFirst); the second leaves nothing that finalisation
	// could run, so python's exit also goes through the exit holder.
	{name: "py child holds output", req: runcode.Request{Language: "python", Code: "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 0.3; echo late'])\nprint('main done')"}},
	{name: "py spawned child holds output", req: runcode.Request{Language: "python", Code: "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'echo early; sleep 0.3; echo late'], dict(os.environ))\nimport time\ntime.sleep(0.1)\nprint('main done')"}},
	{name: "py oom", req: runcode.Request{Language: "python", Code: "print('start', flush=True)\nb = bytearray(1 << 30)\nprint(len(b))"}},
	{name: "py timeout", req: runcode.Request{Language: "python", Code: "import sys\nprint('started', flush=True)\nwhile True:\n    pass", TimeoutSeconds: 1}},

	{name: "node imports", req: runcode.Request{Language: "node", Code: "const fs = require('fs'), crypto = require('crypto');\nconsole.log(crypto.createHash('sha256').update('x').digest('hex'), fs.readdirSync('/workspace'), typeof fs.promises.readFile)"}},
	{name: "node environment", req: runcode.Request{Language: "node", Code: `console.log(process.argv, process.execArgv, __filename, __dirname, require.main === module, module.id)
console.log(Object.keys(require.cache), module.paths, process.cwd(), process.title)
console.log(Object.entries(process.env).sort())
const fs = require('fs');
console.log(fs.readdirSync('/tmp'), fs.readdirSync('.').sort(), (fs.statSync('main.js').mode & 0o777).toString(8), fs.statSync('main.js').uid)
console.log(require('child_process').execSync('ps -e -o user=,comm=').toString().split('\n').sort())
console.log(typeof globalThis.require, typeof globalThis.module, Object.keys(globalThis).sort())
`}},
	{name: "node stdin", req: runcode.Request{Language: "node", Code: "const d = require('fs').readFileSync(0, 'utf8');\nconsole.log(d.split('').reverse().join(''))", Stdin: "olleh ✓"}},
	{name: "node stdin stream", req: runcode.Request{Language: "node", Code: "let n = 0;\nprocess.stdin.on('data', d => n += d.length);\nprocess.stdin.on('end', () => console.log('bytes', n));", Stdin: strings.Repeat("z", 300000)}},
	{name: "node throw", req: runcode.Request{Language: "node", Code: "function f() { throw new TypeError('kaput'); }\nconsole.log('before');\nf();"}},
	{name: "node unhandled rejection", req: runcode.Request{Language: "node", Code: "Promise.reject(new Error('nope'));"}},
	{name: "node syntax error", req: runcode.Request{Language: "node", Code: "console.log('a'\nlet = ;"}},
	{name: "node exitCode", req: runcode.Request{Language: "node", Code: "process.on('exit', c => console.log('exit', c));\nprocess.exitCode = 3;\nsetTimeout(() => console.log('timer'), 50);"}},
	{name: "node exit", req: runcode.Request{Language: "node", Code: "console.error('err');\nprocess.exit(4);\nconsole.log('never')"}},
	{name: "node large output", req: runcode.Request{Language: "node", Code: "process.stdout.write('x'.repeat(5 << 20));\nprocess.stderr.write('e'.repeat(1000));"}},
	{name: "node timeout", req: runcode.Request{Language: "node", Code: "console.log('started');\nsetInterval(() => {}, 1000);", TimeoutSeconds: 1}},

	// Another language in a sandbox holding interpreters: they are gone before it runs.
	{name: "bash alone", req: runcode.Request{Language: "bash", Code: "ps=$(ps -e -o user=,comm=)\necho \"$ps\" | sort; ls -A /tmp; ls -A"}, cold: true},
}

// TestLocalPrestartSameResults runs the corpus cold and from a pool whose sandboxes hold
// python and node pre-started, and wants the same results; every warm run is a pool hit.
func TestLocalPrestartSameResults(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	pool := newPrestartPool(t, b, 2, runcode.Python, runcode.Node)
	for _, tt := range prestartCorpus {
		t.Run(tt.name, func(t *testing.T) {
			cold, err := runcode.Run(t.Context(), b, tt.req, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			waitSettled(t, pool, 1)
			hits := pool.Stats().Hits
			rec := &recorder{}
			opts := withPool(tt.opts, pool)
			opts.Logger = slog.New(rec)
			warm, err := runcode.Run(t.Context(), b, tt.req, opts)
			if err != nil {
				t.Fatal(err)
			}
			if pool.Stats().Hits != hits+1 {
				t.Fatalf("the warm run was not a pool hit: %+v", pool.Stats())
			}
			if used := rec.has("run_code: ran in a pre-started interpreter"); used == tt.cold {
				t.Fatalf("ran in the pre-started interpreter: %v, want %v; log: %q", used, !tt.cold, rec.messages())
			}
			if d := diffResults(cold, warm); d != "" {
				t.Errorf("pre-started differs from cold: %s", d)
			}
		})
	}
}

// recorder keeps the messages logged through it.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }
func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}
func (r *recorder) has(msg string) bool { return slices.Contains(r.messages(), msg) }

func withPool(o runcode.Options, p runcode.Pool) runcode.Options {
	o.Pool = p
	return o
}

// diffResults names the first field where b differs from a ("" when none): everything a
// caller sees but the sandbox id and the duration.
func diffResults(a, b runcode.Result) string {
	fields := []struct {
		name string
		a, b any
	}{
		{"exit code", a.ExitCode, b.ExitCode}, {"signal", a.Signal, b.Signal}, {"timed out", a.TimedOut, b.TimedOut},
		{"oom killed", a.OOMKilled, b.OOMKilled}, {"truncated", a.Truncated, b.Truncated},
		{"timeout", a.TimeoutSeconds, b.TimeoutSeconds}, {"cap", a.OutputCapBytes, b.OutputCapBytes},
		{"memory", a.Memory, b.Memory}, {"language", a.Language, b.Language},
		{"stdout", a.Stdout, b.Stdout}, {"stderr", a.Stderr, b.Stderr},
	}
	for _, f := range fields {
		if f.a != f.b {
			return fmt.Sprintf("%s: cold %q, pre-started %q", f.name, trim(fmt.Sprint(f.a)), trim(fmt.Sprint(f.b)))
		}
	}
	return ""
}

func trim(s string) string {
	if len(s) > 3000 {
		return s[:3000] + "..."
	}
	return s
}

// TestLocalPrestartConfinement: the code runs in the interpreter that waited in the pool
// (older than the claim), and that interpreter is confined as any exec is: the code's uid, no
// new privileges, the seccomp filter on. The age check keeps this test honest: a run that
// fell back to a cold exec would not be testing the waiting interpreter.
func TestLocalPrestartConfinement(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	for _, lang := range []runcode.Language{runcode.Python, runcode.Node} {
		t.Run(string(lang), func(t *testing.T) {
			pool := newPrestartPool(t, b, 1, lang)
			waitSettled(t, pool, 1)
			time.Sleep(1500 * time.Millisecond) // the interpreter now waits at least this long
			code := map[runcode.Language]string{
				runcode.Python: "import os\nst = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\nup = float(open('/proc/uptime').read().split()[0])\nprint('age', up - int(st[19]) / os.sysconf('SC_CLK_TCK'))\nprint(open('/proc/self/status').read())",
				runcode.Node:   "const fs = require('fs');\nconst st = fs.readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ');\nconst up = parseFloat(fs.readFileSync('/proc/uptime', 'utf8'));\nconsole.log('age', up - parseInt(st[19]) / 100);\nconsole.log(fs.readFileSync('/proc/self/status', 'utf8'));",
			}[lang]
			res, err := runcode.Run(t.Context(), b, runcode.Request{Language: string(lang), Code: code}, runcode.Options{Pool: pool})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("%v\n%s", err, res.Text())
			}
			status := map[string]string{}
			var age float64
			for _, line := range strings.Split(res.Stdout, "\n") {
				if v, ok := strings.CutPrefix(line, "age "); ok {
					age, _ = strconv.ParseFloat(v, 64)
				}
				if k, v, ok := strings.Cut(line, ":"); ok {
					status[k] = strings.Join(strings.Fields(v), " ")
				}
			}
			if age < 1 {
				t.Fatalf("the code ran in a process %.2fs old: not the interpreter that waited in the pool\n%s", age, res.Text())
			}
			for k, want := range map[string]string{"Uid": "1000 1000 1000 1000", "Gid": "1000 1000 1000 1000", "NoNewPrivs": "1", "Seccomp": "2", "CapEff": "0000000000000000"} {
				if status[k] != want {
					t.Errorf("%s: %q, want %q", k, status[k], want)
				}
			}
		})
	}
}

// TestLocalPrestartNeverReused: every run gets a sandbox of its own, pre-started or not: what
// one run leaves behind is never seen by another, and every sandbox is gone afterwards.
func TestLocalPrestartNeverReused(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	pool := newPrestartPool(t, b, 1, runcode.Python)
	seen := map[string]bool{}
	code := "import os, glob\nprint(glob.glob('/tmp/mark-*') + glob.glob('/workspace/mark-*'), os.getpid())\nopen('/tmp/mark-' + str(os.getpid()), 'w').close()\nopen('/workspace/mark-x', 'w').close()"
	for i := range 6 {
		if i%2 == 0 {
			waitSettled(t, pool, 1) // a hit; odd runs come at once and may find the pool empty
		}
		res, err := runcode.Run(t.Context(), b, runcode.Request{Language: "python", Code: code}, runcode.Options{Pool: pool})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%v\n%s", err, res.Text())
		}
		if !strings.HasPrefix(res.Stdout, "[] ") {
			t.Errorf("run %d saw an earlier run's files: %s", i, res.Stdout)
		}
		if seen[res.SandboxID] {
			t.Errorf("run %d got sandbox %s again", i, res.SandboxID)
		}
		seen[res.SandboxID] = true
	}
	if st := pool.Stats(); st.Hits < 3 {
		t.Errorf("pool stats %+v: want at least the settled runs to be hits", st)
	}
	waitFor(t, func() bool {
		list, _ := b.List(t.Context())
		return len(list) == pool.Stats().Size+pool.Stats().Creating
	})
}
