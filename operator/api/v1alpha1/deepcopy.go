package v1alpha1

import (
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/airlock-sandbox/airlock/spec"
)

// Hand-written: controller-gen cannot generate a deep copy of the embedded spec.Sandbox (it
// lives outside this package and has no DeepCopyInto). TestDeepCopyIsDeep walks every field by
// reflection so a field added to spec.Sandbox that this copy misses fails the test.

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func deepCopyDecl(in spec.Sandbox) spec.Sandbox {
	out := in
	out.Limits.MaxProcesses = clonePtr(in.Limits.MaxProcesses)
	out.Egress.Domains = slices.Clone(in.Egress.Domains)
	out.Session.MaxLifetimeSeconds = clonePtr(in.Session.MaxLifetimeSeconds)
	out.Session.IdleTimeoutSeconds = clonePtr(in.Session.IdleTimeoutSeconds)
	out.Session.Reconnect = clonePtr(in.Session.Reconnect)
	out.Labels = maps.Clone(in.Labels)
	out.PreviewPorts = slices.Clone(in.PreviewPorts)
	out.Env = maps.Clone(in.Env)
	return out
}

// DeepCopyInto copies in into out.
func (in *SandboxSpec) DeepCopyInto(out *SandboxSpec) {
	*out = *in
	out.Sandbox = deepCopyDecl(in.Sandbox)
}

// DeepCopyInto copies in into out.
func (in *SandboxStatus) DeepCopyInto(out *SandboxStatus) {
	*out = *in
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
}

// DeepCopyInto copies in into out.
func (in *Sandbox) DeepCopyInto(out *Sandbox) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a deep copy.
func (in *Sandbox) DeepCopy() *Sandbox {
	if in == nil {
		return nil
	}
	out := new(Sandbox)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *Sandbox) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopyInto copies in into out.
func (in *SandboxList) DeepCopyInto(out *SandboxList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Sandbox, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy.
func (in *SandboxList) DeepCopy() *SandboxList {
	if in == nil {
		return nil
	}
	out := new(SandboxList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *SandboxList) DeepCopyObject() runtime.Object { return in.DeepCopy() }
