package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// webPort is the port the test's web server listens on inside its sandbox (its own network
// namespace: nothing on the host is in the way).
const webPort = 8080

// startWeb serves a page naming the sandbox on webPort inside sb, and returns once it answers.
func startWeb(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	if out, errs, res := execShell(t, sb, `mkdir -p site && echo "hello from web" > site/index.html`); res.ExitCode != 0 {
		t.Fatalf("site: %q %q %+v", out, errs, res)
	}
	if _, err := sb.StartProcess(ctxT(t), client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
		Argv: []string{"python3", "-m", "http.server", fmt.Sprint(webPort), "--bind", "127.0.0.1", "--directory", "site"}, Timeout: 10 * time.Minute,
	}}); err != nil {
		t.Fatal(err)
	}
	probe := fmt.Sprintf(`for i in $(seq 400); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:%d/")' 2>/dev/null && exit 0; sleep 0.05; done; exit 1`, webPort)
	if _, errs, res := execShell(t, sb, probe); res.ExitCode != 0 {
		t.Fatalf("the web server never answered: %s", errs)
	}
}

func httpGet(t *testing.T, c *http.Client, url, bearer string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPreviewOverSDK opens a declared port through the daemon and reaches the sandbox's web
// server with the URL it answers, as a browser would.
func TestPreviewOverSDK(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	d := hostDecl("web", nil)
	d.PreviewPorts = []int{webPort}
	sb, err := h.c.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	startWeb(t, sb)

	before := time.Now()
	info, err := sb.Preview(ctx, webPort, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if info.Port != webPort || !strings.HasPrefix(info.Addr, "127.0.0.1:") || !strings.Contains(info.URL, info.Token) ||
		info.ExpiresAt.Before(before.Add(89*time.Second)) || info.ExpiresAt.After(time.Now().Add(91*time.Second)) {
		t.Fatalf("preview %+v", info)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	jar, _ := cookiejar.New(nil)
	if code, body := httpGet(t, &http.Client{Transport: tr, Jar: jar}, info.URL, ""); code != 200 || body != "hello from web\n" {
		t.Fatalf("opening the preview URL: %d %q", code, body)
	}
	plain := &http.Client{Transport: tr}
	if code, _ := httpGet(t, plain, "http://"+info.Addr+"/", ""); code != http.StatusUnauthorized {
		t.Fatalf("the preview without a token: %d", code)
	}

	// Refusals keep their class across the wire.
	if _, err := sb.Preview(ctx, webPort+1, 0); !errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), "previewPorts") {
		t.Fatalf("an undeclared port: %v", err)
	}
	if _, err := sb.Preview(ctx, webPort, 48*time.Hour); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("a ttl over the local maximum: %v", err)
	}
	if _, err := h.c.Sandbox("s-0000000000000000").Preview(ctx, webPort, 0); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("an unknown session: %v", err)
	}

	// An execute token of the session may open it; a manage token may not.
	for _, tc := range []struct {
		class token.Class
		err   error
	}{{token.Execute, nil}, {token.Manage, sandbox.ErrForbidden}} {
		tok, err := sb.MintToken(ctx, tc.class, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		dc := h.clientWith(t, client.Options{BaseURL: h.tcpURL, TLSConfig: h.tlsConf, Token: tok.Token})
		got, err := dc.Sandbox(sb.ID).Preview(ctx, webPort, 0)
		switch {
		case tc.err == nil && err != nil:
			t.Fatalf("preview with an %s token: %v", tc.class, err)
		case tc.err == nil:
			if code, body := httpGet(t, plain, "http://"+got.Addr+"/", got.Token); code != 200 || body != "hello from web\n" {
				t.Fatalf("the delegated preview: %d %q", code, body)
			}
		case !errors.Is(err, tc.err):
			t.Fatalf("preview with a %s token: %v, want %v", tc.class, err, tc.err)
		}
	}
}

// TestSnapshotAndForkOverSDK takes a snapshot through the daemon, starts a sandbox from it,
// forks a running one, lists and deletes snapshots.
func TestSnapshotAndForkOverSDK(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "origin", nil)
	execShell(t, sb, "echo v1 > /workspace/state.txt && mkdir -p /workspace/d && echo deep > /workspace/d/f")

	snap, err := sb.Snapshot(ctx, "e2e-snap")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Name != "e2e-snap" || snap.SessionID != sb.ID || snap.SandboxID != "origin" || snap.Base != "host" ||
		snap.Files < 2 || snap.Size <= 0 || snap.Digest == "" || snap.CreatedAt.IsZero() {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, err := sb.Snapshot(ctx, "e2e-snap"); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("the same name twice: %v", err)
	}
	if _, err := sb.Snapshot(ctx, "bad/name"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("a bad name: %v", err)
	}
	d := hostDecl("restored", nil)
	d.Image = spec.Image{Snapshot: "e2e-snap"}
	restored, err := h.c.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := execShell(t, restored, "cat /workspace/state.txt /workspace/d/f"); out != "v1\ndeep\n" {
		t.Fatalf("a sandbox from the snapshot has %q", out)
	}

	kids, err := sb.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 || kids[0].ID == kids[1].ID || kids[0].SandboxID != "origin" || kids[0].Spec.Image.Snapshot == "" || kids[1].Spec.Image.Snapshot != kids[0].Spec.Image.Snapshot {
		t.Fatalf("fork: %+v", kids)
	}
	execShell(t, kids[0], "echo v2 > /workspace/state.txt")
	for i, want := range []string{"v2\n", "v1\n"} {
		if out, _, _ := execShell(t, kids[i], "cat /workspace/state.txt"); out != want {
			t.Fatalf("child %d has %q, want %q", i, out, want)
		}
	}
	if out, _, _ := execShell(t, sb, "cat /workspace/state.txt"); out != "v1\n" {
		t.Fatalf("the parent after the fork has %q", out)
	}
	if _, err := sb.Fork(ctx, 0); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("fork 0: %v", err)
	}
	if _, err := sb.Fork(ctx, local.MaxFork+1); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("fork %d: %v", local.MaxFork+1, err)
	}
	names := func() []string {
		list, err := h.c.Snapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list {
			out = append(out, s.Name)
		}
		return out
	}
	forkSnap := kids[0].Spec.Image.Snapshot
	if got := names(); !slices.Equal(got, []string{"e2e-snap", forkSnap}) {
		t.Fatalf("snapshots %v", got)
	}
	for _, n := range []string{"e2e-snap", forkSnap} {
		if err := h.c.DeleteSnapshot(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.c.DeleteSnapshot(ctx, "e2e-snap"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("deleting twice: %v", err)
	}
	if got := names(); len(got) != 0 {
		t.Fatalf("snapshots after delete %v", got)
	}
	// Sandboxes made from a deleted snapshot run on.
	if out, _, _ := execShell(t, kids[1], "cat /workspace/d/f"); out != "deep\n" {
		t.Fatalf("a fork after its snapshot went: %q", out)
	}

	// Snapshots and forks are the daemon's: a delegated token may not take one.
	tok, err := sb.MintToken(ctx, token.Execute, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dc := h.clientWith(t, client.Options{BaseURL: h.tcpURL, TLSConfig: h.tlsConf, Token: tok.Token})
	if _, err := dc.Sandbox(sb.ID).Snapshot(ctx, "by-token"); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("snapshot with a token: %v", err)
	}
	if _, err := dc.Sandbox(sb.ID).Fork(ctx, 1); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("fork with a token: %v", err)
	}
}

// TestFeaturesUnsupportedOverSDK: a daemon whose backend lacks the features answers each with
// ErrUnsupported naming the capability.
func TestFeaturesUnsupportedOverSDK(t *testing.T) {
	h := newHarnessWith(t, harnessConfig{wrap: func(b *local.Backend) sandbox.Backend { return plainBackend{b} }})
	ctx := ctxT(t)
	sb := create(t, h.c, "plain", nil)
	for name, call := range map[string]func() error{
		"preview":  func() error { _, err := sb.Preview(ctx, webPort, 0); return err },
		"snapshot": func() error { _, err := sb.Snapshot(ctx, "x"); return err },
		"fork":     func() error { _, err := sb.Fork(ctx, 1); return err },
		"list":     func() error { _, err := h.c.Snapshots(ctx); return err },
		"delete":   func() error { return h.c.DeleteSnapshot(ctx, "x") },
		"stats":    func() error { _, err := sb.Stats(ctx); return err },
		"pause":    func() error { return sb.Pause(ctx) },
	} {
		capName := map[string]string{"preview": "preview", "stats": "stats", "pause": "suspendResume"}[name]
		if capName == "" {
			capName = "snapshot"
		}
		if err := call(); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), capName+" on local") {
			t.Errorf("%s: %v, want ErrUnsupported naming %s", name, err, capName)
		}
	}
}

// TestStatsOverSDK reads a running sandbox's usage where the backend counts it, and is
// refused naming the capability where it does not.
func TestStatsOverSDK(t *testing.T) {
	h := newHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "stats", nil)
	execShell(t, sb, "python3 -c 'x = bytearray(32 << 20); sum(range(3000000))'")
	st, err := sb.Stats(ctx)
	if _, ferr := sandbox.Feature[sandbox.StatsReader](context.Background(), h.backend); ferr != nil {
		if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "stats") {
			t.Fatalf("stats on a backend without them (%v): %+v %v", ferr, st, err)
		}
		return
	}
	if err != nil || st.MemoryBytes <= 0 || st.CPUSeconds <= 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
}
