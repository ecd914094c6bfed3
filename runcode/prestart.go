package runcode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
)

// Pre-started interpreters (docs/pool.md#pre-started-interpreters).
//
// A pooled sandbox may hold, per language, the very command a cold run would exec (python3
// main.py, node main.js) already started as a background process of its agent: same uid,
// seccomp, Landlock, cgroup and limits as any exec, because the agent starts it like one. Its
// start-up runs to the last step before the program file is opened, then a small loader blocks
// reading stdin: python's user customisation hook (usercustomize, found through PYTHONPATH)
// after site is imported, node's --require preload after its bootstrap. A run writes one frame
// to that stdin,
//
//	"<code bytes> <stdin: 0|1>\n" code [stdin...]
//
// the loader writes the code to the program file (main.py / main.js in the working directory,
// mode 0644, as a cold run's file), undoes every trace of itself (its files, PYTHONPATH, the
// sys.path entry; node's execArgv and require cache) and returns, and the interpreter goes on
// exactly as the cold command: it opens the file and runs it as __main__ / the main module, so
// argv, tracebacks, exit codes and finalisation are the interpreter's own. Whatever follows the
// code on the pipe is the program's stdin; with no stdin, python's loader puts /dev/null on fd 0
// (and rebuilds sys.stdin the way the interpreter built it) as a cold run has; node cannot dup2,
// so its stdin is a pipe at EOF instead.
//
// The loader writes readyMarker to stderr once it waits; Prestart waits for it. A run hands the
// frame over with its deadline and caps in one agent call (the handoff), which the agent keeps
// as an exec's: the deadline kills the whole cgroup, the caps count from the handoff, and the
// answer is the program's output and exit.

// readyMarker is what a loader writes to stderr once it waits for code; never program output.
const readyMarker = "\x00airlock-prestart-ready\n"

// PrestartLanguages are the languages Prestart can start ahead.
func PrestartLanguages() []Language { return []Language{Python, Node} }

// PrestartOptions configure Prestart.
type PrestartOptions struct {
	// Languages to start in every pooled sandbox; each is python or node. A run in another
	// language (or one that does not use an interpreter) kills them before its code runs.
	Languages []Language
	Logger    *slog.Logger
}

// PrestartFunc is local.PoolOptions.Prestart's type; what it returns is a *core.Prestarted.
type PrestartFunc = prestarted.Func

// ParsePrestart parses a comma-separated list of languages (aliases allowed) for Prestart;
// "none" or "" is no language.
func ParsePrestart(s string) ([]Language, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "none") {
		return nil, nil
	}
	var out []Language
	for _, part := range strings.Split(s, ",") {
		l, err := ParseLanguage(part)
		if err != nil {
			return nil, err
		}
		if !canPrestart(l) {
			return nil, fmt.Errorf("%w: language %q cannot be pre-started: allowed are python, node (or none)", sandbox.ErrInvalid, part)
		}
		if !containsLang(out, l) {
			out = append(out, l)
		}
	}
	return out, nil
}

func canPrestart(l Language) bool { return core.CanPrestart(l) }

func containsLang(ls []Language, l Language) bool {
	for _, x := range ls {
		if x == l {
			return true
		}
	}
	return false
}

// processAgent is the background-process part of agent/client.Client, which the local
// backend's agents provide: what starting the interpreters here and running in them
// (core.RunIn) use, so that a client without one of them gets no interpreters at all.
type processAgent interface {
	StartProcess(ctx context.Context, req client.ProcessRequest, opts ...client.ExecOption) (client.Process, error)
	Attach(ctx context.Context, id string, fromStart bool) (*client.Stream, error)
	Handoff(ctx context.Context, id string, req client.HandoffRequest) (*client.Stream, error)
	RemoveProcess(ctx context.Context, id string) error
	Signal(ctx context.Context, id, signal string) error
	Wait(ctx context.Context, id string) (sandbox.ExecResult, error)
}

// Prestart returns a local.PoolOptions.Prestart that starts opts.Languages' interpreters in
// every sandbox a pool creates (see the package comment above). A language whose interpreter
// does not reach its loader (not installed, user site disabled) is left out and the run uses a
// cold exec; it is an error only when none started.
func Prestart(opts PrestartOptions) (PrestartFunc, error) {
	if len(opts.Languages) == 0 {
		return nil, fmt.Errorf("%w: prestart: no language: give python, node or both", sandbox.ErrInvalid)
	}
	for _, l := range opts.Languages {
		if !canPrestart(l) {
			return nil, fmt.Errorf("%w: prestart: language %q cannot be pre-started: allowed are python, node", sandbox.ErrInvalid, l)
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	ps := &prestarter{langs: append([]Language(nil), opts.Languages...), log: log, warned: map[Language]*atomic.Bool{}}
	for _, l := range ps.langs {
		ps.warned[l] = &atomic.Bool{}
	}
	return ps.prestart, nil
}

type prestarter struct {
	langs  []Language
	log    *slog.Logger
	warned map[Language]*atomic.Bool

	// pythonPath caches the PYTHONPATH of the environment the code gets, per image and env:
	// the loader is found through PYTHONPATH and must leave exactly that behind.
	mu         sync.Mutex
	pythonPath map[string]*string
}

func (ps *prestarter) prestart(ctx context.Context, sess *sandbox.Session, ag sandbox.Agent) (prestarted.Interpreters, error) {
	pa, ok := ag.(processAgent)
	if !ok {
		return nil, fmt.Errorf("%w: prestart: this backend's agent client has no background processes", sandbox.ErrUnsupported)
	}
	deadline := processDeadline(sess)
	if deadline < time.Minute {
		return nil, fmt.Errorf("%w: prestart: sandbox %s has %v of lifetime left", sandbox.ErrRefused, sess.ID, deadline)
	}
	workdir := sess.Spec.Workdir
	if workdir == "" {
		workdir = "/workspace"
	}
	procs := map[Language]string{}
	var errs []error
	for _, l := range ps.langs {
		w, err := ps.start(ctx, pa, ag, sess, l, workdir, deadline)
		if err != nil {
			err = fmt.Errorf("prestart %s: %w", l, err)
			errs = append(errs, err)
			if ctx.Err() != nil {
				break // the pool is closing
			}
			if ps.warned[l].CompareAndSwap(false, true) {
				ps.log.Warn("run_code: pre-starting an interpreter failed; runs in this language exec it cold", "session", sess.ID, "err", err)
			} else {
				ps.log.Debug("run_code: pre-starting an interpreter failed", "session", sess.ID, "err", err)
			}
			continue
		}
		procs[l] = w
	}
	if len(procs) == 0 {
		return nil, errors.Join(errs...)
	}
	// A run makes one request (the handoff), two when its stdin streams, and ends the other
	// languages' interpreters in parallel: leave two connections open for it.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = ag.Health(ctx)
		}()
	}
	wg.Wait()
	return core.NewPrestarted(ag, procs), nil
}

// processDeadline is how long a background process of sess may run: until the sandbox ends.
func processDeadline(sess *sandbox.Session) time.Duration {
	if !sess.ExpiresAt.IsZero() {
		return time.Until(sess.ExpiresAt)
	}
	// No expiry published: the declared lifetime, else airlock's default bounds the process (a
	// lifetime left to the platform is not known here, and the agent needs a deadline).
	return time.Duration(sess.Spec.Session.Lifetime())*time.Second - time.Since(sess.CreatedAt)
}

// start starts one language's interpreter and waits until its loader waits for code.
func (ps *prestarter) start(ctx context.Context, pa processAgent, ag sandbox.Agent, sess *sandbox.Session, l Language, workdir string, deadline time.Duration) (string, error) {
	file, argv := core.Program(l)
	dir := "/tmp/.airlock-prestart-" + string(l) + "-" + randomHex(6)
	if err := ag.Mkdir(ctx, dir, 0o755); err != nil {
		return "", fmt.Errorf("creating the loader's directory %s: %w", dir, err)
	}
	// The run's deadline and caps come with its code (core's handoff); until then the
	// interpreter has the sandbox's lifetime and the agent's default caps.
	req := client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
		Cwd: workdir, Timeout: deadline,
	}, OpenStdin: true,
		// The sandbox is discarded after the run: the exit is reported without waiting for
		// what the program left (pythonExitHolder's holder) to be gone.
		ExitFirst: true}
	switch l {
	case Python:
		base, err := ps.basePythonPath(ctx, ag, sess, workdir)
		if err != nil {
			_ = ag.Remove(context.WithoutCancel(ctx), dir, true)
			return "", err
		}
		pp := dir
		if base != nil && *base != "" { // python treats an empty PYTHONPATH as unset
			pp += ":" + *base
		}
		if err := ag.WriteFile(ctx, dir+"/usercustomize.py", strings.NewReader(pythonLoader(dir, file, base, true)), 0o644); err != nil {
			_ = ag.Remove(context.WithoutCancel(ctx), dir, true)
			return "", fmt.Errorf("writing the loader: %w", err)
		}
		req.Argv = argv
		req.Env = map[string]string{"PYTHONPATH": pp}
	case Node:
		if err := ag.WriteFile(ctx, dir+"/loader.js", strings.NewReader(nodeLoader(dir)), 0o644); err != nil {
			_ = ag.Remove(context.WithoutCancel(ctx), dir, true)
			return "", fmt.Errorf("writing the loader: %w", err)
		}
		req.Argv = []string{argv[0], "--require", dir + "/loader.js", file}
	}
	p, err := pa.StartProcess(ctx, req)
	if err != nil {
		_ = ag.Remove(context.WithoutCancel(ctx), dir, true)
		return "", fmt.Errorf("starting %s: %w", strings.Join(req.Argv, " "), err)
	}
	if err := awaitReady(ctx, pa, p.ID); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminateTimeout)
		defer cancel()
		_ = pa.RemoveProcess(rctx, p.ID)
		_ = ag.Remove(rctx, dir, true)
		return "", err
	}
	return p.ID, nil
}

// pythonCommand is the interpreter a python run execs.
func pythonCommand() string {
	_, argv := core.Program(Python)
	return argv[0]
}

// awaitReady reads the process's output from its start until the loader's marker; anything
// else first (an interpreter that failed to start, a loader that was not imported) is the
// error, with what the process printed.
func awaitReady(ctx context.Context, pa processAgent, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	st, err := pa.Attach(ctx, id, true)
	if err != nil {
		return fmt.Errorf("attaching: %w", err)
	}
	defer st.Close()
	var got bytes.Buffer
	for {
		ev, err := st.Next()
		if err != nil {
			return fmt.Errorf("waiting for the loader: %w (output %q)", err, trimTo(got.String(), 2000))
		}
		if ev.Result != nil {
			return fmt.Errorf("the interpreter exited (code %d %s) before its loader waited for code: %q", ev.Result.ExitCode, ev.Result.Signal, trimTo(got.String(), 2000))
		}
		if ev.Output.Stream == sandbox.Stderr && string(ev.Output.Data) == readyMarker && got.Len() == 0 {
			return nil
		}
		got.Write(ev.Output.Data)
		if got.Len() > 64<<10 {
			return fmt.Errorf("the interpreter printed instead of waiting for code: %q", trimTo(got.String(), 2000))
		}
	}
}

func trimTo(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// basePythonPath is PYTHONPATH in the code's environment (nil: unset), asked once per image
// and environment with python itself (isolated: it ignores that variable).
func (ps *prestarter) basePythonPath(ctx context.Context, ag sandbox.Agent, sess *sandbox.Session, workdir string) (*string, error) {
	keyB, _ := json.Marshal([]any{sess.Spec.Image, sess.Spec.Env})
	key := string(keyB)
	ps.mu.Lock()
	v, ok := ps.pythonPath[key]
	ps.mu.Unlock()
	if ok {
		return v, nil
	}
	var out, errb bytes.Buffer
	res, err := ag.Exec(ctx, sandbox.ExecRequest{
		Argv:    []string{pythonCommand(), "-I", "-S", "-c", "import os,sys;sys.stdout.write(repr(os.environ.get('PYTHONPATH')))"},
		Cwd:     workdir,
		Timeout: 20 * time.Second,
	}, &out, &errb)
	if err != nil {
		return nil, fmt.Errorf("reading PYTHONPATH: %w", err)
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("reading PYTHONPATH: python exited %d %s: %q", res.ExitCode, res.Signal, trimTo(errb.String(), 2000))
	}
	s := out.String()
	if s != "None" {
		u, err := strconv.Unquote(pyReprToGo(s))
		if err != nil {
			return nil, fmt.Errorf("reading PYTHONPATH: cannot parse %q: %v", s, err)
		}
		v = &u
	}
	ps.mu.Lock()
	if ps.pythonPath == nil {
		ps.pythonPath = map[string]*string{}
	}
	ps.pythonPath[key] = v
	ps.mu.Unlock()
	return v, nil
}

// pyReprToGo turns python's repr of a str into a Go quoted string: repr uses single quotes
// unless the text holds one (then double), and escapes Go's strconv.Unquote reads alike
// (\x, \u, \U, \n, \t, \\), except an escaped single quote in a single-quoted repr.
func pyReprToGo(r string) string {
	if len(r) >= 2 && r[0] == '\'' && r[len(r)-1] == '\'' {
		body := r[1 : len(r)-1]
		body = strings.ReplaceAll(body, `\'`, `'`)
		body = strings.ReplaceAll(body, `"`, `\"`)
		return `"` + body + `"`
	}
	return r
}

// pyStr renders s as a python string literal.
func pyStr(s string) string {
	b, _ := json.Marshal(s) // JSON string escapes are valid python escapes
	return string(b)
}

// pythonLoader is usercustomize.py for one sandbox: dir is its own directory, file the
// program's name (relative to the working directory), base the PYTHONPATH to restore; holder
// turns on the exit holder (pythonExitHolder), for an interpreter whose agent reports its exit
// first and kills what it leaves (client.ProcessRequest.ExitFirst).
func pythonLoader(dir, file string, base *string, holder bool) string {
	restore := "os.environ.pop('PYTHONPATH', None)"
	if base != nil {
		restore = "os.environ['PYTHONPATH'] = " + pyStr(*base)
	}
	hold := "False"
	if holder {
		hold = "True"
	}
	return `# airlock run_code loader: waits for the program, then lets python run it as usual.
def _airlock_load():
    import os, sys
    had = set(sys.modules)
    d = ` + pyStr(dir) + `
    pc = os.path.join(d, '__pycache__')
    try:
        names = os.listdir(pc)
    except OSError:
        names = None
    if names is not None:
        for n in names:
            os.unlink(os.path.join(pc, n))
        os.rmdir(pc)
    os.unlink(os.path.join(d, 'usercustomize.py'))
    os.rmdir(d)
    while d in sys.path:
        sys.path.remove(d)
    sys.path_importer_cache.pop(d, None)
    ` + restore + `
    adopt = _airlock_fast_gc_at_exit(sys, had, ` + hold + `)
    os.write(2, ` + pyBytes(readyMarker) + `)
    hdr = b''
    while not hdr.endswith(b'\n'):
        c = os.read(0, 1)
        if not c:
            os._exit(0)
        hdr += c
        if len(hdr) > 40:
            os.write(2, b'airlock loader: bad header\n')
            os._exit(2)
    n, has_stdin = hdr.split()
    n = int(n)
    parts = []
    while n > 0:
        c = os.read(0, min(n, 1 << 20))
        if not c:
            os._exit(0)
        parts.append(c)
        n -= len(c)
    fd = os.open(` + pyStr(file) + `, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)
        for p in parts:
            while p:
                p = p[os.write(fd, p):]
    finally:
        os.close(fd)
    if has_stdin == b'0':
        import io
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        old = sys.stdin
        if old is not None:
            # As the interpreter builds sys.stdin (pylifecycle.c create_stdio): the stream
            # caches facts of the descriptor (seekable) it was built on.
            buf = io.open(0, 'rb', -1, None, None, None, False)
            buf.raw.name = '<stdin>'
            line = buf.raw.isatty() and not old.write_through
            new = io.TextIOWrapper(buf, old.encoding, old.errors, '\n', line, old.write_through)
            new.mode = 'r'
            if sys.__stdin__ is old:
                sys.__stdin__ = new
            sys.stdin = new
            if adopt is not None:
                adopt(new, buf, buf.raw)
` + pythonExitHook + pythonExitHolder + `
_airlock_load()
del _airlock_load, _airlock_fast_gc_at_exit, _airlock_exit_holder
# Leave no module behind: a cold interpreter finds no usercustomize (site ignores this error).
raise ImportError('airlock loader done', name='usercustomize')
`
}

// pythonExitHook is the part of the python loader that makes the interpreter's exit cheaper
// without changing what the program sees (docs/pool.md#pre-started-interpreters).
//
// Most of python's finalisation (~90% measured with perf, ~1.5-2 ms here) is full garbage
// collections over every object of the interpreter's start-up, which a run's program almost
// never makes garbage. The hook is the first atexit callback registered, so it runs last, after
// the program's own callbacks and after the interpreter has joined the program's non-daemon
// threads; then, only when the rest of finalisation can run no code of the program nor finalise
// anything the program made, it calls gc.freeze(): the collections that follow skip every object
// alive at that point. Finalisation is otherwise the interpreter's own (streams flushed, exit
// status computed, 120 when a flush fails, SIGINT for an unhandled KeyboardInterrupt, modules
// torn down), so the exit status never has to be guessed here.
//
// "No code of the program can run" means, at the hook: no gc.callbacks, gc.garbage or debug
// flags; no thread alive but the main one; no live object whose type has a finalizer (__del__,
// a generator, an io object, ...) other than those alive when the loader snapshot the
// interpreter (the standard streams); no weak proxy; every weak reference's callback one of the
// standard library's bookkeeping ones (WeakSet, WeakKeyDictionary, WeakValueDictionary, the abc
// caches, the import system's module locks, logging's handler list, weakref.finalize after its own atexit hook ran). Otherwise the hook does nothing.
// The check is a few C-speed passes over objects, and a pass over every object costs about
// what a collection does; so the loader snapshots start-up (and checks its weak references)
// before the code arrives and moves start-up's objects to the oldest generation (gc.freeze,
// gc.unfreeze: no collection), and the hook looks at generations 0 and 1 only, where all the
// program made still is unless a collection of generation 1 or 2 ran or the program imported
// gc (then it looks at every object). What the program can see of it: start-up's objects in
// generation 2 and gc.get_count() starting from 0 (so its first automatic collection comes a
// little later than cold); one atexit callback
// (atexit._ncallbacks()), the hook and its snapshot (weak references) among gc.get_objects().
const pythonExitHook = `
def _airlock_fast_gc_at_exit(sys, had, holder):
    import gc, atexit, _thread, _weakref, itertools
    for m in ('gc', 'atexit', '_thread', 'itertools'):
        if m not in had:
            sys.modules.pop(m, None)
    hold = holder and _airlock_exit_holder(sys)
    getframe = sys._getframe
    modules = sys.modules
    compress = itertools.compress
    tdict = type.__dict__['__dict__'].__get__
    tmro = type.__dict__['__mro__'].__get__
    wref = _weakref.ref
    reftype = _weakref.ReferenceType
    proxy, cproxy = _weakref.ProxyType, _weakref.CallableProxyType
    callback = reftype.__dict__['__callback__'].__get__
    none_id, builtin_id, function_id = id(type(None)), id(type(len)), id(type(lambda: None))

    def finalizable(t):
        for c in tmro(t):
            if '__del__' in tdict(c):
                return True
        return False

    def weakref_type(t):
        for c in tmro(t):
            if c is reftype:
                return True
        return False

    def bookkeeping(wrefs):
        # Every callback of wrefs is one of the standard library's bookkeeping ones; C-speed
        # passes, and no attribute of a callback is read before its type is known.
        cbs = list(map(callback, wrefs))
        cbt = list(map(id, map(type, cbs)))
        w = modules.get('weakref')
        fin = w and getattr(w, 'finalize', None)
        ok = {none_id, builtin_id, function_id}
        if fin is not None and fin._shutdown is True:
            ok.add(id(fin))
        if not ok.issuperset(cbt):
            return False
        bs = list(compress(cbs, map(builtin_id.__eq__, cbt)))
        if bs:
            if set(map(getattr, bs, ['__name__'] * len(bs))) != {'_destroy'}:
                return False
            if set(map(id, map(type, map(getattr, bs, ['__self__'] * len(bs))))) != {id(reftype)}:
                return False
        fs = list(compress(cbs, map(function_id.__eq__, cbt)))
        if fs:
            allowed = set()
            for mod, cls in (('_weakrefset', 'WeakSet'), ('weakref', 'WeakValueDictionary'), ('weakref', 'WeakKeyDictionary')):
                m = modules.get(mod)
                c = m and getattr(m, cls, None)
                if c is not None:
                    allowed.update(c.__init__.__code__.co_consts)
            for mod, name in (('_frozen_importlib', '_get_module_lock'), ('logging', '_removeHandlerRef')):
                m = modules.get(mod)
                f = m and getattr(m, name, None)
                if id(type(f)) == function_id:
                    allowed.add(f.__code__)
                    allowed.update(f.__code__.co_consts)
            if not allowed.issuperset(map(getattr, fs, ['__code__'] * len(fs))):
                return False
        return True

    def scan(objs, start):
        # Whether objs hold nothing the rest of finalisation could run or finalise of the
        # program's. C-speed passes over ids only (hashing a type could call a metaclass of the
        # program's; list.index over ints would be quadratic).
        ids = list(map(id, map(type, objs)))
        fkinds, wkinds = set(), set()
        for k, o in dict(zip(ids, objs)).items():
            t = type(o)
            if weakref_type(t):
                wkinds.add(k)
            elif t is proxy or t is cproxy:
                return False
            elif finalizable(t):
                if k not in start:
                    return False
                fkinds.add(k)
        if fkinds:
            alive = set()
            for k in fkinds:
                for r in start[k]:
                    o = r()
                    if o is not None:
                        alive.add(id(o))
            if not alive.issuperset(map(id, compress(objs, map(fkinds.__contains__, ids)))):
                return False
        return not wkinds or bookkeeping(list(compress(objs, map(wkinds.__contains__, ids))))

    # The interpreter's start-up as the program will find it: its objects with finalizers (the
    # standard streams), by id(type), the types kept alive (keep). Taken before the loader
    # announces itself, off a run's path. Start-up weak references
    # are checked here, once; then the hook need only look at what the program made.
    objs = gc.get_objects()
    start = {}
    for o in objs:
        t = type(o)
        if finalizable(t):
            e = start.setdefault(id(t), [t])
            if e[0] is not None:
                try:
                    e.append(wref(o))
                except TypeError:
                    e[0] = None
    keep = [v[0] for v in start.values() if v[0] is not None]
    start = {k: v[1:] for k, v in start.items() if v[0] is not None}
    if not bookkeeping([o for o in objs if weakref_type(type(o))]):
        return None
    del objs, o
    # Start-up into the oldest generation without a collection (freeze, then unfreeze): the
    # hook then finds what the program made in generations 0 and 1, as long as no collection
    # of generation 1 or 2 (nor the program's gc module) moved it on.
    gc.freeze()
    gc.unfreeze()
    collections = [g['collections'] for g in gc.get_stats()[1:]]

    def hook():
        try:
            getframe(1)
        except ValueError:
            pass
        else:
            return  # the program ran the callbacks itself: not the interpreter's exit
        if gc.garbage or gc.callbacks or gc.get_debug() or _thread._count():
            return
        if 'gc' not in modules and [g['collections'] for g in gc.get_stats()[1:]] == collections:
            objs = gc.get_objects(0) + gc.get_objects(1)
        else:
            objs = gc.get_objects()
        if scan(objs, start):
            del objs
            gc.freeze()
            if hold:
                try:
                    hold()
                except Exception:
                    pass

    atexit.register(hook)

    def adopt(*objs):
        # Start-up objects made after the snapshot (the loader's sys.stdin).
        for o in objs:
            t = type(o)
            if finalizable(t):
                try:
                    r = wref(o)
                except TypeError:
                    continue  # not followable: the hook will not take it for start-up's
                start.setdefault(id(t), []).append(r)
                keep.append(t)

    return adopt
`

// pythonExitHolder is the part of the python loader that takes the kernel's teardown of the
// interpreter's memory off the run's path (docs/benchmarks.md, pre-started interpreters).
//
// When a process exits, the kernel frees its memory (exit_mm) before it closes its files and
// becomes a zombie: for python, ~0.8-1.1 ms measured here between exit_group and the end of
// its output, all of it spent before the agent can see the exit. If another process still
// shares the memory (CLONE_VM), the exiting one only drops its reference, and its files close
// and its exit is seen at once. So the exit hook, when it has found that nothing of the
// program's can run any more (the same test as for gc.freeze) and the process holds no file
// but 0, 1 and 2, clones a holder: CLONE_VM, no exit signal to python (wait() never sees it),
// every blockable signal blocked, running libc's syscall(SYS_pause), i.e. asleep until
// SIGKILL, touching nothing of python's memory. It must not hold the program's files (the
// output's end would wait for it): 0, 1 and 2 travel through a unix socket (SCM_RIGHTS) while
// it is cloned, and come back to the same numbers with the same inheritable flags. Then
// finalisation goes on as the interpreter's own, exit status included; the agent (ExitFirst)
// sees the exit as soon as python has exited and its output has ended, and kills the holder
// (which holds none of the output) after its report; the sandbox is discarded after the run.
// The holder never exists while program code can run, so the program cannot see it (a process
// the program left running could, during python's last ~1.5 ms of finalisation). x86_64 only (the pause system call); elsewhere, without
// ctypes or libc's clone, or with any other file open, there is no holder and the exit is as
// before. What stays visible: _ctypes loaded (sys.modules is cleaned of what its import added).
const pythonExitHolder = `
def _airlock_exit_holder(sys):
    import os
    if os.uname().machine != 'x86_64':
        return None
    before, cached = set(sys.modules), set(sys.path_importer_cache)
    try:
        import ctypes, _socket, _signal
        libc = ctypes.CDLL(None)
        clone, malloc = libc.clone, libc.malloc
        fn = ctypes.cast(libc.syscall, ctypes.c_void_p)
    except (ImportError, OSError, AttributeError):
        return None
    finally:
        # No trace of the import for the program: its modules and its path finders go.
        for m in set(sys.modules) - before:
            sys.modules.pop(m, None)
        for p in set(sys.path_importer_cache) - cached:
            sys.path_importer_cache.pop(p, None)
    clone.restype = ctypes.c_int
    clone.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = (ctypes.c_size_t,)
    # The holder's stack, never freed (a ctypes buffer would leave a weak proxy in ctypes'
    # array type cache, which the exit hook takes for the program's).
    size = 1 << 14
    base = malloc(size)
    if not base:
        return None
    top = ctypes.c_void_p(base + size - 64)
    clone_vm, sys_pause = 0x100, 34
    sigmask, block, setmask = _signal.pthread_sigmask, _signal.SIG_BLOCK, _signal.SIG_SETMASK
    every = _signal.valid_signals()
    listdir, fstat, close, dup2 = os.listdir, os.fstat, os.close, os.dup2
    get_inheritable, set_inheritable = os.get_inheritable, os.set_inheritable
    socketpair, sol_socket, scm_rights = _socket.socketpair, _socket.SOL_SOCKET, _socket.SCM_RIGHTS
    std = (0, 1, 2)
    order = sys.byteorder
    payload = b''.join(fd.to_bytes(4, order) for fd in std)
    ancsize = _socket.CMSG_SPACE(len(payload))

    def hold():
        fds = []
        for n in listdir('/proc/self/fd'):
            try:
                fstat(int(n))
            except OSError:
                continue  # the listing's own descriptor, closed by now
            fds.append(int(n))
        if sorted(fds) != [0, 1, 2]:
            return
        inheritable = [get_inheritable(fd) for fd in std]
        a, b = socketpair()
        try:
            a.sendmsg([b'x'], [(sol_socket, scm_rights, payload)])
            for fd in std:
                close(fd)
            try:
                old = sigmask(block, every)
                try:
                    clone(fn, top, clone_vm, sys_pause)
                finally:
                    sigmask(setmask, old)
            finally:
                _, anc, _, _ = b.recvmsg(1, ancsize)
                got = [int.from_bytes(d[i:i + 4], order) for _, _, d in anc for i in range(0, len(d) - 3, 4)]
                for want, have in zip(std, got):
                    if have != want:
                        dup2(have, want)
                        close(have)
                for fd, i in zip(std, inheritable):
                    set_inheritable(fd, i)
        finally:
            a.close()
            b.close()

    return hold
`

// pyBytes renders s as a python bytes literal.
func pyBytes(s string) string {
	var b strings.Builder
	b.WriteString("b'")
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "\\x%02x", s[i])
	}
	b.WriteString("'")
	return b.String()
}

// nodeLoader is the --require preload for one sandbox: dir is its own directory.
func nodeLoader(dir string) string {
	return `// airlock run_code loader: waits for the program, then lets node run it as usual.
'use strict';
(() => {
  const fs = require('fs');
  const dir = ` + pyStr(dir) + `;
  fs.rmSync(dir, { recursive: true, force: true });
  const i = process.execArgv.indexOf(__filename);
  if (i > 0 && (process.execArgv[i - 1] === '--require' || process.execArgv[i - 1] === '-r')) process.execArgv.splice(i - 1, 2);
  delete require.cache[__filename];
  fs.writeSync(2, ` + pyStr(readyMarker) + `);
  const nap = new Int32Array(new SharedArrayBuffer(4));
  const read = (buf, off, len) => {
    for (;;) {
      try {
        return fs.readSync(0, buf, off, len, null);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
        Atomics.wait(nap, 0, 0, 1);
      }
    }
  };
  let hdr = '';
  const one = Buffer.alloc(1);
  while (!hdr.endsWith('\n')) {
    if (read(one, 0, 1) === 0) process.reallyExit(0);
    hdr += one.toString('latin1');
    if (hdr.length > 40) {
      fs.writeSync(2, 'airlock loader: bad header\n');
      process.reallyExit(2);
    }
  }
  const n = parseInt(hdr, 10);
  const code = Buffer.alloc(n);
  for (let off = 0; off < n;) {
    const got = read(code, off, n - off);
    if (got === 0) process.reallyExit(0);
    off += got;
  }
  const fd = fs.openSync(process.argv[1], 'w', 0o644);
  try {
    fs.fchmodSync(fd, 0o644);
    for (let off = 0; off < n;) off += fs.writeSync(fd, code, off, n - off);
  } finally {
    fs.closeSync(fd);
  }
})();
`
}
