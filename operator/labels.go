// Package operator is airlock on Kubernetes: the Sandbox pool controller and the session broker.
package operator

// Pod labels and annotations. Pod labels are the source of truth for sessions: the broker keeps
// no state of its own, so a restarted broker finds every session again.
const (
	LabelSandbox   = "airlock.dev/sandbox"
	LabelSession   = "airlock.dev/session"
	LabelState     = "airlock.dev/state"
	LabelTemplate  = "airlock.dev/template" // hash of what the pod was built from
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "airlock-operator"

	StateIdle    = "idle"
	StateClaimed = "claimed"

	// LabelCodeUID is the uid (and gid) the pod's code runs as, unique among existing pods
	// (CodeUIDs): the process limit is counted per uid per node.
	LabelCodeUID = "airlock.dev/code-uid"

	AnnotationAgentConfig = "airlock.dev/agent-config"
	AnnotationGeneration  = "airlock.dev/generation"
	AnnotationOwner       = "airlock.dev/owner"
	AnnotationClaimedAt   = "airlock.dev/claimed-at"
	AnnotationExpiresAt   = "airlock.dev/expires-at"

	// LabelClient marks application pods allowed through a sandbox's NetworkPolicy to its agent.
	LabelClient = "airlock.dev/client"
)

// Fixed layout of a sandbox pod.
const (
	ContainerName     = "sandbox"
	InitContainerName = "airlock-agent-install"
	AgentDir          = "/airlock" // emptyDir: the agent binary, read-only for the sandbox
	AgentBinary       = AgentDir + "/airlock-agent"
	ConfigDir         = "/airlock-config" // downward API: the agent config from the annotation
	ConfigFile        = ConfigDir + "/config.json"
	// ScratchVolume is the sandbox's only writable place: a memory-backed emptyDir of
	// limits.disk, mounted at the workdir and /tmp (subPaths workdir and tmp).
	ScratchVolume     = "scratch"
	ImageAgentPath    = "/airlock-agent"    // where the airlock image holds the lean agent
	ImageOperatorPath = "/airlock-operator" // and this binary (it copies the agent)
	DefaultAgentPort  = 7070
	// InstallUID runs the init container that copies the agent.
	InstallUID = 65532
	// allowDomains pods (addEgressProxy): the init container that sets the pod's nftables,
	// the egress sidecar, the uid it runs as (the only one whose traffic is not redirected;
	// outside every code uid range) and its loopback ports.
	EgressInitName      = "airlock-egress-init"
	EgressContainerName = "airlock-egress"
	EgressProxyUID      = 65530
	EgressProxyPort     = 15001
	EgressDNSPort       = 15053
)
