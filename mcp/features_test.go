package mcp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	agentclient "github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// featureBackend implements every optional feature; its capability set says which it has.
type featureBackend struct {
	deadBackend
	no map[capability.Name]bool
}

func (f *featureBackend) Capabilities(ctx context.Context) capability.Set {
	s := f.deadBackend.Capabilities(ctx)
	for n := range f.no {
		s.Entries[n] = capability.Status{Reason: "this platform has none"}
	}
	return s
}
func (f *featureBackend) Preview(context.Context, string, int, time.Duration) (sandbox.PreviewInfo, error) {
	return sandbox.PreviewInfo{}, sandbox.ErrUnsupported
}
func (f *featureBackend) Snapshot(context.Context, string, string) (sandbox.SnapshotInfo, error) {
	return sandbox.SnapshotInfo{}, sandbox.ErrUnsupported
}
func (f *featureBackend) ListSnapshots(context.Context) ([]sandbox.SnapshotInfo, error) {
	return nil, nil
}
func (f *featureBackend) DeleteSnapshot(context.Context, string) error { return nil }
func (f *featureBackend) Fork(context.Context, string, int) ([]*sandbox.Session, error) {
	return nil, sandbox.ErrUnsupported
}
func (f *featureBackend) Stats(context.Context, string) (sandbox.Stats, error) {
	return sandbox.Stats{}, sandbox.ErrUnsupported
}

func toolList(t *testing.T, s *mcp.Server) map[string]map[string]bool {
	t.Helper()
	res, err := connect(t, s).ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, tl := range res.Tools {
		props := map[string]bool{}
		for p := range schemaOf(t, tl.InputSchema).Properties {
			props[p] = true
		}
		out[tl.Name] = props
	}
	return out
}

// TestFeatureToolsFollowTheBackend: a feature's tools (and sandbox_create's arguments for it)
// are advertised only where the backend implements it and its capability set says yes; an
// argument for a missing feature is refused naming the capability.
func TestFeatureToolsFollowTheBackend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend sandbox.Backend
		tools   []string
		args    []string // of sandbox_create, beyond the base ones
	}{
		{"no interfaces", &deadBackend{}, nil, nil},
		{"everything", &featureBackend{}, []string{"sandbox_fork", "sandbox_preview_url", "sandbox_snapshot", "sandbox_snapshot_delete", "sandbox_snapshots", "sandbox_stats"}, []string{"from_snapshot", "preview_ports"}},
		{"capabilities say no", &featureBackend{no: map[capability.Name]bool{capability.Preview: true, capability.Snapshot: true, capability.Stats: true}}, nil, nil},
		{"snapshot only", &featureBackend{no: map[capability.Name]bool{capability.Preview: true, capability.Stats: true}}, []string{"sandbox_fork", "sandbox_snapshot", "sandbox_snapshot_delete", "sandbox_snapshots"}, []string{"from_snapshot"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mcp.New(tc.backend, mcp.Options{Logger: quiet})
			defer s.Close(context.Background())
			tools := toolList(t, s)
			var extra []string
			for n := range tools {
				if !slices.Contains([]string{"run_code", "sandbox_create", "sandbox_exec", "sandbox_list", "sandbox_process_kill", "sandbox_process_output", "sandbox_read_file", "sandbox_terminate", "sandbox_write_file"}, n) {
					extra = append(extra, n)
				}
			}
			slices.Sort(extra)
			if !slices.Equal(extra, tc.tools) {
				t.Errorf("feature tools %v, want %v", extra, tc.tools)
			}
			var args []string
			for _, a := range []string{"from_snapshot", "preview_ports"} {
				if tools["sandbox_create"][a] {
					args = append(args, a)
				}
			}
			if !slices.Equal(args, tc.args) {
				t.Errorf("sandbox_create feature arguments %v, want %v", args, tc.args)
			}
			if !slices.Contains(tc.args, "preview_ports") {
				r := call(t, connect(t, s), "sandbox_create", map[string]any{"preview_ports": []int{8080}})
				if !r.IsError || !strings.Contains(text(r), "preview_ports: unsupported: preview on local") {
					t.Errorf("preview_ports without preview: %s", text(r))
				}
			}
		})
	}
}

// localFeatureBackend is a local backend whose snapshots live in the test's directory.
func localFeatureBackend(t *testing.T) *local.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	stateDir := runcodetest.StateDir(t)
	b, err := local.New(context.Background(), local.Options{StateDir: stateDir, ImageCacheDir: filepath.Join(stateDir, "images"),
		AgentPath: agentBin, CgroupParent: runcodetest.CgroupParent(t), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := b.List(ctx)
		for _, s := range list {
			t.Errorf("sandbox %s outlived its test", s.ID)
			_ = b.Terminate(ctx, s.ID)
		}
		b.Close()
	})
	return b
}

type sessionOut struct {
	SessionID    string `json:"session_id"`
	PreviewPorts []int  `json:"preview_ports"`
}

// TestLocalFeatureTools drives the feature tools on the local runtime: a preview URL a browser
// opens, a snapshot a new session starts from, a fork counted against the session limit, stats,
// and Close removing the server's sandboxes and snapshots.
func TestLocalFeatureTools(t *testing.T) {
	b := localFeatureBackend(t)
	s := mcp.New(b, mcp.Options{Logger: quiet, MaxSessions: 4})
	closed := false
	defer func() {
		if !closed {
			s.Close(context.Background())
		}
	}()
	tools := toolList(t, s)
	for _, n := range []string{"sandbox_snapshot", "sandbox_fork", "sandbox_preview_url"} {
		if tools[n] == nil {
			t.Fatalf("the local runtime's %s is not advertised: %v", n, tools)
		}
	}
	cs := connect(t, s)
	ctx := context.Background()

	r := call(t, cs, "sandbox_create", map[string]any{"preview_ports": []int{8080}})
	if r.IsError {
		t.Fatal(text(r))
	}
	parent := structured[sessionOut](t, r)
	if !slices.Equal(parent.PreviewPorts, []int{8080}) {
		t.Fatalf("created %+v", parent)
	}
	if r := call(t, cs, "sandbox_exec", map[string]any{"session_id": parent.SessionID, "command": "mkdir site && echo hello from mcp > site/index.html && echo v1 > state.txt"}); r.IsError {
		t.Fatal(text(r))
	}
	a, err := b.Connect(ctx, parent.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.(interface {
		StartProcess(context.Context, agentclient.ProcessRequest, ...agentclient.ExecOption) (agentclient.Process, error)
	}).StartProcess(ctx, agentclient.ProcessRequest{ExecRequest: sandbox.ExecRequest{
		Argv: []string{"python3", "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", "site"}, Timeout: 10 * time.Minute,
	}}); err != nil {
		t.Fatal(err)
	}
	probe := `for i in $(seq 400); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8080/")' 2>/dev/null && exit 0; sleep 0.05; done; exit 1`
	if r := call(t, cs, "sandbox_exec", map[string]any{"session_id": parent.SessionID, "command": probe}); r.IsError || !strings.HasPrefix(text(r), "Exit code: 0") {
		t.Fatalf("the web server never answered: %s", text(r))
	}

	// sandbox_preview_url: the URL opens the page in a browser.
	r = call(t, cs, "sandbox_preview_url", map[string]any{"session_id": parent.SessionID, "port": 8080, "ttl_seconds": 120})
	if r.IsError {
		t.Fatal(text(r))
	}
	pv := structured[struct {
		URL       string `json:"url"`
		ExpiresAt string `json:"expires_at"`
	}](t, r)
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Jar: jar, Transport: tr}).Get(pv.URL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(page) != "hello from mcp\n" || !strings.Contains(text(r), pv.URL) {
		t.Fatalf("opening %s: %d %q", pv.URL, resp.StatusCode, page)
	}
	for _, tc := range []struct {
		args map[string]any
		err  string
	}{
		{map[string]any{"session_id": parent.SessionID, "port": 8081}, "previewPorts"},
		{map[string]any{"session_id": parent.SessionID, "port": 0}, "port 0"},
		{map[string]any{"session_id": parent.SessionID, "port": 8080, "ttl_seconds": 100000}, "ttl_seconds 100000"},
		{map[string]any{"session_id": "s-0000000000000000", "port": 8080}, "no live sandbox session"},
	} {
		if r := call(t, cs, "sandbox_preview_url", tc.args); !r.IsError || !strings.Contains(text(r), tc.err) {
			t.Errorf("sandbox_preview_url %v: %s; want an error with %q", tc.args, text(r), tc.err)
		}
	}

	// sandbox_snapshot, then a session from it.
	r = call(t, cs, "sandbox_snapshot", map[string]any{"session_id": parent.SessionID, "name": "checkpoint"})
	if r.IsError || !strings.Contains(text(r), `from_snapshot "checkpoint"`) {
		t.Fatalf("snapshot: %s", text(r))
	}
	if r := call(t, cs, "sandbox_snapshot", map[string]any{"session_id": parent.SessionID, "name": "checkpoint"}); !r.IsError || !strings.Contains(text(r), "already exists") {
		t.Errorf("the same snapshot name twice: %s", text(r))
	}
	r = call(t, cs, "sandbox_create", map[string]any{"from_snapshot": "checkpoint"})
	if r.IsError {
		t.Fatal(text(r))
	}
	restored := structured[sessionOut](t, r)
	if r := call(t, cs, "sandbox_exec", map[string]any{"session_id": restored.SessionID, "command": "cat state.txt"}); r.IsError || !strings.Contains(text(r), "v1") {
		t.Fatalf("a session from the snapshot: %s", text(r))
	}
	if r := call(t, cs, "sandbox_create", map[string]any{"from_snapshot": "elsewhere"}); !r.IsError || !strings.Contains(text(r), "sandbox_snapshot on this server") {
		t.Errorf("from_snapshot of a snapshot this server did not take: %s", text(r))
	}

	// sandbox_fork: two more sessions fill the limit of 4; the fork's own snapshot is not kept.
	r = call(t, cs, "sandbox_fork", map[string]any{"session_id": parent.SessionID, "count": 2})
	if r.IsError {
		t.Fatal(text(r))
	}
	kids := structured[struct {
		Sandboxes []sessionOut `json:"sandboxes"`
	}](t, r).Sandboxes
	if len(kids) != 2 || !slices.Equal(kids[0].PreviewPorts, []int{8080}) {
		t.Fatalf("fork: %+v", kids)
	}
	call(t, cs, "sandbox_exec", map[string]any{"session_id": kids[0].SessionID, "command": "echo v2 > state.txt"})
	for i, want := range []string{"v2", "v1"} {
		if r := call(t, cs, "sandbox_exec", map[string]any{"session_id": kids[i].SessionID, "command": "cat state.txt"}); r.IsError || !strings.Contains(text(r), want) {
			t.Errorf("fork %d: %s; want %s", i, text(r), want)
		}
	}
	if r := call(t, cs, "sandbox_fork", map[string]any{"session_id": parent.SessionID}); !r.IsError || !strings.Contains(text(r), "at most 4") {
		t.Errorf("a fork over the session limit: %s", text(r))
	}
	snaps, err := b.ListSnapshots(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].Name != "checkpoint" {
		t.Fatalf("snapshots after the fork: %+v %v", snaps, err)
	}

	// sandbox_snapshots lists this server's snapshots only; sandbox_snapshot_delete deletes one
	// of them, and nothing else.
	if _, err := b.Snapshot(ctx, parent.SessionID, "foreign"); err != nil {
		t.Fatal(err)
	}
	defer b.DeleteSnapshot(ctx, "foreign")
	if r := call(t, cs, "sandbox_snapshot", map[string]any{"session_id": parent.SessionID, "name": "second"}); r.IsError {
		t.Fatal(text(r))
	}
	listed := func() []string {
		t.Helper()
		r := call(t, cs, "sandbox_snapshots", nil)
		if r.IsError {
			t.Fatal(text(r))
		}
		var names []string
		for _, x := range structured[struct {
			Snapshots []struct {
				Name      string `json:"name"`
				SessionID string `json:"session_id"`
				Files     int    `json:"files"`
			} `json:"snapshots"`
		}](t, r).Snapshots {
			if x.SessionID != parent.SessionID || x.Files == 0 || !strings.Contains(text(r), x.Name) {
				t.Errorf("listed %+v: %s", x, text(r))
			}
			names = append(names, x.Name)
		}
		slices.Sort(names)
		return names
	}
	if got := listed(); !slices.Equal(got, []string{"checkpoint", "second"}) {
		t.Errorf("sandbox_snapshots: %v, want checkpoint and second", got)
	}
	if r := call(t, cs, "sandbox_snapshot_delete", map[string]any{"name": "second"}); r.IsError || !strings.Contains(text(r), `Deleted snapshot "second"`) {
		t.Errorf("sandbox_snapshot_delete: %s", text(r))
	}
	for _, name := range []string{"second", "foreign", "elsewhere"} {
		if r := call(t, cs, "sandbox_snapshot_delete", map[string]any{"name": name}); !r.IsError || !strings.Contains(text(r), "sandbox_snapshot on this server") {
			t.Errorf("deleting %s, not this server's (any more): %s", name, text(r))
		}
	}
	if got := listed(); !slices.Equal(got, []string{"checkpoint"}) {
		t.Errorf("sandbox_snapshots after a delete: %v", got)
	}
	if r := call(t, cs, "sandbox_create", map[string]any{"from_snapshot": "second"}); !r.IsError || !strings.Contains(text(r), "sandbox_snapshot on this server") {
		t.Errorf("from_snapshot of a deleted snapshot: %s", text(r))
	}
	if snaps, err := b.ListSnapshots(ctx); err != nil || len(snaps) != 2 {
		t.Fatalf("the store after a delete: %+v %v; want checkpoint and foreign", snaps, err)
	}

	if tools["sandbox_stats"] != nil {
		r = call(t, cs, "sandbox_stats", map[string]any{"session_id": parent.SessionID})
		st := structured[struct {
			MemoryBytes int64 `json:"memory_bytes"`
		}](t, r)
		if r.IsError || st.MemoryBytes <= 0 {
			t.Errorf("stats: %s", text(r))
		}
	} else if _, err := sandbox.Feature[sandbox.StatsReader](ctx, b); err == nil {
		t.Errorf("the local runtime reports stats, and sandbox_stats is not advertised")
	}

	// Close takes the server's sessions and snapshots with it, and no others.
	closed = true
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := liveSessions(t, b); n != 0 {
		t.Errorf("%d sandboxes outlived the server", n)
	}
	if snaps, err := b.ListSnapshots(ctx); err != nil || len(snaps) != 1 || snaps[0].Name != "foreign" {
		t.Errorf("snapshots after the server: %+v %v; want foreign only", snaps, err)
	}
}
