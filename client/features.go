package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
)

// Optional features: each fails with sandbox.ErrUnsupported (errors.Is) where the daemon's
// platform does not have it, the message naming the capability.

// Preview exposes one of the sandbox's declared previewPorts behind an authenticated URL and
// returns it with a preview token valid for ttl (0: the daemon's default; rounded up to whole
// seconds). A port not declared is sandbox.ErrRefused. On the local runtime the URL is on the
// daemon host's loopback.
func (sb *Sandbox) Preview(ctx context.Context, port int, ttl time.Duration) (sandbox.PreviewInfo, error) {
	req := api.PreviewRequest{Port: port}
	if ttl != 0 {
		req.TTLSeconds = int64((ttl + time.Second - 1) / time.Second)
	}
	var p sandbox.PreviewInfo
	err := sb.c.doJSON(ctx, http.MethodPost, sb.path("/previews"), nil, req, &p, true)
	return p, err
}

// Snapshot captures the sandbox's files as the snapshot name (1 to 64 letters, digits, '_'
// and '-'; sandbox.ErrConflict when taken). A new sandbox starts from it with
// spec.Image{Snapshot: name}.
func (sb *Sandbox) Snapshot(ctx context.Context, name string) (sandbox.SnapshotInfo, error) {
	var s sandbox.SnapshotInfo
	err := sb.c.doJSON(ctx, http.MethodPost, sb.path("/snapshots"), nil, api.SnapshotRequest{Name: name}, &s, true)
	return s, err
}

// Fork starts n new sandboxes from a snapshot of this one's files, all or none; each has the
// files and the declaration, and none of the processes.
func (sb *Sandbox) Fork(ctx context.Context, n int) ([]*Sandbox, error) {
	var out api.SandboxList
	if err := sb.c.doJSON(ctx, http.MethodPost, sb.path("/fork"), nil, api.ForkRequest{Count: n}, &out, true); err != nil {
		return nil, err
	}
	sbs := make([]*Sandbox, len(out.Sandboxes))
	for i, s := range out.Sandboxes {
		sbs[i] = &Sandbox{c: sb.c, Session: *s}
	}
	return sbs, nil
}

// Snapshots lists the daemon's snapshots, oldest first.
func (c *Client) Snapshots(ctx context.Context) ([]sandbox.SnapshotInfo, error) {
	var out api.SnapshotList
	err := c.doJSON(ctx, http.MethodGet, api.Version+"/snapshots", nil, nil, &out, false)
	return out.Snapshots, err
}

// DeleteSnapshot removes a snapshot (sandbox.ErrNotFound when there is none); sandboxes made
// from it keep running.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, api.Version+"/snapshots/"+url.PathEscape(name), nil, nil, nil, true)
}
