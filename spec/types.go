// Package spec defines the Sandbox declaration and the Stack that holds sandboxes and their hosts.
package spec

// APIVersion is the version string every Stack file carries.
const APIVersion = "airlock.dev/v1alpha1"

// Stack is one file: the sandboxes to create and the workloads that host or link them.
type Stack struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind,omitempty"` // "Stack"
	Sandboxes  []Sandbox  `json:"sandboxes"`
	Workloads  []Workload `json:"workloads,omitempty"`
}

// Workload is a non-sandbox unit of a stack (an app or service) that can host sandboxes;
// a GCP sandbox must name one in Sandbox.HostedBy.
type Workload struct {
	ID    string `json:"id"`
	Image string `json:"image,omitempty"`
	// Hosts lists the ids of sandboxes this workload hosts or links to.
	Hosts []string `json:"hosts,omitempty"`
}

// Sandbox is the declaration of one sandbox.
type Sandbox struct {
	// ID names the sandbox: [A-Za-z0-9_-], 1 to 64 characters; immutable on update.
	ID      string            `json:"id"`
	Image   Image             `json:"image"`
	Limits  Limits            `json:"limits,omitempty"`
	Egress  Egress            `json:"egress,omitempty"`
	Session Session           `json:"session,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// PreviewPorts are sandbox ports that may be exposed through the preview proxy.
	PreviewPorts []int             `json:"previewPorts,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	Workdir      string            `json:"workdir,omitempty"`
	// Runtime selects the isolation engine: native (default), gvisor, docker.
	Runtime Runtime `json:"runtime,omitempty"`
	// HostedBy names the Workload that hosts this sandbox (required on gcp).
	HostedBy string `json:"hostedBy,omitempty"`
}

// Image is where the root filesystem comes from. Exactly one of its fields is set;
// a bare string in YAML/JSON ("host", "python:3.12", "./rootfs") is accepted and classified.
type Image struct {
	// Host is a read-only minimal root assembled from the host's own /usr, /lib and /bin.
	Host bool `json:"host,omitempty"`
	// Ref is an OCI reference pulled from a registry, e.g. "docker.io/library/python:3.12".
	Ref string `json:"ref,omitempty"`
	// OCILayout is a path to an OCI image layout directory.
	OCILayout string `json:"ociLayout,omitempty"`
	// Tarball is a path to a docker-archive or OCI tarball.
	Tarball string `json:"tarball,omitempty"`
	// Dir is a path to a directory used as the root filesystem.
	Dir string `json:"dir,omitempty"`
	// Snapshot names a snapshot taken from another sandbox.
	Snapshot string `json:"snapshot,omitempty"`
}

// Limits are the resource ceilings. CPU, Memory and Disk are Kubernetes quantities kept as
// written, so that every malformed one is reported by validation rather than the first by
// the decoder.
type Limits struct {
	CPU          Quantity `json:"cpu,omitempty"`
	Memory       Quantity `json:"memory,omitempty"`
	Disk         Quantity `json:"disk,omitempty"`
	MaxProcesses *int64   `json:"maxProcesses,omitempty"`
}

// Quantity is a Kubernetes quantity string ("500m", "512Mi", "1"); a bare JSON number is
// accepted too.
type Quantity string

// EgressMode is the network policy for connections the sandbox starts.
type EgressMode string

const (
	EgressDeny         EgressMode = "deny"
	EgressAllow        EgressMode = "allow" // public internet only
	EgressAllowDomains EgressMode = "allowDomains"
)

// Egress is tagged by Mode; Domains is only valid with allowDomains.
type Egress struct {
	Mode EgressMode `json:"mode,omitempty"`
	// Domains are exact names ("api.example.com") or wildcards ("*.example.com").
	Domains []string `json:"domains,omitempty"`
}

// Session bounds how long a sandbox lives.
type Session struct {
	MaxLifetimeSeconds *int64 `json:"maxLifetimeSeconds,omitempty"`
	IdleTimeoutSeconds *int64 `json:"idleTimeoutSeconds,omitempty"`
	// Reconnect allows a caller to reattach to the session by id after disconnecting.
	Reconnect *bool `json:"reconnect,omitempty"`
}

// Runtime is the isolation engine.
type Runtime string

const (
	RuntimeNative Runtime = "native"
	RuntimeGVisor Runtime = "gvisor"
	RuntimeDocker Runtime = "docker"
)
