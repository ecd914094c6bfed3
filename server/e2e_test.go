package server_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, c *client.Client, id string, labels map[string]string) *client.Sandbox {
	t.Helper()
	sb, err := c.Create(ctxT(t), hostDecl(id, labels))
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return sb
}

func execShell(t *testing.T, sb *client.Sandbox, shell string) (string, string, sandbox.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := sb.Exec(ctxT(t), sandbox.ExecRequest{Shell: shell, Timeout: 30 * time.Second}, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	return out.String(), errb.String(), res
}

func TestLifecycleOverSDK(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "life", map[string]string{"team": "a"})
	if sb.ID == "" || sb.SandboxID != "life" || sb.State != sandbox.StateRunning || sb.Labels["team"] != "a" {
		t.Fatalf("created session: %+v", sb.Session)
	}
	got, err := h.c.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Spec.ID != "life" {
		t.Fatalf("get: %+v, %v", got, err)
	}

	out, errs, res := execShell(t, sb, "echo out; echo err >&2; exit 3")
	if out != "out\n" || errs != "err\n" || res.ExitCode != 3 {
		t.Fatalf("exec: out %q err %q res %+v", out, errs, res)
	}
	// Stdin through the request body.
	var o bytes.Buffer
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"tr", "a-z", "A-Z"}, Stdin: strings.NewReader("hello stdin\n"), Timeout: 30 * time.Second}, &o, nil)
	if err != nil || res.ExitCode != 0 || o.String() != "HELLO STDIN\n" {
		t.Fatalf("exec with stdin: %q %+v %v", o.String(), res, err)
	}
	// Empty stdin is a closed stdin, not /dev/null semantics lost: cat ends at once.
	o.Reset()
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader(""), Timeout: 30 * time.Second}, &o, nil)
	if err != nil || res.ExitCode != 0 || o.Len() != 0 {
		t.Fatalf("exec with empty stdin: %q %+v %v", o.String(), res, err)
	}
	// A terminal of the asked size.
	o.Reset()
	res, err = sb.ExecWith(ctx, sandbox.ExecRequest{Argv: []string{"stty", "size"}, TTY: true, Timeout: 30 * time.Second}, client.ExecOptions{Rows: 40, Cols: 120}, &o, nil)
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(o.String()) != "40 120" {
		t.Fatalf("tty exec: %q %+v %v", o.String(), res, err)
	}
	// The deadline is the command's, reported in the result.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: "sleep 30", Timeout: 300 * time.Millisecond}, nil, nil)
	if err != nil || !res.TimedOut {
		t.Fatalf("exec past its deadline: %+v %v", res, err)
	}

	// Files: up, stat, list, down, a range, mkdir, remove.
	payload := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: streamed, several frames
	if err := sb.Mkdir(ctx, "/workspace/d/e", 0); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/workspace/d/e/f.bin", bytes.NewReader(payload), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := sb.Stat(ctx, "/workspace/d/e/f.bin")
	if err != nil || fi.Size != int64(len(payload)) || fi.Mode != 0o600 || fi.Type != "file" {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	list, err := sb.ListFiles(ctx, "/workspace/d/e")
	if err != nil || len(list) != 1 || list[0].Name != "f.bin" {
		t.Fatalf("list: %+v %v", list, err)
	}
	rc, err := sb.ReadFile(ctx, "/workspace/d/e/f.bin")
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(back, payload) {
		t.Fatalf("read back %d bytes (want %d): %v", len(back), len(payload), err)
	}
	rc, err = sb.ReadFileRange(ctx, "/workspace/d/e/f.bin", 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	part, _ := io.ReadAll(rc)
	rc.Close()
	if string(part) != "0123" {
		t.Fatalf("range read %q", part)
	}
	if out, _, _ := execShell(t, sb, "cat /workspace/d/e/f.bin | wc -c"); strings.TrimSpace(out) != "1048576" {
		t.Fatalf("the command sees %q bytes", out)
	}
	if err := sb.Remove(ctx, "/workspace/d", false); !errors.Is(err, sandbox.ErrConflict) && !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("removing a non-empty dir without recursive: %v", err)
	}
	if err := sb.Remove(ctx, "/workspace/d", true); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Stat(ctx, "/workspace/d"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}

	if err := sb.Terminate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Get(ctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get after terminate: %v", err)
	}
	if err := sb.Terminate(ctx); err != nil {
		t.Fatalf("terminate is idempotent: %v", err)
	}
}

// notifyWriter signals once its output contains want.
type notifyWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestExecStreamsWhileRunning proves output reaches the SDK before the command ends: the
// command prints, then waits for stdin that the test sends only once it has seen the print.
// Without streaming (or without stdin flowing while output does) the command would sit until
// its deadline and end first.
func TestExecStreamsWhileRunning(t *testing.T) {
	h := newHarness(t, nil)
	sb := create(t, h.c, "stream", nil)
	pr, pw := io.Pipe()
	out := &notifyWriter{want: "first\n", seen: make(chan struct{})}
	type result struct {
		res sandbox.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := sb.Exec(ctxT(t), sandbox.ExecRequest{Shell: "echo first; read x; echo second $x", Stdin: pr, Timeout: 20 * time.Second}, out, nil)
		done <- result{res, err}
	}()
	select {
	case <-out.seen:
		if _, err := pw.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		pw.Close()
	case r := <-done:
		pw.Close()
		t.Fatalf("the exec ended (%+v, %v) before its first output reached the caller", r.res, r.err)
	}
	r := <-done
	if r.err != nil || r.res.ExitCode != 0 || r.res.TimedOut || out.buf.String() != "first\nsecond go\n" {
		t.Fatalf("exec: %q %+v %v", out.buf.String(), r.res, r.err)
	}
}

func TestLabelsAndTemplates(t *testing.T) {
	tmpl := hostDecl("py", map[string]string{"kind": "python", "team": "t0"})
	h := newHarness(t, map[string]spec.Sandbox{"python": tmpl})
	ctx := ctxT(t)
	a := create(t, h.c, "a", map[string]string{"team": "red", "tier": "1"})
	b := create(t, h.c, "b", map[string]string{"team": "blue", "tier": "1"})
	tp, err := h.c.CreateFromTemplate(ctx, "python", map[string]string{"team": "green"})
	if err != nil {
		t.Fatal(err)
	}
	if tp.SandboxID != "py" || tp.Labels["kind"] != "python" || tp.Labels["team"] != "green" {
		t.Fatalf("from template: %+v", tp.Session)
	}
	ids := func(sbs []*client.Sandbox) []string {
		var out []string
		for _, s := range sbs {
			out = append(out, s.ID)
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	for _, tc := range []struct {
		sel  map[string]string
		want []string
	}{
		{nil, sorted(a.ID, b.ID, tp.ID)},
		{map[string]string{"tier": "1"}, sorted(a.ID, b.ID)},
		{map[string]string{"tier": "1", "team": "blue"}, []string{b.ID}},
		{map[string]string{"kind": "python"}, []string{tp.ID}},
		{map[string]string{"team": "t0"}, nil}, // the template's label was overridden
		{map[string]string{"nope": "x"}, nil},
	} {
		got, err := h.c.List(ctx, tc.sel)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("list %v: %v, want %v", tc.sel, ids(got), tc.want)
		}
	}
	// The template's own labels are untouched by a create that adds labels.
	tp2, err := h.c.CreateFromTemplate(ctx, "python", nil)
	if err != nil {
		t.Fatal(err)
	}
	if tp2.Labels["team"] != "t0" {
		t.Fatalf("template labels changed by an earlier create: %v", tp2.Labels)
	}
	if _, err := h.c.CreateFromTemplate(ctx, "ruby", nil); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "python") {
		t.Fatalf("unknown template: %v", err)
	}
	resp := h.raw(t, "unix", "GET", "/v1/sandboxes?label=novalue", "", nil)
	if resp.status != http.StatusBadRequest || resp.body.Code != "invalid" {
		t.Fatalf("bad selector: %d %+v", resp.status, resp.body)
	}
}

func TestErrorsCrossTheWire(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	if _, err := h.c.Get(ctx, "s-0000000000000000"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	var ce *client.Error
	if _, err := h.c.Get(ctx, "s-0000000000000000"); !errors.As(err, &ce) || ce.Status != 404 || ce.RequestID == "" {
		t.Fatalf("error details: %#v", err)
	}

	// Invalid: every field problem comes back, as *spec.FieldError.
	bad := hostDecl("bad id!", nil)
	bad.Limits.Memory = "lots"
	_, err := h.c.Create(ctx, bad)
	if !errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("invalid declaration: %v", err)
	}
	var fe *spec.FieldError
	if !errors.As(err, &fe) || !errors.As(err, &ce) || len(ce.Problems) != 2 {
		t.Fatalf("invalid declaration problems: %#v", err)
	}
	fields := []string{ce.Problems[0].Field, ce.Problems[1].Field}
	if !slices.Contains(fields, "id") || !slices.Contains(fields, "limits.memory") {
		t.Fatalf("problem fields %v", fields)
	}

	// Refused: what this host cannot enforce, every refusal named, nothing created.
	ref := hostDecl("ref", nil)
	ref.Runtime = spec.RuntimeDocker
	tooMany := int64(1 << 20) // beyond the local platform's bound (the ids a user namespace maps)
	ref.Limits.MaxProcesses = &tooMany
	_, err = h.c.Create(ctx, ref)
	if !errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("refused declaration: %v", err)
	}
	var pr *plan.Refusal
	if !errors.As(err, &pr) || !errors.As(err, &ce) || ce.Status != http.StatusUnprocessableEntity {
		t.Fatalf("refusal details: %#v", err)
	}
	var caps, rules []string
	for _, p := range ce.Problems {
		caps = append(caps, string(p.Capability))
		rules = append(rules, p.Rule)
	}
	if !slices.Contains(caps, string(capability.DockerRuntime)) || !slices.Contains(rules, "bound.processes") {
		t.Fatalf("refusals %+v, want dockerRuntime and bound.processes", ce.Problems)
	}
	if l, _ := h.c.List(ctx, nil); len(l) != 0 {
		t.Fatalf("a refused create left %d sandboxes", len(l))
	}

	sb := create(t, h.c, "errs", nil)
	// Conflict: a paused sandbox refuses exec, and the class survives the wire.
	if err := sb.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "true", Timeout: time.Second}, nil, nil); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("exec while paused: %v", err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	// The local backend counts usage from the sandbox's cgroup.
	if st, err := sb.Stats(ctx); err != nil || st.MemoryBytes <= 0 || st.Processes < 1 {
		t.Fatalf("stats: %+v, %v", st, err)
	}
	// The agent's own refusals cross both wires.
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Shell: "true", Timeout: time.Second}, nil, nil); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("exec with argv and shell: %v", err)
	}
	if _, err := sb.ReadFile(ctx, "/workspace/absent"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("read absent file: %v", err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: -time.Second}, nil, nil); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("negative timeout: %v", err)
	}
	// Unreachable: nothing listens.
	dead, _ := client.Dial(h.sock + ".absent")
	defer dead.Close()
	if _, err := dead.List(ctx, nil); !errors.Is(err, sandbox.ErrUnreachable) {
		t.Fatalf("no daemon: %v", err)
	}
	// A refused unknown endpoint is JSON too.
	if r := h.raw(t, "unix", "GET", "/v1/nope", "", nil); r.status != 404 || r.body.Code != "not_found" {
		t.Fatalf("unknown endpoint: %d %+v", r.status, r.body)
	}
}

type rawResp struct {
	status int
	body   api.Error
	header http.Header
	raw    []byte
}

// raw calls the API without the SDK, as curl would.
func (h *harness) raw(t *testing.T, via, method, path, cred string, body io.Reader) rawResp {
	t.Helper()
	tr := &http.Transport{}
	base := h.tcpURL
	if via == "unix" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", h.sock)
		}
		base = "http://airlock"
	} else {
		tr.TLSClientConfig = h.tlsConf
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctxT(t), method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := rawResp{status: resp.StatusCode, header: resp.Header, raw: b}
	if resp.StatusCode >= 300 {
		if err := json.Unmarshal(b, &r.body); err != nil {
			t.Fatalf("%s %s: %d with a body that is not an API error: %q", method, path, resp.StatusCode, b)
		}
	}
	return r
}

func TestDelegatedTokens(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	a := create(t, h.c, "a", map[string]string{"k": "v"})
	b := create(t, h.c, "b", map[string]string{"k": "v"})

	execTok, err := a.MintToken(ctx, token.Execute, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if execTok.Session != a.ID || execTok.Class != token.Execute || time.Until(execTok.ExpiresAt) > 10*time.Minute {
		t.Fatalf("minted %+v", execTok)
	}
	manageTok, err := a.MintToken(ctx, token.Manage, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.MintToken(ctx, token.Execute, 31*time.Minute); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("ttl over the maximum: %v", err)
	}
	if _, err := a.MintToken(ctx, "admin", time.Minute); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("unknown class: %v", err)
	}

	// The delegated caller reaches the daemon over TCP with nothing but its token.
	ex := h.clientWith(t, client.Options{BaseURL: h.tcpURL, TLSConfig: h.tlsConf, Token: execTok.Token})
	exA := ex.Sandbox(a.ID)
	var out bytes.Buffer
	if res, err := exA.Exec(ctx, sandbox.ExecRequest{Shell: "echo delegated", Timeout: 10 * time.Second}, &out, nil); err != nil || res.ExitCode != 0 || out.String() != "delegated\n" {
		t.Fatalf("exec with an execute token: %q %+v %v", out.String(), res, err)
	}
	if err := exA.WriteFile(ctx, "/workspace/x", strings.NewReader("x"), 0); err != nil {
		t.Fatalf("write with an execute token: %v", err)
	}
	if err := exA.Refresh(ctx); err != nil || exA.SandboxID != "a" {
		t.Fatalf("get with an execute token: %v", err)
	}
	// Listing shows its own session only, whatever the selector.
	if l, err := ex.List(ctx, map[string]string{"k": "v"}); err != nil || len(l) != 1 || l[0].ID != a.ID {
		t.Fatalf("list with a token: %v %v", l, err)
	}
	if _, err := ex.Capabilities(ctx); err != nil {
		t.Fatalf("capabilities with a token: %v", err)
	}

	refusedAs := func(err error, class error, reason string) {
		t.Helper()
		var ce *client.Error
		if !errors.Is(err, class) || !errors.As(err, &ce) || ce.Reason != reason {
			t.Fatalf("got %v (%#v), want %v with reason %q", err, err, class, reason)
		}
	}
	// Another session, another class, the daemon's own calls: forbidden.
	_, err = ex.Sandbox(b.ID).Exec(ctx, sandbox.ExecRequest{Shell: "true", Timeout: time.Second}, nil, nil)
	refusedAs(err, sandbox.ErrForbidden, "wrongSession")
	// A second session of the same sandbox id is another session all the same.
	twin := create(t, h.c, "a", nil)
	_, err = ex.Sandbox(twin.ID).Exec(ctx, sandbox.ExecRequest{Shell: "true", Timeout: time.Second}, nil, nil)
	refusedAs(err, sandbox.ErrForbidden, "wrongSession")
	if l, err := ex.List(ctx, nil); err != nil || len(l) != 1 || l[0].ID != a.ID {
		t.Fatalf("list with a token beside a twin: %v %v", l, err)
	}
	refusedAs(ex.Sandbox(b.ID).Refresh(ctx), sandbox.ErrForbidden, "wrongSession")
	refusedAs(exA.Terminate(ctx), sandbox.ErrForbidden, "wrongClass")
	refusedAs(exA.Pause(ctx), sandbox.ErrForbidden, "wrongClass")
	_, err = ex.Create(ctx, hostDecl("c", nil))
	refusedAs(err, sandbox.ErrForbidden, "delegated")
	_, err = exA.MintToken(ctx, token.Manage, time.Minute)
	refusedAs(err, sandbox.ErrForbidden, "delegated")
	if r := h.raw(t, "tcp", "GET", "/metrics", execTok.Token, nil); r.status != 403 || r.body.Reason != "delegated" {
		t.Fatalf("metrics with a token: %d %+v", r.status, r.body)
	}
	// A token for a session that no longer exists is forbidden on another one, and gets a
	// plain not-found on its own: no lookup happens before the session check.
	if r := h.raw(t, "tcp", "GET", "/v1/sandboxes/s-0000000000000000", execTok.Token, nil); r.status != 403 || r.body.Reason != "wrongSession" {
		t.Fatalf("unknown session with a token: %d %+v", r.status, r.body)
	}

	mg := h.clientWith(t, client.Options{BaseURL: h.tcpURL, TLSConfig: h.tlsConf, Token: manageTok.Token})
	mgA := mg.Sandbox(a.ID)
	_, err = mgA.Exec(ctx, sandbox.ExecRequest{Shell: "true", Timeout: time.Second}, nil, nil)
	refusedAs(err, sandbox.ErrForbidden, "wrongClass")
	_, err = mgA.ReadFile(ctx, "/workspace/x")
	refusedAs(err, sandbox.ErrForbidden, "wrongClass")
	// Authorised, so the backend answers.
	if err := mgA.Pause(ctx); err != nil {
		t.Fatalf("pause with a manage token: %v", err)
	}
	if err := mgA.Resume(ctx); err != nil {
		t.Fatalf("resume with a manage token: %v", err)
	}
	refusedAs(mg.Sandbox(b.ID).Terminate(ctx), sandbox.ErrForbidden, "wrongSession")

	// Credentials that are not valid: 401, with the token's reason.
	mint := func(key ed25519.PrivateKey, c token.Claims) string {
		t.Helper()
		tok, err := token.Mint(key, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	claims := token.Claims{Sandbox: "a", Session: a.ID, Generation: a.Generation, Class: token.Execute, Expiry: time.Now().Add(time.Hour).Unix()}
	expired := claims
	expired.Expiry = time.Now().Add(-time.Minute).Unix()
	stale := claims
	stale.Generation++
	otherSandbox := claims
	otherSandbox.Sandbox = "b"
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	for _, tc := range []struct {
		name, cred string
		status     int
		reason     string
	}{
		{"expired", mint(h.key, expired), 401, "expired"},
		{"foreign key", mint(otherKey, claims), 401, "badSignature"},
		{"garbage", "not.a-token", 401, "malformed"},
		{"unknown api key", "no-such-key-0123456789", 401, "unknownKey"},
		{"tampered", execTok.Token[:10] + "x" + execTok.Token[11:], 401, ""},
		{"stale generation", mint(h.key, stale), 403, "staleGeneration"},
		{"other sandbox", mint(h.key, otherSandbox), 403, "wrongSandbox"},
		{"valid", mint(h.key, claims), 200, ""},
	} {
		for _, via := range []string{"tcp", "unix"} {
			r := h.raw(t, via, "GET", "/v1/sandboxes/"+a.ID, tc.cred, nil)
			if r.status != tc.status || (tc.reason != "" && r.body.Reason != tc.reason) {
				t.Errorf("%s over %s: %d %+v, want %d %q", tc.name, via, r.status, r.body, tc.status, tc.reason)
			}
			if r.status == 401 && (r.body.Code != "unauthenticated" || r.body.Message == "") {
				t.Errorf("%s over %s: body %+v", tc.name, via, r.body)
			}
		}
	}
	// TCP needs a credential; the socket's permissions are one.
	if r := h.raw(t, "tcp", "GET", "/v1/sandboxes", "", nil); r.status != 401 || r.body.Reason != "missing" {
		t.Fatalf("tcp without credentials: %d %+v", r.status, r.body)
	}
	if r := h.raw(t, "tcp", "GET", "/v1/sandboxes", testAPIKey, nil); r.status != 200 {
		t.Fatalf("tcp with the API key: %d %s", r.status, r.raw)
	}
	if r := h.raw(t, "unix", "GET", "/v1/sandboxes", "", nil); r.status != 200 {
		t.Fatalf("socket without credentials: %d %s", r.status, r.raw)
	}
	if r := h.raw(t, "tcp", "GET", "/healthz", "", nil); r.status != 200 {
		t.Fatalf("healthz: %d", r.status)
	}

	// A manage token ends its session; the execute token then finds nothing.
	if err := mgA.Terminate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exA.Refresh(ctx); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get after terminate with a token: %v", err)
	}
	if l, err := ex.List(ctx, nil); err != nil || len(l) != 0 {
		t.Fatalf("list after its session ended: %v %v", l, err)
	}
}

func TestProcesses(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "procs", nil)
	p, err := sb.StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{Shell: "read x; echo got $x; echo bye >&2", Timeout: 30 * time.Second}, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Running || p.ID == "" {
		t.Fatalf("started %+v", p.Process)
	}
	ps, err := sb.Processes(ctx)
	if err != nil || len(ps) != 1 || ps[0].ID != p.ID {
		t.Fatalf("processes: %v %v", ps, err)
	}
	if err := p.WriteStdin(ctx, strings.NewReader("hi\n"), true); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait(ctx)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("wait: %+v %v", res, err)
	}
	var out, errb bytes.Buffer
	res, err = p.Attach(ctx, true, &out, &errb)
	if err != nil || out.String() != "got hi\n" || errb.String() != "bye\n" || res.ExitCode != 0 {
		t.Fatalf("attach from start: %q %q %+v %v", out.String(), errb.String(), res, err)
	}
	if err := p.Refresh(ctx); err != nil || p.Running || p.Exit == nil {
		t.Fatalf("after exit: %+v %v", p.Process, err)
	}
	if err := p.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Process(ctx, p.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("removed process: %v", err)
	}

	// A terminal process, resized while it runs.
	tp, err := sb.StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{Shell: "read x; stty size", TTY: true, Timeout: 30 * time.Second}, OpenStdin: true, ExecOptions: client.ExecOptions{Rows: 10, Cols: 20}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.Resize(ctx, 33, 99); err != nil {
		t.Fatal(err)
	}
	if err := tp.WriteStdin(ctx, strings.NewReader("\n"), false); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if res, err := tp.Attach(ctx, true, &out, nil); err != nil || res.ExitCode != 0 || !strings.Contains(out.String(), "33 99") {
		t.Fatalf("resized tty process: %q %+v %v", out.String(), res, err)
	}

	long, err := sb.StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{Argv: []string{"sleep", "60"}, Timeout: 120 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := long.Signal(ctx, "TERM"); err != nil {
		t.Fatal(err)
	}
	if res, err := long.Wait(ctx); err != nil || res.Signal == "" {
		t.Fatalf("signalled process: %+v %v", res, err)
	}
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "m", nil)
	execShell(t, sb, "true")
	_, _ = h.c.Create(ctx, hostDecl("bad id!", nil)) // refused before the backend: not a create

	r := h.raw(t, "unix", "GET", "/metrics", "", nil)
	if r.status != 200 {
		t.Fatalf("metrics: %d", r.status)
	}
	// Legacy validation: the names must be what every scraper accepts, not only UTF-8 ones.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(r.raw))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, r.raw)
	}
	for _, name := range []string{"airlock_sandboxes", "airlock_sandbox_create_seconds", "airlock_exec_seconds", "airlock_egress_connections_total", "airlock_http_requests_total"} {
		if fams[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	gauge := func(name, label, value string) float64 {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
					if m.GetCounter() != nil {
						return m.GetCounter().GetValue()
					}
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
		t.Fatalf("no %s{%s=%q}", name, label, value)
		return 0
	}
	if v := gauge("airlock_sandboxes", "state", "running"); v != 1 {
		t.Errorf("running sandboxes %v, want 1", v)
	}
	if v := gauge("airlock_sandbox_create_seconds", "outcome", "ok"); v != 1 {
		t.Errorf("creates observed %v, want 1", v)
	}
	if v := gauge("airlock_exec_seconds", "outcome", "exited"); v != 1 {
		t.Errorf("execs observed %v, want 1", v)
	}
	if v := gauge("airlock_egress_connections_total", "decision", "denied"); v != 0 {
		t.Errorf("egress denied %v, want 0 until egress reports", v)
	}
	if problems, err := testutil.GatherAndLint(h.reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if n, err := testutil.GatherAndCount(h.reg, "airlock_sandboxes"); err != nil || n != 3 {
		t.Errorf("airlock_sandboxes has %d series (%v), want one per state", n, err)
	}
}

// TestRequestIDs checks that every answer carries a request id, that a caller's plain id is
// kept, and that every log line a request causes names it.
func TestRequestIDs(t *testing.T) {
	h := newHarness(t, nil)
	req, _ := http.NewRequest("GET", "http://airlock/v1/sandboxes/s-0000000000000000", nil)
	req.Header.Set(api.RequestIDHeader, "trace-42")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", h.sock)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body api.Error
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.Header.Get(api.RequestIDHeader) != "trace-42" || body.RequestID != "trace-42" {
		t.Fatalf("request id: header %q body %q", resp.Header.Get(api.RequestIDHeader), body.RequestID)
	}
	req.Header.Set(api.RequestIDHeader, "bad id\twith junk")
	resp, err = (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if id := resp.Header.Get(api.RequestIDHeader); id == "" || strings.Contains(id, "junk") {
		t.Fatalf("unsafe request id echoed: %q", id)
	}

	sb := create(t, h.c, "rid", nil)
	execShell(t, sb, "true")
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["backend"] != nil || rec["msg"] == "listening" {
			continue // the backend's own lines and start-up are not a request's
		}
		lines++
		if id, _ := rec["request_id"].(string); id == "" {
			t.Errorf("log line without request_id: %s", line)
		}
	}
	if lines < 4 {
		t.Fatalf("only %d request log lines", lines)
	}
}

// TestSDKExample compiles and runs examples/sdk against the daemon.
func TestSDKExample(t *testing.T) {
	h := newHarness(t, nil)
	cmd := exec.Command("go", "run", "./examples/sdk")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), client.EnvSocket+"="+h.sock)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./examples/sdk: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "42\n") || !strings.Contains(string(out), "exit code: 0") {
		t.Fatalf("example output:\n%s", out)
	}
	if l, err := h.c.List(ctxT(t), nil); err != nil || len(l) != 0 {
		t.Fatalf("the example left sandboxes: %v %v", l, err)
	}
}
