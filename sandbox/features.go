package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/spec"
)

// Optional features. A backend implements one of these interfaces only where its capability
// set says the matching capability is supported; callers find them with Feature, never by
// asserting a concrete backend's type.

// Pauser is the suspendResume capability: freeze every process of a sandbox and thaw it.
type Pauser interface {
	Pause(ctx context.Context, sessionID string) error
	Resume(ctx context.Context, sessionID string) error
}

// StatsReader is the stats capability: a sandbox's resource usage as the platform counts it.
type StatsReader interface {
	Stats(ctx context.Context, sessionID string) (Stats, error)
}

// EgressSetter is the liveEgress capability: replace a running sandbox's egress policy. The
// new policy holds for connections opened after the call returns.
type EgressSetter interface {
	SetEgress(ctx context.Context, sessionID string, e spec.Egress) error
}

// Previewer is the preview capability: expose a port the declaration lists in previewPorts
// behind an authenticated URL.
type Previewer interface {
	// Preview returns the URL of the session's port and a credential valid for ttl (0: the
	// backend's default; capped at the session's end).
	Preview(ctx context.Context, sessionID string, port int, ttl time.Duration) (PreviewInfo, error)
}

// Snapshotter is the snapshot capability: capture a sandbox's files as a named snapshot a
// new sandbox can start from (image.snapshot), and fork running copies of a sandbox.
type Snapshotter interface {
	Snapshot(ctx context.Context, sessionID, name string) (SnapshotInfo, error)
	ListSnapshots(ctx context.Context) ([]SnapshotInfo, error)
	DeleteSnapshot(ctx context.Context, name string) error
	// Fork snapshots the session and starts n new sandboxes from it.
	Fork(ctx context.Context, sessionID string, n int) ([]*Session, error)
}

// PreviewInfo is an exposed port.
type PreviewInfo struct {
	// URL opens the preview in a browser: the address plus the token as a query parameter.
	URL string `json:"url"`
	// Addr is the proxy's host:port for this session and port.
	Addr      string    `json:"addr"`
	Port      int       `json:"port"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// SnapshotInfo describes a stored snapshot.
type SnapshotInfo struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	// SessionID and SandboxID name the sandbox it was taken from.
	SessionID string `json:"sessionId,omitempty"`
	SandboxID string `json:"sandboxId,omitempty"`
	// Base is what the snapshot's files sit on: "host", "dir" or "image".
	Base string `json:"base"`
	// Digest is the snapshot image's manifest digest, Size its compressed size in bytes, Files
	// the number of files it holds.
	Digest string `json:"digest,omitempty"`
	Size   int64  `json:"size"`
	Files  int    `json:"files"`
}

// featureCapability is the capability each optional interface stands for.
var featureCapability = map[string]capability.Name{
	"sandbox.Pauser":       capability.SuspendResume,
	"sandbox.StatsReader":  capability.Stats,
	"sandbox.EgressSetter": capability.LiveEgress,
	"sandbox.Previewer":    capability.Preview,
	"sandbox.Snapshotter":  capability.Snapshot,
}

// Feature returns b as the optional interface T when b implements it and its capability set
// supports the matching capability; otherwise an error wrapping ErrUnsupported that names the
// capability and the platform's reason.
func Feature[T any](ctx context.Context, b Backend) (T, error) {
	var zero T
	name := fmt.Sprintf("%T", (*T)(nil))[1:]
	capName, ok := featureCapability[name]
	if !ok {
		return zero, fmt.Errorf("%w: %s is not an optional feature of sandbox.Backend", ErrInvalid, name)
	}
	f, impl := b.(T)
	st := b.Capabilities(ctx).Entries[capName]
	switch {
	case impl && st.Supported:
		return f, nil
	case st.Reason != "":
		return zero, fmt.Errorf("%w: %s on %s: %s", ErrUnsupported, capName, b.Platform(), st.Reason)
	default:
		return zero, fmt.Errorf("%w: %s on %s", ErrUnsupported, capName, b.Platform())
	}
}
