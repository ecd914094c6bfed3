package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

var agentBin string

var quiet = slog.New(slog.DiscardHandler)

func TestMain(m *testing.M) { os.Exit(testutil.MainWithAgent(m, &agentBin)) }

// deadBackend supports everything and creates nothing: the input checks under test must
// answer before any sandbox is asked for.
type deadBackend struct{ creates int }

func (d *deadBackend) Platform() capability.Platform { return capability.Local }
func (d *deadBackend) Capabilities(context.Context) capability.Set {
	s := capability.Set{Platform: capability.Local, Entries: map[capability.Name]capability.Status{}}
	for _, n := range capability.Names {
		s.Entries[n] = capability.Status{Supported: true}
	}
	return s
}
func (d *deadBackend) Create(context.Context, spec.Sandbox) (*sandbox.Session, error) {
	d.creates++
	return nil, fmt.Errorf("%w: dead backend", sandbox.ErrUnsupported)
}
func (d *deadBackend) Get(context.Context, string) (*sandbox.Session, error) {
	return nil, sandbox.ErrNotFound
}
func (d *deadBackend) List(context.Context) ([]*sandbox.Session, error) { return nil, nil }
func (d *deadBackend) Connect(context.Context, string) (sandbox.Agent, error) {
	return nil, sandbox.ErrNotFound
}
func (d *deadBackend) Terminate(context.Context, string) error { return nil }

// connect serves s to an in-process go-sdk client over in-memory transports.
func connect(t *testing.T, s *mcp.Server) *sdk.ClientSession {
	t.Helper()
	ct, st := sdk.NewInMemoryTransports()
	ss, err := s.SDK().Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): protocol error %v (input mistakes must be tool errors)", name, args, err)
	}
	return r
}

func text(r *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// structured decodes a result's structured content into T.
func structured[T any](t *testing.T, r *sdk.CallToolResult) T {
	t.Helper()
	var v T
	b, err := json.Marshal(r.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return v
}

func TestToolsAndSchemas(t *testing.T) {
	s := mcp.New(&deadBackend{}, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tools := map[string]*sdk.Tool{}
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		tools[tl.Name] = tl
	}
	slices.Sort(names)
	want := []string{"run_code", "sandbox_create", "sandbox_exec", "sandbox_list", "sandbox_process_kill", "sandbox_process_output", "sandbox_read_file", "sandbox_terminate", "sandbox_write_file"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	for _, tl := range res.Tools {
		if tl.OutputSchema == nil || tl.Description == "" {
			t.Errorf("%s: no output schema or description", tl.Name)
		}
	}
	in := schemaOf(t, tools["run_code"].InputSchema)
	if !slices.Equal(in.Required, []string{"language", "code"}) {
		t.Errorf("run_code required %v", in.Required)
	}
	var enum []string
	for _, e := range in.Properties["language"].Enum {
		enum = append(enum, e.(string))
	}
	for _, l := range []string{"python", "node", "bash", "py", "python3", "js", "javascript", "sh", "shell"} {
		if !slices.Contains(enum, l) {
			t.Errorf("language enum %v lacks %s", enum, l)
		}
	}
	// Every name the schema lists is accepted, and nothing else (issue 25).
	if !slices.Equal(enum, runcode.LanguageNames()) {
		t.Errorf("language enum %v, want what run_code accepts: %v", enum, runcode.LanguageNames())
	}
	// Over 300 is capped, not refused: no maximum a client would enforce (issue 25).
	to := in.Properties["timeout_seconds"]
	if to.Maximum != nil || to.Minimum == nil || *to.Minimum != 0 || string(to.Default) != "30" || !strings.Contains(to.Description, "capped to 300") {
		t.Errorf("timeout_seconds schema %+v", to)
	}
	if d := schemaOf(t, tools["sandbox_create"].InputSchema).Properties["network"].Default; string(d) != "false" {
		t.Errorf("sandbox_create network default %q, want false", d)
	}
	if in.AdditionalProperties == nil || in.AdditionalProperties.Not == nil {
		t.Errorf("run_code accepts unknown arguments in its schema: %+v", in.AdditionalProperties)
	}
	out := schemaOf(t, tools["run_code"].OutputSchema)
	for _, f := range []string{"exit_code", "stdout", "stderr", "timed_out", "duration_ms", "sandbox_id"} {
		if !slices.Contains(out.Required, f) {
			t.Errorf("run_code output schema does not require %s", f)
		}
	}
}

func schemaOf(t *testing.T, v any) *jsonschema.Schema {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestInputErrors: every mistake in the arguments is a tool error (the model sees it and can
// correct itself) naming the argument and what is allowed; none reaches the backend.
func TestInputErrors(t *testing.T) {
	b := &deadBackend{}
	s := mcp.New(b, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)
	tests := []struct {
		tool string
		args map[string]any
		has  []string
	}{
		{"run_code", map[string]any{"language": "ruby", "code": "puts 1"}, []string{`"ruby"`, "python, node, bash", "js", "shell"}},
		{"run_code", map[string]any{"code": "print(1)"}, []string{"language is empty"}},
		{"run_code", map[string]any{"language": "python", "code": ""}, []string{"code is empty"}},
		{"run_code", map[string]any{"language": "python"}, []string{"code is empty"}},
		{"run_code", map[string]any{"language": "PYTHON", "code": "x"}, []string{`language "PYTHON"`, "python, node, bash"}},
		{"run_code", map[string]any{"language": " py", "code": "x"}, []string{`language " py"`}},
		{"run_code", map[string]any{"language": "python", "code": "x", "timeout_seconds": -5}, []string{"timeout_seconds -5", "at least 1"}},
		{"run_code", map[string]any{"language": "python", "code": "x", "timeout_seconds": "10"}, []string{"timeout_seconds", "integer", "string"}},
		{"run_code", map[string]any{"language": "python", "code": "x", "timeout_seconds": 1.5}, []string{"timeout_seconds", "integer"}},
		{"run_code", map[string]any{"language": "python", "code": "x", "timeout": 10}, []string{`unknown argument "timeout"`, "timeout_seconds"}},
		{"run_code", map[string]any{"language": "python", "code": "x", "network": "yes"}, []string{"network", "boolean"}},
		{"sandbox_create", map[string]any{"lifetime_seconds": 100000}, []string{"lifetime_seconds 100000", "cap of 86400"}},
		{"sandbox_create", map[string]any{"memory": "lots"}, []string{"limits.memory", "lots"}},
		{"sandbox_create", map[string]any{"max_processes": -1}, []string{"maxProcesses"}},
		{"sandbox_exec", map[string]any{"session_id": "nope", "command": "true"}, []string{`no live sandbox session "nope"`, "sandbox_list"}},
		{"sandbox_exec", map[string]any{"command": "true"}, []string{"session_id is empty"}},
		{"sandbox_read_file", map[string]any{"session_id": "nope", "path": "x"}, []string{`"nope"`}},
		{"sandbox_write_file", map[string]any{"session_id": "nope", "path": "x", "content": ""}, []string{`"nope"`}},
		{"sandbox_terminate", map[string]any{"session_id": "nope"}, []string{`"nope"`}},
		{"sandbox_terminate", map[string]any{}, []string{"session_id is empty"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %v", tt.tool, tt.args), func(t *testing.T) {
			r := call(t, cs, tt.tool, tt.args)
			if !r.IsError {
				t.Fatalf("succeeded: %s", text(r))
			}
			for _, h := range tt.has {
				if !strings.Contains(text(r), h) {
					t.Errorf("error %q lacks %q", text(r), h)
				}
			}
		})
	}
	if b.creates != 0 {
		t.Errorf("%d sandboxes were asked for by invalid calls", b.creates)
	}
}

// TestNetworkRefusedWhereUnenforceable: network: true on a backend without publicOnlyEgress
// is a tool error that names the capability and its reason, and creates nothing.
func TestNetworkRefusedWhereUnenforceable(t *testing.T) {
	b := &noEgressBackend{}
	s := mcp.New(b, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"run_code", map[string]any{"language": "python", "code": "print(1)", "network": true}},
		{"sandbox_create", map[string]any{"network": true}},
	} {
		r := call(t, cs, tc.tool, tc.args)
		if !r.IsError {
			t.Fatalf("%s with network: true succeeded", tc.tool)
		}
		for _, h := range []string{`egress "allow"`, "not available on this host", "publicOnlyEgress", "veth missing"} {
			if !strings.Contains(text(r), h) {
				t.Errorf("%s: %q lacks %q", tc.tool, text(r), h)
			}
		}
	}
	if b.creates != 0 {
		t.Errorf("refused calls created %d sandboxes", b.creates)
	}
}

type noEgressBackend struct{ deadBackend }

func (n *noEgressBackend) Capabilities(ctx context.Context) capability.Set {
	s := n.deadBackend.Capabilities(ctx)
	s.Entries[capability.PublicOnlyEgress] = capability.Status{Reason: "veth missing"}
	return s
}
