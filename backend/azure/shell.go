package azure

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	agentwire "github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// rawList decodes a list answer in either shape.
type rawList struct{ listJSON }

func (r *rawList) UnmarshalJSON(b []byte) error {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '[' {
		return json.Unmarshal(t, &r.Value)
	}
	return json.Unmarshal(b, &r.listJSON)
}

// Limits of the shell agent.
const (
	// maxTimeout is the longest deadline a command may have, as the agent's own ceiling.
	maxTimeout = 24 * time.Hour
	// maxFileBytes bounds one file transfer, as the agent protocol does.
	maxFileBytes = 32 << 20
	// execGrace is how long past a command's deadline the call may take before the client
	// gives up on it: the killer inside runs at the deadline, the answer follows.
	execGrace = 60 * time.Second
)

// shellAgent is a sandbox's agent on the data plane: commands through executeShellCommand,
// wrapped so a deadline kills the command's process group and the status comes back in a
// trailer only this call knows; files through the data plane's file operations and coreutils.
type shellAgent struct {
	b                 *Backend
	id, sandbox, wdir string
}

var _ sandbox.Agent = (*shellAgent)(nil)

func (b *Backend) agent(id, sandboxID, workdir string) *shellAgent {
	return &shellAgent{b: b, id: id, sandbox: sandboxID, wdir: workdir}
}

func (a *shellAgent) Close() error { return nil }

// Health answers when the sandbox runs.
func (a *shellAgent) Health(ctx context.Context) (sandbox.Health, error) {
	sb, err := a.b.get(ctx, a.id)
	if err != nil {
		return sandbox.Health{}, fmt.Errorf("session %s: %w", a.id, err)
	}
	if st := sb.state(); st != stateRunning {
		return sandbox.Health{}, fmt.Errorf("%w: session %s is %s", sandbox.ErrUnreachable, a.id, st)
	}
	return sandbox.Health{Version: "azure-data-plane", SandboxID: a.sandbox, KillScope: "process-group",
		Features: map[string]bool{"exec": true, "files": true}}, nil
}

// post runs one executeShellCommand. It is retried only when throttled (the service refused
// before running it): a command never runs twice.
func (a *shellAgent) post(ctx context.Context, command, cwd string) (*execResult, error) {
	var res execResult
	err := a.b.data.call(policy.WithRetryOptions(ctx, noReplay), http.MethodPost, "/sandboxes/"+a.id+"/executeShellCommand", nil,
		execBody{Command: command, WorkingDirectory: cwd}, &res)
	if err != nil {
		if s := statusOf(err); s == 0 && !errors.Is(err, sandbox.ErrDeadlineExceeded) || s >= 500 {
			return nil, fmt.Errorf("%w: exec in %s: %w", sandbox.ErrOutcomeUnknown, a.id, err)
		}
		return nil, fmt.Errorf("exec in %s: %w", a.id, err)
	}
	return &res, nil
}

// quote is s as one single-quoted shell word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Exec runs a command to completion. The data plane has no timeout field and no stream: the
// command runs under a wrapper that starts it in a process group of its own (setsid) with
// stdin closed, kills that group at the deadline and when the command ends, and prints a
// trailer with a fresh nonce, the exit status and whether the deadline fired. Output arrives
// whole when the command ends.
func (a *shellAgent) Exec(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec: exactly one of argv and shell must be set", sandbox.ErrInvalid)
	}
	if req.Stdin != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec stdin: executeShellCommand takes no input stream (capability %s)", sandbox.ErrUnsupported, capability.Stdin)
	}
	if req.TTY {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec tty: executeShellCommand has no terminal (capability %s)", sandbox.ErrUnsupported, capability.PTY)
	}
	if req.Timeout <= 0 || req.Timeout > maxTimeout {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec timeout %v: a deadline is required, at most %v", sandbox.ErrInvalid, req.Timeout, maxTimeout)
	}
	if req.MaxStdout < 0 || req.MaxStderr < 0 {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec maxStdout/maxStderr %d/%d: must not be negative", sandbox.ErrInvalid, req.MaxStdout, req.MaxStderr)
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = a.wdir
	}
	if !path.IsAbs(cwd) {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec cwd %q: must be an absolute path", sandbox.ErrInvalid, cwd)
	}
	names := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		if !sbtypes.IsEnvName(k) {
			return sandbox.ExecResult{}, fmt.Errorf("%w: exec env: name %q must match ^[A-Za-z_][A-Za-z0-9_]*$", sandbox.ErrInvalid, k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return sandbox.ExecResult{}, fmt.Errorf("%w: exec env: value of %q contains a NUL byte", sandbox.ErrInvalid, k)
		}
		names = append(names, k)
	}
	sort.Strings(names)
	cmd := req.Shell
	if cmd == "" {
		words := make([]string, len(req.Argv))
		for i, w := range req.Argv {
			words[i] = quote(w)
		}
		cmd = "exec " + strings.Join(words, " ")
	}
	var exports strings.Builder
	for _, k := range names {
		fmt.Fprintf(&exports, "export %s=%s\n", k, quote(req.Env[k]))
	}
	nonce, err := newNonce()
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	script := wrap(nonce, exports.String()+cmd, req.Timeout)
	cctx, cancel := context.WithTimeout(ctx, req.Timeout+execGrace)
	defer cancel()
	start := time.Now()
	res, err := a.post(cctx, script, cwd)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	out := sandbox.ExecResult{Duration: time.Since(start)}
	errText, status, timedOut, ok := trailer(res.Stderr, nonce)
	if !ok {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec in %s: the command's status did not come back (the wrapper was cut short; exitCode %v)", sandbox.ErrOutcomeUnknown, a.id, res.ExitCode)
	}
	switch status {
	case statusNoSetsid:
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec in %s: the image has no setsid that forks (util-linux setsid -f), so a command's deadline cannot be held", sandbox.ErrUnsupported, a.id)
	}
	out.ExitCode, out.TimedOut = status, timedOut
	capOut := func(w io.Writer, s string, max int64) {
		if max == 0 {
			max = agentwire.DefaultOutputCap // every agent's default
		}
		if int64(len(s)) > max {
			s, out.Truncated = s[:max], true
		}
		if w != nil && s != "" {
			_, _ = io.WriteString(w, s)
		}
	}
	capOut(stdout, res.Stdout, req.MaxStdout)
	capOut(stderr, errText, req.MaxStderr)
	return out, nil
}

func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "airlock-" + hex.EncodeToString(b[:]), nil
}

// statusNoSetsid is the trailer's status when the image lacks a setsid with -f (util-linux).
const statusNoSetsid = -2

// wrap is the script executeShellCommand runs. The command runs as "sh -c" in its own session
// and process group; a killer in a session of its own marks and kills that group at the
// deadline; after the command the killer's and the command's groups are killed (nothing the
// command left in its group outlives the exec); the last stderr line is the trailer.
func wrap(nonce, cmd string, timeout time.Duration) string {
	secs := strconv.FormatFloat(timeout.Seconds(), 'f', 3, 64)
	mark := "/tmp/." + nonce
	return strings.Join([]string{
		"setsid -f true </dev/null >/dev/null 2>&1 || { printf '\\n%s %d 0\\n' " + nonce + " " + strconv.Itoa(statusNoSetsid) + " >&2; exit 0; }",
		"setsid /bin/sh -c " + quote(cmd) + " </dev/null &",
		"P=$!",
		// The killer is no job of this shell (setsid -f forks it away; it says its pid, the
		// session's, then lets go of the pipe): bash reports a job that died of a signal
		// ("line 8: 123 Killed ...") on the command's stderr, and a job's pid is not its group.
		"K=$(setsid -f /bin/sh -c \"echo \\$\\$; exec </dev/null >/dev/null 2>&1; sleep " + secs + "; : >" + mark + "; kill -KILL -$P\")",
		"{ wait $P; R=$?; } 2>/dev/null",
		"kill -KILL -$K 2>/dev/null; kill -KILL -$P 2>/dev/null",
		"T=0; if [ -e " + mark + " ]; then T=1; rm -f " + mark + "; fi",
		"printf '\\n%s %d %d\\n' " + nonce + " $R $T >&2",
	}, "\n")
}

// trailer splits the wrapper's last stderr line off: the command's own stderr, its status and
// whether the deadline fired. ok is false when the line is not there.
func trailer(stderr, nonce string) (rest string, status int, timedOut, ok bool) {
	i := strings.LastIndex(stderr, "\n"+nonce+" ")
	if i < 0 {
		return "", 0, false, false
	}
	f := strings.Fields(stderr[i+1:])
	if len(f) != 3 {
		return "", 0, false, false
	}
	st, err1 := strconv.Atoi(f[1])
	t, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return "", 0, false, false
	}
	return stderr[:i], st, t == 1, true
}

// run runs a short command of the backend's own (no deadline wrapper: the HTTP call's context
// bounds it) and fails unless it exits 0.
func (a *shellAgent) run(ctx context.Context, command, cwd string) error {
	_, err := a.output(ctx, command, cwd)
	return err
}

// fileError is what the file scripts print when a path is absent or not what was asked.
const (
	markMissing  = "AIRLOCK_ENOENT"
	markIsDir    = "AIRLOCK_EISDIR"
	markNotDir   = "AIRLOCK_ENOTDIR"
	markExists   = "AIRLOCK_EEXIST"
	markNotEmpty = "AIRLOCK_ENOTEMPTY"
)

// output runs a short command and returns its stdout; a nonzero exit is an error carrying
// its stderr, classified by the marks the file scripts print.
func (a *shellAgent) output(ctx context.Context, command, cwd string) (string, error) {
	script := "(\n" + command + "\n)\nprintf '\\n%s\\n' $? >&2"
	res, err := a.post(ctx, script, cwd)
	if err != nil {
		return "", err
	}
	i := strings.LastIndex(strings.TrimSuffix(res.Stderr, "\n"), "\n")
	if i < 0 {
		return "", fmt.Errorf("%w: in %s: the command's status did not come back", sandbox.ErrOutcomeUnknown, a.id)
	}
	status, perr := strconv.Atoi(strings.TrimSpace(res.Stderr[i+1:]))
	msg := strings.TrimSpace(res.Stderr[:i])
	if perr != nil {
		return "", fmt.Errorf("%w: in %s: the command's status did not come back", sandbox.ErrOutcomeUnknown, a.id)
	}
	if status == 0 {
		return res.Stdout, nil
	}
	switch {
	case strings.Contains(res.Stdout, markMissing):
		return "", fmt.Errorf("%w: %s", sandbox.ErrNotFound, firstLine(msg, "no such file or directory"))
	case strings.Contains(res.Stdout, markIsDir), strings.Contains(res.Stdout, markNotDir), strings.Contains(res.Stdout, markNotEmpty):
		return "", fmt.Errorf("%w: %s", sandbox.ErrInvalid, firstLine(msg, strings.TrimSpace(res.Stdout)))
	case strings.Contains(res.Stdout, markExists):
		return "", fmt.Errorf("%w: %s", sandbox.ErrConflict, firstLine(msg, "file exists"))
	}
	return "", fmt.Errorf("%w: in %s: exit %d: %s", sandbox.ErrInvalid, a.id, status, firstLine(msg, "failed"))
}

func firstLine(s, def string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if s == "" {
		return def
	}
	return s
}

// checkPath refuses what no file operation takes: a relative or unclean path, a NUL.
func checkPath(field, p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("%w: %s %q: must be an absolute, clean path", sandbox.ErrInvalid, field, p)
	}
	return nil
}

// exists is a script prefix that prints markMissing and fails when p does not exist.
func exists(p string) string {
	return "{ [ -e " + quote(p) + " ] || [ -L " + quote(p) + " ]; } || { echo " + markMissing + "; echo " + quote(p+": no such file or directory") + " >&2; exit 2; }\n"
}

// ReadFile reads a file through the data plane's file operation; offset and length select a
// part of it (length <= 0: to the end), as agent/client's does.
func (a *shellAgent) ReadFile(ctx context.Context, p string, offset, length int64) (io.ReadCloser, error) {
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("%w: offset %d: must not be negative", sandbox.ErrInvalid, offset)
	}
	fi, err := a.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	if fi.Type == "dir" {
		return nil, fmt.Errorf("%w: read %s: is a directory", sandbox.ErrInvalid, p)
	}
	if fi.Size > maxFileBytes {
		return nil, fmt.Errorf("%w: read %s: %d bytes, at most %d move in one transfer", sandbox.ErrTooLarge, p, fi.Size, maxFileBytes)
	}
	b, err := a.b.data.raw(ctx, http.MethodGet, "/sandboxes/"+a.id+"/files", url.Values{"path": {p}}, nil, maxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", p, a.id, err)
	}
	if offset > int64(len(b)) {
		return nil, fmt.Errorf("%w: offset %d is past the end of %s (%d bytes)", sandbox.ErrInvalid, offset, p, len(b))
	}
	b = b[offset:]
	if length > 0 && length < int64(len(b)) {
		b = b[:length]
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// WriteFile writes a file through the data plane's file operation, then sets its mode (0:
// 0644, as agent/client's does).
func (a *shellAgent) WriteFile(ctx context.Context, p string, r io.Reader, mode uint32) error {
	if err := checkPath("path", p); err != nil {
		return err
	}
	if mode > 0o7777 {
		return fmt.Errorf("%w: mode %o: permission bits only", sandbox.ErrInvalid, mode)
	}
	if mode == 0 {
		mode = 0o644
	}
	b, err := io.ReadAll(io.LimitReader(r, maxFileBytes+1))
	if err != nil {
		return err
	}
	if len(b) > maxFileBytes {
		return fmt.Errorf("%w: write %s: at most %d bytes move in one transfer", sandbox.ErrTooLarge, p, maxFileBytes)
	}
	if _, err := a.output(ctx, exists(path.Dir(p))+"[ -d "+quote(path.Dir(p))+" ] || { echo "+markNotDir+"; exit 2; }\n[ ! -d "+quote(p)+" ] || { echo "+markIsDir+"; exit 2; }", "/"); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if _, err := a.b.data.raw(ctx, http.MethodPut, "/sandboxes/"+a.id+"/files", url.Values{"path": {p}}, b, 1<<20); err != nil {
		return fmt.Errorf("write %s in %s: %w", p, a.id, err)
	}
	return a.run(ctx, fmt.Sprintf("chmod %o -- %s", mode, quote(p)), "/")
}

// Mkdir makes a directory and its parents.
func (a *shellAgent) Mkdir(ctx context.Context, p string, mode uint32) error {
	if err := checkPath("path", p); err != nil {
		return err
	}
	if mode > 0o7777 {
		return fmt.Errorf("%w: mode %o: permission bits only", sandbox.ErrInvalid, mode)
	}
	if _, err := a.output(ctx, fmt.Sprintf("[ ! -e %[1]s ] || [ -d %[1]s ] || { echo %[2]s; exit 2; }\nmkdir -p -m %[3]o -- %[1]s", quote(p), markExists, mode), "/"); err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

// statScript prints one record per path: name, size, octal mode, type, mtime, NUL-separated.
const statFormat = `%n\0%s\0%a\0%F\0%Y\0`

func parseStat(out string) ([]sandbox.FileInfo, error) {
	f := strings.Split(out, "\x00")
	var infos []sandbox.FileInfo
	for len(f) >= 5 {
		size, err1 := strconv.ParseInt(f[1], 10, 64)
		mode, err2 := strconv.ParseUint(f[2], 8, 32)
		mt, err3 := strconv.ParseInt(f[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("%w: unreadable stat record %q", sandbox.ErrUnreachable, strings.Join(f[:5], "|"))
		}
		typ := "other"
		switch f[3] {
		case "regular file", "regular empty file":
			typ = "file"
		case "directory":
			typ = "dir"
		case "symbolic link":
			typ = "symlink"
		}
		infos = append(infos, sandbox.FileInfo{Name: path.Base(f[0]), Path: f[0], Size: size, Mode: uint32(mode), Type: typ, ModTime: time.Unix(mt, 0).UTC()})
		f = f[5:]
	}
	return infos, nil
}

// Stat describes one path (a symlink itself, not its target).
func (a *shellAgent) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	if err := checkPath("path", p); err != nil {
		return sandbox.FileInfo{}, err
	}
	out, err := a.output(ctx, exists(p)+"stat --printf '"+statFormat+"' -- "+quote(p), "/")
	if err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("stat %s: %w", p, err)
	}
	infos, err := parseStat(out)
	if err != nil || len(infos) != 1 {
		return sandbox.FileInfo{}, fmt.Errorf("%w: stat %s: unreadable answer", sandbox.ErrUnreachable, p)
	}
	return infos[0], nil
}

// List describes a directory's entries.
func (a *shellAgent) List(ctx context.Context, p string) ([]sandbox.FileInfo, error) {
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	script := exists(p) + "[ -d " + quote(p) + " ] || { echo " + markNotDir + "; echo 'not a directory' >&2; exit 2; }\n" +
		"find " + quote(p) + " -mindepth 1 -maxdepth 1 -exec stat --printf '" + statFormat + "' -- {} +"
	out, err := a.output(ctx, script, "/")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	infos, err := parseStat(out)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	return infos, nil
}

// Remove removes a file, or a directory (with what it holds when recursive).
func (a *shellAgent) Remove(ctx context.Context, p string, recursive bool) error {
	if err := checkPath("path", p); err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: remove /", sandbox.ErrInvalid)
	}
	script := exists(p)
	if recursive {
		script += "rm -rf -- " + quote(p)
	} else {
		script += "if [ -d " + quote(p) + " ] && [ ! -L " + quote(p) + " ]; then rmdir -- " + quote(p) + " || { echo " + markNotEmpty + "; exit 2; }; else rm -f -- " + quote(p) + "; fi"
	}
	if _, err := a.output(ctx, script, "/"); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Rename moves a path to another.
func (a *shellAgent) Rename(ctx context.Context, from, to string) error {
	if err := checkPath("from", from); err != nil {
		return err
	}
	if err := checkPath("to", to); err != nil {
		return err
	}
	if _, err := a.output(ctx, exists(from)+"mv -T -- "+quote(from)+" "+quote(to), "/"); err != nil {
		return fmt.Errorf("rename %s: %w", from, err)
	}
	return nil
}
