package spec

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
)

// IDPattern is the grammar of sandbox and workload ids.
const IDPattern = `^[A-Za-z0-9_-]{1,64}$`

// EnvNamePattern is the grammar of environment variable names.
const EnvNamePattern = sbtypes.EnvNamePattern

// IsValidID reports whether id matches IDPattern. A loop, not a regexp: `{1,64}` compiles to
// 64 copies of the class (~860 allocations, 0.1-0.3 ms), paid at the start of every binary that
// links this package (the CLI, the agent) when compiled at package init.
func IsValidID(id string) bool {
	if len(id) < 1 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

const idMessage = "an id is 1 to 64 characters of letters, digits, '_' and '-'"

// ValidateID checks a sandbox or workload id: [A-Za-z0-9_-], 1 to 64 characters.
func ValidateID(id string) error {
	if !IsValidID(id) {
		return &FieldError{Path: "id", Value: id, Rule: RuleIDFormat, Message: idMessage}
	}
	return nil
}

// stackContext is what a sandbox is checked against when it is part of a stack.
type stackContext struct {
	firstIndex map[string]int      // sandbox id → index of its first occurrence
	workloads  map[string]struct{} // workload ids
}

// Validate reports every problem of the sandbox in field order. pathPrefix is prepended to each
// path ("sandboxes[1]" gives "sandboxes[1].limits.memory"; "" gives "limits.memory"). Fields left
// unset are valid (they take defaults), except the image. Stack-level rules (id.duplicate,
// hostedBy.unknown) are checked by Stack.Validate.
func (s *Sandbox) Validate(pathPrefix string) []*FieldError {
	return s.validate(pathPrefix, -1, nil)
}

func (s *Sandbox) validate(prefix string, index int, sc *stackContext) []*FieldError {
	v := &validator{prefix: prefix}
	if IsValidID(s.ID) {
		v.sandboxID = s.ID
	}

	if !IsValidID(s.ID) {
		v.add("id", s.ID, RuleIDFormat, idMessage)
	} else if sc != nil {
		if first := sc.firstIndex[s.ID]; first != index {
			v.add("id", s.ID, RuleIDDuplicate, fmt.Sprintf("the id is already used by sandboxes[%d]; ids are unique in a stack", first))
		}
	}
	v.image(s.Image)
	v.limits(s.Limits)
	v.egress(s.Egress)
	v.session(s.Session)
	v.labels(s.Labels)
	v.previewPorts(s.PreviewPorts)
	v.env(s.Env)
	v.workdir(s.Workdir)
	if s.Runtime != "" && !slices.Contains(Runtimes, s.Runtime) {
		v.add("runtime", string(s.Runtime), RuleRuntimeUnknown, "runtime must be one of "+joinQuoted(Runtimes))
	}
	if sc != nil && s.HostedBy != "" {
		if _, ok := sc.workloads[s.HostedBy]; !ok {
			v.add("hostedBy", s.HostedBy, RuleHostedByUnknown, "hostedBy must name a workload declared in the stack's workloads")
		}
	}
	return v.errs
}

// Validate reports every problem of the stack: the stack's own fields, then each sandbox in
// order (field order within it), then each workload.
func (st *Stack) Validate() []*FieldError {
	v := &validator{}
	if st.APIVersion != APIVersion {
		v.add("apiVersion", st.APIVersion, RuleAPIVersion, fmt.Sprintf("apiVersion must be %q", APIVersion))
	}
	if st.Kind != "" && st.Kind != StackKind {
		v.add("kind", st.Kind, RuleKind, fmt.Sprintf("kind must be %q or left out", StackKind))
	}
	if len(st.Sandboxes) == 0 {
		v.add("sandboxes", "", RuleSandboxesRequired, "a stack declares at least one sandbox")
	}
	sc := &stackContext{firstIndex: map[string]int{}, workloads: map[string]struct{}{}}
	for i, sb := range st.Sandboxes {
		if _, seen := sc.firstIndex[sb.ID]; !seen {
			sc.firstIndex[sb.ID] = i
		}
	}
	for _, w := range st.Workloads {
		sc.workloads[w.ID] = struct{}{}
	}
	for i := range st.Sandboxes {
		v.errs = append(v.errs, st.Sandboxes[i].validate(fmt.Sprintf("sandboxes[%d]", i), i, sc)...)
	}
	firstWorkload := map[string]int{}
	for j, w := range st.Workloads {
		wv := &validator{prefix: fmt.Sprintf("workloads[%d]", j)}
		if !IsValidID(w.ID) {
			wv.add("id", w.ID, RuleWorkloadID, "a workload "+idMessage)
		} else if first, seen := firstWorkload[w.ID]; seen {
			wv.add("id", w.ID, RuleIDDuplicate, fmt.Sprintf("the id is already used by workloads[%d]; workload ids are unique in a stack", first))
		} else {
			firstWorkload[w.ID] = j
		}
		for k, h := range w.Hosts {
			if _, ok := sc.firstIndex[h]; !ok {
				wv.add(fmt.Sprintf("hosts[%d]", k), h, RuleWorkloadHostsUnknown, "hosts must name sandboxes declared in the stack")
			}
		}
		v.errs = append(v.errs, wv.errs...)
	}
	return v.errs
}

// CheckUpdate reports what may not change between the declaration in force (old) and its
// replacement (new): the id. Validate the new declaration separately.
func CheckUpdate(old, new *Sandbox) []*FieldError {
	if old.ID != new.ID {
		return []*FieldError{{
			SandboxID: old.ID, Path: "id", Value: new.ID, Rule: RuleIDImmutable,
			Message: fmt.Sprintf("the id of a sandbox cannot change (it is %q); create a new sandbox instead", old.ID),
		}}
	}
	return nil
}

type validator struct {
	prefix    string
	sandboxID string
	errs      []*FieldError
}

func (v *validator) add(field, value, rule, msg string) {
	p := field
	if v.prefix != "" {
		p = v.prefix + "." + field
	}
	v.errs = append(v.errs, &FieldError{SandboxID: v.sandboxID, Path: p, Value: value, Rule: rule, Message: msg})
}

func (v *validator) image(img Image) {
	switch kinds := img.kinds(); len(kinds) {
	case 0:
		v.add("image", "", RuleImageRequired, `image is required: "host", an OCI reference, "./dir", "x.tar", "oci:./layout", or an object with one of `+imageObjectFieldList)
		return
	case 1:
	default:
		v.add("image", img.String(), RuleImageOneOf, "an image has exactly one source; set only one of "+imageObjectFieldList)
	}
	if img.Ref != "" && strings.ContainsFunc(img.Ref, isSpaceOrControl) {
		v.add("image.ref", img.Ref, RuleImageRef, "an image reference has no spaces or control characters, e.g. \"docker.io/library/python:3.12\"")
	}
	for _, f := range []struct{ name, val string }{{"ociLayout", img.OCILayout}, {"tarball", img.Tarball}, {"dir", img.Dir}} {
		if strings.ContainsRune(f.val, 0) {
			v.add("image."+f.name, f.val, RuleImagePath, "a path may not contain a NUL byte")
		}
	}
	if img.Snapshot != "" && !IsValidID(img.Snapshot) {
		v.add("image.snapshot", img.Snapshot, RuleImageSnapshot, "a snapshot name is 1 to 64 characters of letters, digits, '_' and '-'")
	}
}

func isSpaceOrControl(r rune) bool { return r <= ' ' || r == 0x7f }

func (v *validator) limits(l Limits) {
	if l.CPU != "" {
		if rq, ok := v.quantity("limits.cpu", l.CPU); ok {
			if rq.Cmp(*maxMilliQuantity) >= 0 {
				v.add("limits.cpu", string(l.CPU), RuleQuantityTooLarge, "cpu is too large")
			} else if _, err := l.CPU.MilliValue(); err != nil {
				v.add("limits.cpu", string(l.CPU), RuleCPUMillicores, "cpu is a whole number of millicores: \"250m\", \"0.5\", \"2\" (1m is the smallest step)")
			}
		}
	}
	v.bytes("limits.memory", l.Memory, MinMemoryBytes)
	v.bytes("limits.disk", l.Disk, MinDiskBytes)
	if l.MaxProcesses != nil && *l.MaxProcesses < 1 {
		v.add("limits.maxProcesses", strconv.FormatInt(*l.MaxProcesses, 10), RuleMaxProcessesPositive, "maxProcesses must be at least 1")
	}
}

// quantity checks syntax and sign, returning the parsed value when both are fine.
func (v *validator) quantity(field string, q Quantity) (resource.Quantity, bool) {
	p, err := q.Parse()
	if err != nil {
		v.add(field, string(q), RuleQuantitySyntax, `not a quantity; write a number with an optional suffix, e.g. "500m", "2", "512Mi", "1Gi", "1G"`)
		return resource.Quantity{}, false
	}
	if p.Sign() <= 0 {
		v.add(field, string(q), RuleQuantityPositive, "must be greater than zero")
		return resource.Quantity{}, false
	}
	return p, true
}

func (v *validator) bytes(field string, q Quantity, minimum int64) {
	if q == "" {
		return
	}
	rq, ok := v.quantity(field, q)
	if !ok {
		return
	}
	if rq.Cmp(*maxQuantity) >= 0 {
		v.add(field, string(q), RuleQuantityTooLarge, "the quantity does not fit in 63 bits of bytes")
		return
	}
	n, err := q.Bytes()
	if err != nil {
		v.add(field, string(q), RuleQuantityWholeBytes, "must be a whole number of bytes, e.g. \"512Mi\", \"1Gi\", \"1500M\"")
		return
	}
	if n < minimum {
		v.add(field, string(q), RuleQuantityMinimum, fmt.Sprintf("must be at least %s", formatMi(minimum)))
	}
}

func formatMi(n int64) string { return strconv.FormatInt(n>>20, 10) + "Mi" }

func (v *validator) egress(e Egress) {
	if e.Mode != "" && !slices.Contains(EgressModes, e.Mode) {
		v.add("egress.mode", string(e.Mode), RuleEgressMode, "egress mode must be one of "+joinQuoted(EgressModes))
	}
	switch {
	case e.Mode == EgressAllowDomains && len(e.Domains) == 0:
		v.add("egress.domains", "", RuleEgressDomainsEmpty, "mode allowDomains needs at least one domain")
	case e.Mode != EgressAllowDomains && len(e.Domains) > 0:
		mode := string(e.Mode)
		if mode == "" {
			mode = string(DefaultEgressMode) + " (the default)"
		}
		v.add("egress.domains", strings.Join(e.Domains, ","), RuleEgressDomainsWithoutAllowDomains,
			"domains are only allowed with mode allowDomains; mode is "+mode)
	}
	for i, d := range e.Domains {
		if rule, msg := domainProblem(d); rule != "" {
			v.add(fmt.Sprintf("egress.domains[%d]", i), d, rule, msg)
		}
	}
}

func (v *validator) session(s Session) {
	lifeOK, idleOK := true, true
	if s.MaxLifetimeSeconds != nil && *s.MaxLifetimeSeconds < 1 {
		lifeOK = false
		v.add("session.maxLifetimeSeconds", strconv.FormatInt(*s.MaxLifetimeSeconds, 10), RuleSessionLifetimePositive, "maxLifetimeSeconds must be at least 1")
	}
	if s.IdleTimeoutSeconds != nil && *s.IdleTimeoutSeconds < 1 {
		idleOK = false
		v.add("session.idleTimeoutSeconds", strconv.FormatInt(*s.IdleTimeoutSeconds, 10), RuleSessionIdlePositive, "idleTimeoutSeconds must be at least 1")
	}
	// An unset idle timeout defaults to at most the lifetime, so only an explicit one can exceed it.
	if lifeOK && idleOK && s.IdleTimeoutSeconds != nil && *s.IdleTimeoutSeconds > s.Lifetime() {
		v.add("session.idleTimeoutSeconds", strconv.FormatInt(*s.IdleTimeoutSeconds, 10), RuleSessionIdleExceedsLifetime,
			fmt.Sprintf("idleTimeoutSeconds must not exceed maxLifetimeSeconds (%d)", s.Lifetime()))
	}
}

func (v *validator) labels(labels map[string]string) {
	for _, k := range sortedKeys(labels) {
		field := "labels[" + k + "]"
		if msgs := content.IsLabelKey(k); len(msgs) > 0 {
			v.add(field, k, RuleLabelKey, "label key "+strings.Join(msgs, "; "))
		}
		if msgs := content.IsLabelValue(labels[k]); len(msgs) > 0 {
			v.add(field, labels[k], RuleLabelValue, "label value "+strings.Join(msgs, "; "))
		}
	}
}

func (v *validator) previewPorts(ports []int) {
	first := map[int]int{}
	for i, p := range ports {
		field := fmt.Sprintf("previewPorts[%d]", i)
		if p < 1 || p > 65535 {
			v.add(field, strconv.Itoa(p), RulePreviewPortRange, "a port is 1 to 65535")
			continue
		}
		if j, seen := first[p]; seen {
			v.add(field, strconv.Itoa(p), RulePreviewPortDuplicate, fmt.Sprintf("port already listed at previewPorts[%d]", j))
			continue
		}
		first[p] = i
	}
}

func (v *validator) env(env map[string]string) {
	for _, k := range sortedKeys(env) {
		field := "env[" + k + "]"
		if !sbtypes.IsEnvName(k) {
			v.add(field, k, RuleEnvName, "an environment variable name is a letter or '_' followed by letters, digits and '_'")
		}
		// The value is withheld from the error: environment values are often secrets.
		if strings.ContainsRune(env[k], 0) {
			v.add(field, "", RuleEnvValue, "an environment variable value may not contain a NUL byte")
		}
	}
}

func (v *validator) workdir(w string) {
	if w == "" {
		return
	}
	if strings.ContainsRune(w, 0) || !path.IsAbs(w) || path.Clean(w) != w {
		v.add("workdir", w, RuleWorkdirAbsolute, "workdir is an absolute, clean path such as \"/workspace\" (no \"..\", \".\", double or trailing slashes)")
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func joinQuoted[T ~string](vals []T) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		q[i] = strconv.Quote(string(v))
	}
	return strings.Join(q, ", ")
}

func quote(s string) string { return strconv.Quote(s) }
