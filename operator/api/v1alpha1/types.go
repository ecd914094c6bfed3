// Package v1alpha1 is the airlock.dev/v1alpha1 Kubernetes API: the Sandbox resource and its pool.
// +kubebuilder:object:generate=false
// +groupName=airlock.dev
package v1alpha1

// The CRD (deploy/helm/airlock/crds, deploy/base) is generated from these types and the markers
// here and in package spec by controller-gen: go test ./deploy -run TestCRD -update.

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/airlock-sandbox/airlock/spec"
)

// Group and version of the API; Resource is the plural the broker authorises "claim" on.
const (
	Group    = "airlock.dev"
	Version  = "v1alpha1"
	Resource = "sandboxes"
	Kind     = "Sandbox"
)

// GroupVersion is airlock.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// AddToScheme registers Sandbox and SandboxList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Sandbox{}, &SandboxList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=sbx,categories=airlock
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Pool",type=integer,JSONPath=`.spec.poolSize`
// +kubebuilder:printcolumn:name="Idle",type=integer,JSONPath=`.status.idle`
// +kubebuilder:printcolumn:name="Claimed",type=integer,JSONPath=`.status.claimed`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image.ref`,priority=1
// +kubebuilder:printcolumn:name="Egress",type=string,JSONPath=`.spec.egress.mode`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(self.spec.id) || self.spec.id == '' || self.spec.id == self.metadata.name",message="spec.id must equal metadata.name (or be left out: a Go client writes it empty)"

// Sandbox is a sandbox declaration the operator keeps a pool of ready pods for; each pod is one
// session, claimed through the broker.
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SandboxSpec `json:"spec"`
	// +optional
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is the airlock declaration (spec.Sandbox, inline: image, limits, egress, session,
// env, workdir, runtime, labels) plus the pool size. Its id is the object's name: an id field, if
// written, must equal the name.
type SandboxSpec struct {
	spec.Sandbox `json:",inline"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000

	// PoolSize is how many idle, ready pods the operator keeps for claims (0 to 1000).
	PoolSize int32 `json:"poolSize"`
}

// Condition types.
const (
	// ConditionReady is true when the declaration is accepted and at least one idle pod is ready.
	ConditionReady = "Ready"
	// ConditionAccepted is false, with a reason below, when the declaration cannot run here.
	ConditionAccepted = "Accepted"
)

// Condition reasons: stable, documented in docs/kubernetes.md; tests and tooling match on them.
const (
	ReasonAccepted           = "Accepted"
	ReasonInvalidDeclaration = "InvalidDeclaration"
	ReasonUnsupported        = "Unsupported"         // a declared property the operator cannot enforce
	ReasonRuntimeClassAbsent = "RuntimeClassMissing" // runtime gvisor declared, no RuntimeClass gvisor
	ReasonKeysUnavailable    = "KeysUnavailable"     // the master Secret is missing or too short
	ReasonPoolReady          = "PoolReady"
	ReasonPoolFilling        = "PoolFilling"
	ReasonPoolEmpty          = "PoolEmpty" // poolSize 0
)

// SandboxStatus is what the operator observed at ObservedGeneration.
type SandboxStatus struct {
	// ObservedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Idle counts ready, unclaimed pods.
	// +optional
	Idle int32 `json:"idle"`
	// Starting counts unclaimed pods not ready yet.
	// +optional
	Starting int32 `json:"starting"`
	// Claimed counts pods bound to a session.
	// +optional
	Claimed int32 `json:"claimed"`
	// Conditions: Accepted (reason Accepted, or False with InvalidDeclaration, Unsupported,
	// RuntimeClassMissing or KeysUnavailable) and Ready (PoolReady; False with PoolFilling,
	// PoolEmpty or the Accepted reason). The reasons are stable and documented in
	// docs/kubernetes.md; the message names the field, the value and what is allowed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxList is a list of Sandbox.
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// Declaration returns the airlock declaration with its id set from the object's name when empty.
func (s *Sandbox) Declaration() spec.Sandbox {
	d := deepCopyDecl(s.Spec.Sandbox)
	if d.ID == "" {
		d.ID = s.Name
	}
	return d
}
