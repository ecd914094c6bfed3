package mcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Optional features as tools: each is registered only where the backend has it
// (sandbox.Feature: the interface and the capability), so an agent never sees a tool that can
// only fail. Every tool works on sessions of this server only.

// MaxPreviewTTLSeconds caps sandbox_preview_url's ttl_seconds.
const MaxPreviewTTLSeconds = 86400

type snapshotInput struct {
	SessionID string `json:"session_id" jsonschema:"the session from sandbox_create"`
	Name      string `json:"name" jsonschema:"the snapshot's name: 1 to 64 letters, digits, _ and -"`
}

type snapshotOutput struct {
	Name      string `json:"name" jsonschema:"pass this as from_snapshot to sandbox_create"`
	SessionID string `json:"session_id"`
	Files     int    `json:"files" jsonschema:"regular files captured"`
	Bytes     int64  `json:"bytes" jsonschema:"compressed size"`
	CreatedAt string `json:"created_at"`
}

type snapshotsOutput struct {
	Snapshots []snapshotOutput `json:"snapshots"`
}

type snapshotDeleteInput struct {
	Name string `json:"name" jsonschema:"a snapshot taken with sandbox_snapshot (sandbox_snapshots lists them)"`
}

type snapshotDeleteOutput struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

type forkInput struct {
	SessionID string `json:"session_id" jsonschema:"the session from sandbox_create"`
	Count     int    `json:"count,omitempty" jsonschema:"how many copies to start (default 1)"`
}

type forkOutput struct {
	Sandboxes []sessionInfo `json:"sandboxes"`
}

type previewInput struct {
	SessionID  string `json:"session_id" jsonschema:"the session from sandbox_create, created with this port in preview_ports"`
	Port       int    `json:"port" jsonschema:"one of the session's preview_ports"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty" jsonschema:"how long the URL works, in seconds (default 3600; never past the session's end)"`
}

type previewOutput struct {
	SessionID string `json:"session_id"`
	Port      int    `json:"port"`
	URL       string `json:"url" jsonschema:"open this in a browser; it carries its own credential"`
	ExpiresAt string `json:"expires_at"`
}

type statsOutput struct {
	SessionID       string  `json:"session_id"`
	CPUSeconds      float64 `json:"cpu_seconds" jsonschema:"CPU time used so far"`
	MemoryBytes     int64   `json:"memory_bytes" jsonschema:"memory in use now"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes,omitempty" jsonschema:"the most memory used at once, when known"`
	Processes       int64   `json:"processes,omitempty" jsonschema:"processes and threads now, when known"`
}

func (s *Server) has(f func(context.Context, sandbox.Backend) error) bool {
	return f(s.ctx, s.backend) == nil
}

func hasPreview(ctx context.Context, b sandbox.Backend) error {
	_, err := sandbox.Feature[sandbox.Previewer](ctx, b)
	return err
}

func hasSnapshot(ctx context.Context, b sandbox.Backend) error {
	_, err := sandbox.Feature[sandbox.Snapshotter](ctx, b)
	return err
}

func hasStats(ctx context.Context, b sandbox.Backend) error {
	_, err := sandbox.Feature[sandbox.StatsReader](ctx, b)
	return err
}

// patchCreateSchema drops sandbox_create's arguments for features the platform lacks.
func (s *Server) patchCreateSchema(in *jsonschema.Schema) {
	if !s.has(hasPreview) {
		delete(in.Properties, "preview_ports")
	} else {
		pp := prop(in, "preview_ports")
		pp.Items.Minimum, pp.Items.Maximum = ptrF(1), ptrF(65535)
	}
	if !s.has(hasSnapshot) {
		delete(in.Properties, "from_snapshot")
	}
}

// createFeatures checks sandbox_create's feature arguments and returns the image to start from.
func (s *Server) createFeatures(ctx context.Context, in createInput) (spec.Image, error) {
	if len(in.PreviewPorts) > 0 {
		if err := hasPreview(ctx, s.backend); err != nil {
			return spec.Image{}, fmt.Errorf("preview_ports: %w", err)
		}
	}
	if in.FromSnapshot == "" {
		return s.opts.Image, nil
	}
	if err := hasSnapshot(ctx, s.backend); err != nil {
		return spec.Image{}, fmt.Errorf("from_snapshot: %w", err)
	}
	// Only this server's snapshots: the store may hold other users' files.
	s.mu.Lock()
	ok := s.snapshots[in.FromSnapshot]
	s.mu.Unlock()
	if !ok {
		return spec.Image{}, fmt.Errorf("%w: from_snapshot %q: no snapshot of that name was taken with sandbox_snapshot on this server", sandbox.ErrNotFound, in.FromSnapshot)
	}
	return spec.Image{Snapshot: in.FromSnapshot}, nil
}

// registerFeatures adds the tools of the optional features the backend has.
func (s *Server) registerFeatures() {
	if s.has(hasSnapshot) {
		addTool(s, &sdk.Tool{
			Name:  "sandbox_snapshot",
			Title: "Snapshot a sandbox session's files",
			Description: "Saves the files of a sandbox from sandbox_create (its workdir and /tmp; not its running " +
				"processes) under a name. sandbox_create with from_snapshot starts a new session with them. " +
				"Snapshots last until this server stops.",
			Annotations: &sdk.ToolAnnotations{DestructiveHint: new(false)},
		}, func(in *jsonschema.Schema) {
			prop(in, "name").Pattern = "^[A-Za-z0-9_-]{1,64}$"
		}, s.snapshot)

		addTool(s, &sdk.Tool{
			Name:        "sandbox_snapshots",
			Title:       "List snapshots",
			Description: "Lists the snapshots taken with sandbox_snapshot through this server, newest first.",
			Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
		}, nil, s.listSnapshots)

		addTool(s, &sdk.Tool{
			Name:        "sandbox_snapshot_delete",
			Title:       "Delete a snapshot",
			Description: "Deletes a snapshot taken with sandbox_snapshot through this server; sessions started from it keep their files.",
			Annotations: &sdk.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true},
		}, func(in *jsonschema.Schema) {
			prop(in, "name").Pattern = "^[A-Za-z0-9_-]{1,64}$"
		}, s.snapshotDelete)

		addTool(s, &sdk.Tool{
			Name:  "sandbox_fork",
			Title: "Fork a sandbox session",
			Description: "Starts count new sandbox sessions, each with a copy of the files of a sandbox from " +
				"sandbox_create (not its running processes) and its settings; use them to try different " +
				"approaches from the same state. Each is a session like one from sandbox_create and counts " +
				"towards the live-session limit.",
			Annotations: &sdk.ToolAnnotations{DestructiveHint: new(false)},
		}, func(in *jsonschema.Schema) {
			c := prop(in, "count")
			c.Minimum, c.Maximum, c.Default = ptrF(1), ptrF(float64(s.opts.MaxSessions)), []byte("1")
		}, s.fork)
	}
	if s.has(hasPreview) {
		addTool(s, &sdk.Tool{
			Name:  "sandbox_preview_url",
			Title: "Get a browser URL for a port of a sandbox session",
			Description: "Returns a URL that opens, in the user's browser, a web server listening inside a sandbox " +
				"from sandbox_create on one of its preview_ports. The URL carries its own credential; give it " +
				"to the user, not to untrusted parties.",
			Annotations: &sdk.ToolAnnotations{DestructiveHint: new(false)},
		}, func(in *jsonschema.Schema) {
			p := prop(in, "port")
			p.Minimum, p.Maximum = ptrF(1), ptrF(65535)
			ttl := prop(in, "ttl_seconds")
			ttl.Minimum, ttl.Maximum, ttl.Default = ptrF(1), ptrF(MaxPreviewTTLSeconds), []byte("3600")
		}, s.previewURL)
	}
	if s.has(hasStats) {
		addTool(s, &sdk.Tool{
			Name:        "sandbox_stats",
			Title:       "Resource usage of a sandbox session",
			Description: "Reports the CPU time, memory and processes a sandbox from sandbox_create uses now.",
			Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
		}, nil, s.stats)
	}
}

func (s *Server) snapshot(ctx context.Context, in snapshotInput) (snapshotOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return snapshotOutput{}, "", err
	}
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		return snapshotOutput{}, "", err
	}
	info, err := sn.Snapshot(ctx, se.info.SessionID, in.Name)
	if err != nil {
		return snapshotOutput{}, "", fmt.Errorf("snapshot %q: %w", in.Name, err)
	}
	s.mu.Lock()
	s.snapshots[info.Name] = true
	s.mu.Unlock()
	out := snapshotOutput{Name: info.Name, SessionID: info.SessionID, Files: info.Files, Bytes: info.Size, CreatedAt: info.CreatedAt.UTC().Format(time.RFC3339)}
	return out, fmt.Sprintf("Saved snapshot %q of session %s (%d files, %d bytes compressed). Start a session from it with sandbox_create from_snapshot %q.",
		out.Name, out.SessionID, out.Files, out.Bytes, out.Name), nil
}

// listSnapshots lists this server's snapshots (the store may hold other users'), as the backend
// describes them now.
func (s *Server) listSnapshots(ctx context.Context, _ struct{}) (snapshotsOutput, string, error) {
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		return snapshotsOutput{}, "", err
	}
	all, err := sn.ListSnapshots(ctx)
	if err != nil {
		return snapshotsOutput{}, "", fmt.Errorf("listing snapshots: %w", err)
	}
	s.mu.Lock()
	mine := maps.Clone(s.snapshots)
	s.mu.Unlock()
	out := snapshotsOutput{Snapshots: []snapshotOutput{}}
	for _, info := range all {
		if mine[info.Name] {
			out.Snapshots = append(out.Snapshots, snapshotOutput{Name: info.Name, SessionID: info.SessionID, Files: info.Files,
				Bytes: info.Size, CreatedAt: info.CreatedAt.UTC().Format(time.RFC3339)})
		}
	}
	slices.SortFunc(out.Snapshots, func(a, b snapshotOutput) int {
		return cmp.Or(-cmp.Compare(a.CreatedAt, b.CreatedAt), cmp.Compare(a.Name, b.Name))
	})
	if len(out.Snapshots) == 0 {
		return out, "No snapshots: take one with sandbox_snapshot.", nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d snapshot(s); start a session from one with sandbox_create from_snapshot:\n", len(out.Snapshots))
	for _, x := range out.Snapshots {
		fmt.Fprintf(&b, "%s  of session %s, %d files, %d bytes compressed, taken %s\n", x.Name, x.SessionID, x.Files, x.Bytes, x.CreatedAt)
	}
	return out, b.String(), nil
}

// snapshotDelete deletes one of this server's snapshots.
func (s *Server) snapshotDelete(ctx context.Context, in snapshotDeleteInput) (snapshotDeleteOutput, string, error) {
	s.mu.Lock()
	mine := s.snapshots[in.Name]
	s.mu.Unlock()
	if !mine {
		return snapshotDeleteOutput{}, "", fmt.Errorf("%w: no snapshot %q was taken with sandbox_snapshot on this server (sandbox_snapshots lists them)", sandbox.ErrNotFound, in.Name)
	}
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		return snapshotDeleteOutput{}, "", err
	}
	if err := sn.DeleteSnapshot(ctx, in.Name); err != nil {
		return snapshotDeleteOutput{}, "", fmt.Errorf("deleting snapshot %q: %w", in.Name, err)
	}
	s.mu.Lock()
	delete(s.snapshots, in.Name)
	s.mu.Unlock()
	return snapshotDeleteOutput{Name: in.Name, Deleted: true}, fmt.Sprintf("Deleted snapshot %q.", in.Name), nil
}

func (s *Server) fork(ctx context.Context, in forkInput) (forkOutput, string, error) {
	parent, err := s.lookup(in.SessionID)
	if err != nil {
		return forkOutput{}, "", err
	}
	n := in.Count
	switch {
	case n == 0:
		n = 1
	case n < 0:
		return forkOutput{}, "", fmt.Errorf("%w: count %d must be at least 1", sandbox.ErrInvalid, n)
	}
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		return forkOutput{}, "", err
	}
	// The slots are reserved before the (slow) fork, as sandbox_create does.
	s.mu.Lock()
	if live := len(s.sessions) + s.pending; live+n > s.opts.MaxSessions {
		s.mu.Unlock()
		return forkOutput{}, "", fmt.Errorf("%w: %d sandbox sessions are live and this server keeps at most %d: %d more do not fit; end some with sandbox_terminate first", sandbox.ErrRefused, live, s.opts.MaxSessions, n)
	}
	s.pending += n
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.pending -= n
		s.mu.Unlock()
	}()

	kids, err := sn.Fork(ctx, parent.info.SessionID, n)
	if err != nil {
		return forkOutput{}, "", fmt.Errorf("forking session %s: %w", parent.info.SessionID, err)
	}
	// The children hold their own copy of the files: the fork's snapshot is not kept.
	if name := kids[0].Spec.Image.Snapshot; name != "" {
		if err := sn.DeleteSnapshot(context.WithoutCancel(ctx), name); err != nil {
			s.log.Warn("deleting a fork's snapshot failed; it is deleted at shutdown", "snapshot", name, "err", err)
			s.mu.Lock()
			s.snapshots[name] = true
			s.mu.Unlock()
		}
	}
	out := forkOutput{Sandboxes: make([]sessionInfo, 0, n)}
	var adopted []*session
	var errs []error
	for _, k := range kids {
		se, err := s.adopt(ctx, k, parent.info)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		adopted = append(adopted, se)
		out.Sandboxes = append(out.Sandboxes, se.info)
	}
	if len(errs) > 0 {
		// All or none, as the backend's fork.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, se := range adopted {
			s.mu.Lock()
			delete(s.sessions, se.info.SessionID)
			s.mu.Unlock()
			if err := se.terminate(tctx, s.backend); err != nil {
				errs = append(errs, err)
			}
		}
		return forkOutput{}, "", fmt.Errorf("forking session %s: %w", parent.info.SessionID, errors.Join(errs...))
	}
	ids := make([]string, len(out.Sandboxes))
	for i, x := range out.Sandboxes {
		ids[i] = x.SessionID
	}
	s.log.Info("sandbox session forked", "session", parent.info.SessionID, "sessions", ids)
	return out, fmt.Sprintf("Forked session %s into %d new session(s): %s. Each has a copy of its files; use them with sandbox_exec and end each with sandbox_terminate.",
		parent.info.SessionID, len(ids), strings.Join(ids, ", ")), nil
}

// adopt connects to a sandbox the backend made for this server and registers it as a session
// like parent; on failure the sandbox is terminated.
func (s *Server) adopt(ctx context.Context, sess *sandbox.Session, parent sessionInfo) (*session, error) {
	cleanup := func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := s.backend.Terminate(tctx, sess.ID); err != nil {
			s.log.Error("terminating a sandbox that could not be registered failed", "session", sess.ID, "err", err)
		}
	}
	agent, err := s.backend.Connect(ctx, sess.ID)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("connecting to the sandbox %s: %w", sess.ID, err)
	}
	info := parent
	info.SessionID, info.SandboxID = sess.ID, sess.SandboxID
	info.CreatedAt = sess.CreatedAt.UTC().Format(time.RFC3339)
	if !sess.ExpiresAt.IsZero() {
		info.ExpiresAt = sess.ExpiresAt.UTC().Format(time.RFC3339)
	}
	se := &session{agent: agent, info: info}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		agent.Close()
		cleanup()
		return nil, errors.New("the airlock MCP server is shutting down")
	}
	s.sessions[sess.ID] = se
	s.mu.Unlock()
	return se, nil
}

func (s *Server) previewURL(ctx context.Context, in previewInput) (previewOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return previewOutput{}, "", err
	}
	switch {
	case in.Port < 1 || in.Port > 65535:
		return previewOutput{}, "", fmt.Errorf("%w: port %d: must be one of the session's preview_ports %v", sandbox.ErrInvalid, in.Port, se.info.PreviewPorts)
	case in.TTLSeconds < 0 || in.TTLSeconds > MaxPreviewTTLSeconds:
		return previewOutput{}, "", fmt.Errorf("%w: ttl_seconds %d: allowed is 1 to %d", sandbox.ErrInvalid, in.TTLSeconds, MaxPreviewTTLSeconds)
	}
	pv, err := sandbox.Feature[sandbox.Previewer](ctx, s.backend)
	if err != nil {
		return previewOutput{}, "", err
	}
	info, err := pv.Preview(ctx, se.info.SessionID, in.Port, time.Duration(in.TTLSeconds)*time.Second)
	if err != nil {
		if errors.Is(err, sandbox.ErrRefused) && len(se.info.PreviewPorts) == 0 {
			err = fmt.Errorf("%w (create the session with preview_ports to open a port)", err)
		}
		return previewOutput{}, "", fmt.Errorf("port %d: %w", in.Port, err)
	}
	out := previewOutput{SessionID: se.info.SessionID, Port: info.Port, URL: info.URL, ExpiresAt: info.ExpiresAt.UTC().Format(time.RFC3339)}
	return out, fmt.Sprintf("Port %d of session %s is at %s (works until %s).", out.Port, out.SessionID, out.URL, out.ExpiresAt), nil
}

func (s *Server) stats(ctx context.Context, in sessionInput) (statsOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return statsOutput{}, "", err
	}
	sr, err := sandbox.Feature[sandbox.StatsReader](ctx, s.backend)
	if err != nil {
		return statsOutput{}, "", err
	}
	st, err := sr.Stats(ctx, se.info.SessionID)
	if err != nil {
		return statsOutput{}, "", fmt.Errorf("stats of session %s: %w", se.info.SessionID, err)
	}
	out := statsOutput{SessionID: se.info.SessionID, CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes, MemoryPeakBytes: st.MemoryPeakBytes, Processes: st.Processes}
	text := fmt.Sprintf("Session %s: cpu %ss, memory %d bytes", out.SessionID, strconv.FormatFloat(out.CPUSeconds, 'f', 3, 64), out.MemoryBytes)
	if out.MemoryPeakBytes > 0 {
		text += fmt.Sprintf(" (peak %d)", out.MemoryPeakBytes)
	}
	if out.Processes > 0 {
		text += fmt.Sprintf(", %d processes", out.Processes)
	}
	return out, text + ".", nil
}

// deleteSnapshots deletes the snapshots taken through this server (at Close).
func (s *Server) deleteSnapshots(ctx context.Context) []error {
	s.mu.Lock()
	names := make([]string, 0, len(s.snapshots))
	for n := range s.snapshots {
		names = append(names, n)
	}
	s.snapshots = map[string]bool{}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, n := range names {
		if err := sn.DeleteSnapshot(ctx, n); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			errs = append(errs, fmt.Errorf("deleting snapshot %q: %w", n, err))
		}
	}
	return errs
}
