// Package capability names what a platform can enforce and publishes each platform's set.
package capability

// Name is a capability as it appears on the wire.
type Name string

// Every declaration property maps to one of these. The floor (create, exec, terminate) is
// not a capability: every backend must provide it.
const (
	Files               Name = "files"
	Reconnect           Name = "reconnect"
	Preview             Name = "preview"
	SuspendResume       Name = "suspendResume"
	Snapshot            Name = "snapshot"
	Stats               Name = "stats"      // resource usage of a running sandbox
	LiveEgress          Name = "liveEgress" // egress policy replaced while the sandbox runs
	DomainEgressRules   Name = "domainEgressRules"
	EgressDeny          Name = "egressDeny"
	PublicOnlyEgress    Name = "publicOnlyEgress"
	EnforcedLimits      Name = "enforcedLimits" // cpu and memory ceilings
	ProcessLimit        Name = "processLimit"
	DiskLimit           Name = "diskLimit"
	SessionLifetime     Name = "sessionLifetime"
	IdleTimeout         Name = "idleTimeout"
	Env                 Name = "env"
	Stdin               Name = "stdin"
	PTY                 Name = "pty"
	BackgroundProcesses Name = "backgroundProcesses"
	GVisor              Name = "gvisor"
	Labels              Name = "labels"
	Workdir             Name = "workdir"
	ImageHost           Name = "imageHost"
	ImageOCI            Name = "imageOCI" // a local OCI image layout or tarball
	ImageRef            Name = "imageRef" // an OCI reference pulled from a registry
	ImageDir            Name = "imageDir"
	DockerRuntime       Name = "dockerRuntime"
)

// Names lists every capability in the order sets are printed.
var Names = []Name{
	Files, Reconnect, Preview, SuspendResume, Snapshot, Stats, LiveEgress,
	DomainEgressRules, EgressDeny, PublicOnlyEgress,
	EnforcedLimits, ProcessLimit, DiskLimit,
	SessionLifetime, IdleTimeout,
	Env, Stdin, PTY, BackgroundProcesses,
	GVisor, Labels, Workdir,
	ImageHost, ImageOCI, ImageRef, ImageDir, DockerRuntime,
}

// Platform is a target a stack can be planned against.
type Platform string

const (
	Local      Platform = "local"
	Docker     Platform = "docker"
	Kubernetes Platform = "kubernetes"
	AWS        Platform = "aws"
	Azure      Platform = "azure"
	GCP        Platform = "gcp"
)

// Platforms lists every platform a stack can be planned against.
var Platforms = []Platform{Local, Docker, Kubernetes, AWS, Azure, GCP}
