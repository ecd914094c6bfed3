// Package spec defines the Sandbox declaration and the Stack that holds sandboxes and their hosts.
package spec

// APIVersion is the version string every Stack file carries.
const APIVersion = "airlock.dev/v1alpha1"

// StackKind is the only accepted value of Stack.Kind (which may also be left empty).
const StackKind = "Stack"

// Stack is one file: the sandboxes to create and the workloads that host or link them.
type Stack struct {
	// APIVersion must be "airlock.dev/v1alpha1".
	APIVersion string `json:"apiVersion"`
	// Kind is "Stack" or empty.
	Kind string `json:"kind,omitempty"`
	// Sandboxes are the sandboxes to create; at least one, ids unique within the stack.
	Sandboxes []Sandbox `json:"sandboxes"`
	// Workloads are the apps or services that host sandboxes; ids unique among workloads.
	Workloads []Workload `json:"workloads,omitempty"`
}

// Workload is a non-sandbox unit of a stack (an app or service) that can host sandboxes;
// a GCP sandbox must name one in Sandbox.HostedBy.
type Workload struct {
	// ID names the workload: [A-Za-z0-9_-], 1 to 64 characters, unique among the workloads.
	ID string `json:"id"`
	// Image is the workload's own container image; informational to airlock.
	Image string `json:"image,omitempty"`
	// Hosts lists the ids of sandboxes this workload hosts or links to; each must exist in the stack.
	Hosts []string `json:"hosts,omitempty"`
}

// Sandbox is the declaration of one sandbox.
type Sandbox struct {
	// +optional
	// +kubebuilder:validation:Pattern=`^([A-Za-z0-9_-]{1,64})?$`

	// ID names the sandbox: [A-Za-z0-9_-], 1 to 64 characters; immutable on update.
	ID string `json:"id"`
	// Image is where the root filesystem comes from (required): "host", an OCI reference,
	// "./dir" or "/abs/dir", "x.tar" or "x.tar.gz", "oci:path", or the object form with exactly one field.
	Image Image `json:"image"`
	// +kubebuilder:default={}

	// Limits are the resource ceilings.
	Limits Limits `json:"limits,omitempty"`
	// +kubebuilder:default={}

	// Egress is the policy for network connections the sandbox starts (default deny).
	Egress Egress `json:"egress,omitempty"`
	// +kubebuilder:default={}

	// Session bounds how long the sandbox lives.
	Session Session `json:"session,omitempty"`
	// Labels are Kubernetes-style labels: keys are qualified names, values at most 63 characters.
	Labels map[string]string `json:"labels,omitempty"`
	// +listType=set
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535

	// PreviewPorts are sandbox ports that may be exposed through the preview proxy: 1-65535, no duplicates.
	PreviewPorts []int `json:"previewPorts,omitempty"`
	// Env is the environment of every process started in the sandbox: names [A-Za-z_][A-Za-z0-9_]*, values without NUL.
	Env map[string]string `json:"env,omitempty"`
	// +kubebuilder:default=/workspace
	// +kubebuilder:validation:Pattern=`^/`

	// Workdir is the working directory of processes: an absolute, clean path (default /workspace).
	Workdir string `json:"workdir,omitempty"`
	// +kubebuilder:default=native

	// Runtime selects the isolation engine: native (default), gvisor, docker.
	Runtime Runtime `json:"runtime,omitempty"`
	// HostedBy names the Workload that hosts this sandbox (required on gcp).
	HostedBy string `json:"hostedBy,omitempty"`
}

// +kubebuilder:validation:XValidation:rule="[has(self.host) && self.host, has(self.ref), has(self.ociLayout), has(self.tarball), has(self.dir), has(self.snapshot)].filter(x, x).size() == 1",message="an image has exactly one source: one of host, ref, ociLayout, tarball, dir, snapshot"

// Image is where the root filesystem comes from. Exactly one of its fields is set;
// a bare string in YAML/JSON ("host", "python:3.12", "./rootfs") is accepted and classified
// by ImageFromString. It always marshals to the object form.
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
	// +kubebuilder:default="1"

	// CPU is in cores, a whole number of millicores: "250m", "0.5", "2" (default "1").
	CPU Quantity `json:"cpu,omitempty"`

	// +kubebuilder:default="512Mi"

	// Memory is in bytes: "512Mi", "2Gi" (default "512Mi", minimum 1Mi).
	Memory Quantity `json:"memory,omitempty"`

	// +kubebuilder:default="1Gi"

	// Disk is the writable scratch space in bytes: "1Gi" (default "1Gi", minimum 1Mi).
	Disk Quantity `json:"disk,omitempty"`

	// +kubebuilder:default=256
	// +kubebuilder:validation:Minimum=1

	// MaxProcesses caps the number of processes and threads, at least 1 (default 256).
	MaxProcesses *int64 `json:"maxProcesses,omitempty"`
}

// +kubebuilder:validation:XIntOrString
// +kubebuilder:validation:Type=""
// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$`
// +kubebuilder:validation:MaxLength=64

// Quantity is a Kubernetes quantity string ("500m", "512Mi", "1"); a bare JSON number is
// accepted too.
type Quantity string

// +kubebuilder:validation:Enum=deny;allow;allowDomains;open

// EgressMode is the network policy for connections the sandbox starts.
type EgressMode string

const (
	EgressDeny         EgressMode = "deny"
	EgressAllow        EgressMode = "allow" // public internet only
	EgressAllowDomains EgressMode = "allowDomains"
	// EgressOpen asks for no restriction at all: private, link-local and metadata addresses
	// included. Never the default; every platform can honour it.
	EgressOpen EgressMode = "open"
)

// EgressModes lists every accepted egress mode, in documentation order.
var EgressModes = []EgressMode{EgressDeny, EgressAllow, EgressAllowDomains, EgressOpen}

// +kubebuilder:validation:XValidation:rule="!has(self.domains) || size(self.domains) == 0 || (has(self.mode) && self.mode == 'allowDomains')",message="egress.domains are only allowed with mode allowDomains"
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'allowDomains' || (has(self.domains) && size(self.domains) > 0)",message="egress mode allowDomains needs at least one domain"

// Egress is tagged by Mode; Domains is only valid with allowDomains.
type Egress struct {
	// +kubebuilder:default=deny

	// Mode is deny (default: no connections), allow (public internet only: never private,
	// loopback, link-local or metadata addresses), allowDomains, or open (no restriction at all;
	// never the default).
	Mode EgressMode `json:"mode,omitempty"`
	// Domains are exact names ("api.example.com") or wildcards ("*.example.com", which matches
	// names below example.com but not example.com itself); only with mode allowDomains, IP literals refused.
	Domains []string `json:"domains,omitempty"`
}

// +kubebuilder:validation:XValidation:rule="!has(self.idleTimeoutSeconds) || !has(self.maxLifetimeSeconds) || self.idleTimeoutSeconds <= self.maxLifetimeSeconds",message="session.idleTimeoutSeconds must be at most session.maxLifetimeSeconds"

// Session bounds how long a sandbox lives.
type Session struct {
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=1

	// MaxLifetimeSeconds is the hard upper bound on the sandbox's life, at least 1 (default 3600).
	MaxLifetimeSeconds *int64 `json:"maxLifetimeSeconds,omitempty"`
	// +kubebuilder:validation:Minimum=1

	// IdleTimeoutSeconds ends the sandbox after this long without activity, at least 1 and at most
	// the lifetime (default 600, or the lifetime when that is shorter).
	IdleTimeoutSeconds *int64 `json:"idleTimeoutSeconds,omitempty"`
	// +kubebuilder:default=true

	// Reconnect allows a caller to reattach to the session by id after disconnecting (default true).
	Reconnect *bool `json:"reconnect,omitempty"`
}

// +kubebuilder:validation:Enum=native;gvisor;docker

// Runtime is the isolation engine.
type Runtime string

const (
	RuntimeNative Runtime = "native"
	RuntimeGVisor Runtime = "gvisor"
	RuntimeDocker Runtime = "docker"
)

// Runtimes lists every accepted runtime, in documentation order.
var Runtimes = []Runtime{RuntimeNative, RuntimeGVisor, RuntimeDocker}
