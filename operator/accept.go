package operator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// RefusalError is a declaration the operator will not run, with the condition reason it reports.
type RefusalError struct {
	Reason string // a v1alpha1.Reason* constant
	Err    error
}

func (e *RefusalError) Error() string { return e.Err.Error() }
func (e *RefusalError) Unwrap() error { return e.Err }

// Accept validates sb's declaration and refuses what a pod cannot enforce, naming the field,
// the value and what is allowed. It returns the declaration with defaults applied, and judges
// the defaulted values too: a default the pod cannot hold is refused like a declared one.
func Accept(sb *v1alpha1.Sandbox) (spec.Sandbox, error) {
	written := sb.Spec.Sandbox
	d := sb.Declaration()
	if written.ID != "" && written.ID != sb.Name {
		return d, &RefusalError{v1alpha1.ReasonInvalidDeclaration, fmt.Errorf("%w: spec.id %q must equal metadata.name %q (or be left out)", sandbox.ErrInvalid, written.ID, sb.Name)}
	}
	if sb.Spec.PoolSize < 0 || sb.Spec.PoolSize > MaxPoolSize {
		return d, &RefusalError{v1alpha1.ReasonInvalidDeclaration, fmt.Errorf("%w: spec.poolSize %d is outside 0..%d", sandbox.ErrInvalid, sb.Spec.PoolSize, MaxPoolSize)}
	}
	d.ApplyDefaults()
	if fes := d.Validate("spec"); len(fes) > 0 {
		errs := make([]error, len(fes))
		for i, fe := range fes {
			errs[i] = fe
		}
		return d, &RefusalError{v1alpha1.ReasonInvalidDeclaration, errors.Join(errs...)}
	}
	var bad []string
	refuse := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	if written.Image.Kind() != spec.ImageRef {
		refuse("spec.image %s: a pod runs an image reference the cluster can pull (image.ref); %s is not reachable from a node", d.Image, d.Image.Kind())
	}
	switch d.Runtime {
	case spec.RuntimeNative:
	case spec.RuntimeGVisor:
		// Every declaration has a process limit (default 256), held in a pod by RLIMIT_NPROC on
		// the agent; the gVisor sentry does not enforce RLIMIT_NPROC.
		refuse("spec.runtime gvisor: limits.maxProcesses %d is held by RLIMIT_NPROC, which the gVisor sentry does not enforce (google/gvisor#169); allowed on kubernetes is native", d.Limits.Processes())
	default:
		refuse("spec.runtime %q: allowed on kubernetes is native", d.Runtime)
	}
	// The disk is a tmpfs charged to the pod's memory (BuildPod), so the container's memory
	// limit is their sum.
	if mem, err := d.Limits.MemoryBytes(); err == nil {
		if disk, err := d.Limits.DiskBytes(); err == nil && disk > math.MaxInt64-mem {
			refuse("spec.limits.disk %s: with limits.memory %s it exceeds 8 EiB; a pod's disk is a tmpfs in its memory, so its memory limit is their sum, at most 8 EiB (rule %s)", d.Limits.Disk, d.Limits.Memory, RuleMemoryPlusDisk)
		}
	}
	if len(written.PreviewPorts) > 0 {
		refuse("spec.previewPorts %v: the operator has no preview proxy; leave it empty", written.PreviewPorts)
	}
	if written.HostedBy != "" {
		refuse("spec.hostedBy %q: only for gcp; leave it empty (rule %s)", written.HostedBy, RuleHostedBy)
	}
	for _, k := range slices.Sorted(maps.Keys(written.Labels)) {
		// The operator's own labels select pods for claims and NetworkPolicy (airlock.dev/client
		// opens other sandboxes' agent ports): a declaration may not set them.
		if strings.HasPrefix(k, "airlock.dev/") || k == LabelManagedBy {
			// Refused, not invalid: the declaration is valid elsewhere; plan refuses it for
			// kubernetes under the same rule name, and the broker answers the same class.
			return d, &RefusalError{v1alpha1.ReasonInvalidDeclaration, fmt.Errorf("%w: spec.labels %q: the airlock.dev/ prefix and %s are the operator's own (rule %s)", sandbox.ErrRefused, k, LabelManagedBy, RuleReservedLabel)}
		}
	}
	if len(bad) > 0 {
		return d, &RefusalError{v1alpha1.ReasonUnsupported, fmt.Errorf("%w: %s", sandbox.ErrRefused, strings.Join(bad, "; "))}
	}
	return d, nil
}

// The names plan gives the refusals the operator shares with it (plan.RuleKubernetesLabel,
// plan.RuleKubernetesHostedBy), so a refusal reads the same from plan, the Sandbox's
// condition and the broker.
const (
	RuleReservedLabel  = "kubernetes.reservedLabel"
	RuleHostedBy       = "kubernetes.hostedBy"
	RuleMemoryPlusDisk = "kubernetes.memoryPlusDisk"
)

// MaxPoolSize bounds spec.poolSize.
const MaxPoolSize = 1000

// templateHash identifies what a pool pod was built from (declaration, key ring, image, port):
// idle pods whose hash differs are replaced.
func templateHash(parts ...any) string {
	h := sha256.New()
	for _, p := range parts {
		b, _ := json.Marshal(p)
		h.Write(b)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:20]
}

// sameDeclaration reports whether a and b (both defaulted) describe the same sandbox.
func sameDeclaration(a, b spec.Sandbox) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}
