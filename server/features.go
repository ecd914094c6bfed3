package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
)

// Optional features (sandbox/features.go): each handler finds its feature with
// sandbox.Feature, so a backend without it, or whose capability set says no, answers 501
// naming the capability and the platform's reason.

// maxPort is the highest TCP port.
const maxPort = 65535

// delegatedPreviewTTL is a delegated caller's default preview lifetime (the documented default,
// which the caller's token may shorten).
const delegatedPreviewTTL = time.Hour

// preview exposes one of the sandbox's declared previewPorts behind an authenticated URL.
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	ctx, id := r.Context(), r.PathValue("id")
	pv, err := sandbox.Feature[sandbox.Previewer](ctx, s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.PreviewRequest
	if err := s.readJSON(r, &req, "preview request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Port < 1 || req.Port > maxPort {
		s.writeError(w, r, fmt.Errorf("%w: port %d: allowed is 1..%d, one of the sandbox's previewPorts", sandbox.ErrInvalid, req.Port, maxPort))
		return
	}
	if req.TTLSeconds < 0 {
		s.writeError(w, r, fmt.Errorf("%w: ttlSeconds %d: must be positive (0 means the default)", sandbox.ErrInvalid, req.TTLSeconds))
		return
	}
	// Above any backend's maximum, and small enough not to overflow a Duration.
	if req.TTLSeconds > int64(366*24*time.Hour/time.Second) {
		s.writeError(w, r, fmt.Errorf("%w: ttlSeconds %d: over a year (the backend caps it lower: a day on the local runtime)", sandbox.ErrInvalid, req.TTLSeconds))
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	// A delegated caller's preview ends with its token: a preview token must not outlive the
	// credential that asked for it.
	if p := principalOf(ctx); p.delegated() {
		left := time.Until(time.Unix(p.claims.Expiry, 0)).Truncate(time.Second)
		switch {
		case left < time.Second:
			s.writeError(w, r, forbidden("expired", "the token expires in under a second"))
			return
		case ttl > left:
			s.writeError(w, r, fmt.Errorf("%w: ttlSeconds %d: a delegated token may ask for at most its own remaining %d", sandbox.ErrInvalid, req.TTLSeconds, int64(left/time.Second)))
			return
		case ttl == 0:
			ttl = min(left, delegatedPreviewTTL)
		}
	}
	info, err := pv.Preview(ctx, id, req.Port, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The token is a credential: it is answered, never logged.
	stateOf(ctx).log.Info("preview exposed", "session", id, "port", info.Port, "addr", info.Addr, "expires", info.ExpiresAt)
	writeJSON(w, http.StatusCreated, info)
}

// snapshot captures the sandbox's files as a named snapshot.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	ctx, id := r.Context(), r.PathValue("id")
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.SnapshotRequest
	if err := s.readJSON(r, &req, "snapshot request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	info, err := sn.Snapshot(ctx, id, req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(ctx).log.Info("snapshot taken", "session", id, "snapshot", info.Name, "files", info.Files, "bytes", info.Size, "duration", time.Since(start))
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	sn, err := sandbox.Feature[sandbox.Snapshotter](r.Context(), s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := sn.ListSnapshots(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.SnapshotList{Snapshots: list}
	if out.Snapshots == nil {
		out.Snapshots = []api.Snapshot{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	ctx, name := r.Context(), r.PathValue("name")
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := sn.DeleteSnapshot(ctx, name); err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(ctx).log.Info("snapshot deleted", "snapshot", name)
	w.WriteHeader(http.StatusNoContent)
}

// fork starts count new sandboxes from the sandbox's files (all or none).
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	ctx, id := r.Context(), r.PathValue("id")
	sn, err := sandbox.Feature[sandbox.Snapshotter](ctx, s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.ForkRequest
	if err := s.readJSON(r, &req, "fork request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Count < 1 {
		s.writeError(w, r, fmt.Errorf("%w: count %d: at least 1", sandbox.ErrInvalid, req.Count))
		return
	}
	start := time.Now()
	kids, err := sn.Fork(ctx, id, req.Count)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ids := make([]string, len(kids))
	for i, k := range kids {
		ids[i] = k.ID
	}
	stateOf(ctx).log.Info("sandbox forked", "session", id, "sessions", ids, "duration", time.Since(start))
	writeJSON(w, http.StatusCreated, api.SandboxList{Sandboxes: kids})
}
