// Package plan checks a stack against a platform before anything runs and reports every refusal.
package plan

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Rules of this package; a refusal from validation carries the spec.Rule* name instead.
const (
	// RuleCapability: a declared property needs a capability the platform does not have.
	RuleCapability = "capability"
	// RulePlatformUnknown: there is no backend for the platform.
	RulePlatformUnknown = "platform.unknown"
	// RuleGCPRequiresHost: a gcp sandbox must name the workload that hosts it.
	RuleGCPRequiresHost = "gcp.requiresHost"
	// RuleKubernetesHostedBy: the operator runs no sandbox inside a workload (hostedBy is gcp's).
	RuleKubernetesHostedBy = "kubernetes.hostedBy"
	// RuleKubernetesLabel: the operator's own label keys (the airlock.dev/ prefix and
	// app.kubernetes.io/managed-by) select pods for claims and NetworkPolicy.
	RuleKubernetesLabel = "kubernetes.reservedLabel"
	// RuleKubernetesMemoryPlusDisk: a pod's disk is a tmpfs in its memory, so its memory limit is
	// limits.memory + limits.disk, which must fit in 8 EiB.
	RuleKubernetesMemoryPlusDisk = "kubernetes.memoryPlusDisk"
	// RuleAzureDiskImage: an azure sandbox starts from a disk image of its sandbox group,
	// named by the image reference; an OCI reference is not one.
	RuleAzureDiskImage = "azure.diskImage"
	// RuleAzureLabel: the azure backend's own label keys (AzureLabelPrefix).
	RuleAzureLabel = "azure.reservedLabel"
	// The platform's own ceilings (capability.Bounds).
	RuleBoundLifetime  = "bound.lifetime"
	RuleBoundDomains   = "bound.domains"
	RuleBoundCPU       = "bound.cpu"
	RuleBoundMemory    = "bound.memory"
	RuleBoundProcesses = "bound.processes"
	RuleBoundIdle      = "bound.idleTimeout"
)

// Label keys the Kubernetes operator keeps for itself (operator/labels.go); a declaration may not
// set them. operator's TestPlanAgreesWithAccept holds the two to the same verdict.
const (
	kubernetesLabelPrefix    = "airlock.dev/"
	kubernetesLabelManagedBy = "app.kubernetes.io/managed-by"
)

// Refusal is one reason a stack cannot run as declared on a platform. It unwraps to
// sandbox.ErrRefused.
type Refusal struct {
	// SandboxID is "" for a stack-level refusal or a sandbox whose id is itself invalid.
	SandboxID string `json:"sandboxId,omitempty"`
	// Field is the path in the stack, e.g. "sandboxes[0].limits.memory".
	Field string `json:"field"`
	// Value is the value checked, after defaults; environment values are never shown.
	Value string `json:"value,omitempty"`
	// Capability is the capability the field needs, when Rule is RuleCapability.
	Capability capability.Name `json:"capability,omitempty"`
	Rule       string          `json:"rule"`
	Message    string          `json:"message"`
}

func (r *Refusal) Error() string {
	var b strings.Builder
	if r.SandboxID != "" {
		fmt.Fprintf(&b, "sandbox %s: ", r.SandboxID)
	}
	if r.Field != "" {
		b.WriteString(r.Field)
		b.WriteString(": ")
	}
	b.WriteString(r.Message)
	if r.Capability != "" {
		fmt.Fprintf(&b, " (needs %s)", r.Capability)
	} else {
		fmt.Fprintf(&b, " (rule %s)", r.Rule)
	}
	return b.String()
}

// Unwrap makes errors.Is(err, sandbox.ErrRefused) hold.
func (r *Refusal) Unwrap() error { return sandbox.ErrRefused }

// SandboxIndex is the index in the stack's sandboxes of the sandbox the refusal is about, -1
// for a stack-level or workload refusal.
func (r *Refusal) SandboxIndex() int {
	m := indexedPath().FindStringSubmatch(r.Field)
	if m == nil || m[1] != "sandboxes" {
		return -1
	}
	i, _ := strconv.Atoi(m[2])
	return i
}

// Needs is what the refusal asks of the platform: the capability, else the rule.
func (r *Refusal) Needs() string {
	if r.Capability != "" {
		return string(r.Capability)
	}
	return r.Rule
}

// Result is every refusal of one stack on one platform, in stable order: stack-level first,
// then each sandbox in declaration order (fields in declaration order within it), then
// workloads; and what each sandbox's undeclared properties become there.
type Result struct {
	Platform capability.Platform `json:"platform"`
	Refusals []*Refusal          `json:"refusals"`
	// Sandboxes are the stack's sandboxes in declaration order (none for an unknown platform).
	Sandboxes []SandboxValues `json:"sandboxes"`
}

// SandboxValues is what one sandbox's undeclared properties become on the platform.
type SandboxValues struct {
	ID string `json:"id"`
	// Undeclared lists each property the declaration leaves out, in capability.Properties
	// order, with the value it takes; a default the platform can neither hold nor replace is a
	// refusal instead, and is not listed.
	Undeclared []Value `json:"undeclared"`
	// Notes are the platform's notes (capability.Set.Notes) on how it holds this sandbox's
	// properties, in capability.Properties order.
	Notes []Note `json:"notes,omitempty"`
}

// Note is how the platform holds one property, in words.
type Note struct {
	Field capability.Property `json:"field"`
	Note  string              `json:"note"`
}

// Value is what one undeclared property becomes.
type Value struct {
	Field  capability.Property `json:"field"`
	Value  string              `json:"value"`
	Source Source              `json:"source"`
}

// Source says where an undeclared property's value comes from.
type Source string

const (
	// SourceDefault: airlock's default (spec.Default*), held by the platform.
	SourceDefault Source = "default"
	// SourcePlatform: the platform's own value (capability.Set.PlatformValues), because the
	// platform cannot hold airlock's default.
	SourcePlatform Source = "platform"
)

// Words is the source as plan prints it.
func (s Source) Words() string {
	if s == SourcePlatform {
		return "platform value"
	}
	return "airlock default"
}

// Refused reports whether anything was refused.
func (r Result) Refused() bool { return len(r.Refusals) > 0 }

// Err joins every refusal into one error (nil when there are none); errors.As finds each
// *Refusal and errors.Is(err, sandbox.ErrRefused) holds.
func (r Result) Err() error {
	errs := make([]error, len(r.Refusals))
	for i, x := range r.Refusals {
		errs[i] = x
	}
	return errors.Join(errs...)
}

// Check refuses everything in st that platform, publishing set, cannot run as declared. It
// validates the declaration as written, then checks capabilities and bounds against the
// declaration AFTER defaults. A declared value the platform cannot hold is refused. An
// undeclared one takes airlock's default where the platform holds it, else the platform's own
// value where the set publishes one (set.PlatformValues), else it is refused like a declared
// value: a platform that can neither hold the default memory ceiling nor say what it gives
// instead refuses rather than silently running unbounded. The one property that needs no
// capability of its own is an idle timeout no shorter than an enforced lifetime. st is not
// modified.
func Check(st *spec.Stack, platform capability.Platform, set capability.Set) Result {
	return check(st, platform, set, false)
}

// CheckCreate is Check of one sandbox this process is about to create (airlock run, the
// daemon's and MCP's creates): a stack of it alone, without the rules only a stack answers.
// A gcp sandbox created from inside its workload is hosted by its creator, so it needs no
// hostedBy (gcp.requiresHost is a stack file's rule).
func CheckCreate(decl spec.Sandbox, platform capability.Platform, set capability.Set) Result {
	return check(&spec.Stack{APIVersion: spec.APIVersion, Sandboxes: []spec.Sandbox{decl}}, platform, set, true)
}

func check(st *spec.Stack, platform capability.Platform, set capability.Set, alone bool) Result {
	if st == nil {
		st = &spec.Stack{}
	}
	res := Result{Platform: platform, Refusals: []*Refusal{}, Sandboxes: []SandboxValues{}}
	var items []item

	known := slices.Contains(capability.Platforms, platform)
	if !known {
		_, err := capability.ParsePlatform(string(platform))
		items = append(items, item{group: groupStack, r: &Refusal{
			Field: "platform", Value: string(platform), Rule: RulePlatformUnknown,
			Message: "no backend for this platform: " + err.Error(),
		}})
	}

	for _, fe := range st.Validate() {
		items = append(items, fromFieldError(fe))
	}

	if known {
		for i := range st.Sandboxes {
			in := st
			if alone {
				in = nil
			}
			c := checkSandbox(platform, set, in, i, st.Sandboxes[i])
			items = append(items, c.items...)
			sv := SandboxValues{ID: c.sb.ID, Undeclared: c.undeclared}
			for _, p := range capability.Properties {
				if n, ok := set.Notes[p]; ok {
					sv.Notes = append(sv.Notes, Note{Field: p, Note: n})
				}
			}
			res.Sandboxes = append(res.Sandboxes, sv)
		}
	}

	// Validation lists fields in declaration order; stable-sorting by (group, sandbox, field
	// rank) slots the capability refusals in among them without reordering validation's own.
	sort.SliceStable(items, func(a, b int) bool {
		x, y := items[a], items[b]
		if x.group != y.group {
			return x.group < y.group
		}
		if x.index != y.index {
			return x.index < y.index
		}
		return x.rank < y.rank
	})
	for _, it := range items {
		res.Refusals = append(res.Refusals, it.r)
	}
	return res
}

const (
	groupStack = iota
	groupSandbox
	groupWorkload
)

// item is a refusal with its place in the order.
type item struct {
	group, index, rank int
	r                  *Refusal
}

// fieldOrder is the declaration order of a sandbox's fields (spec/types.go), by path prefix.
var fieldOrder = []string{
	"id", "image", "limits.cpu", "limits.memory", "limits.disk", "limits.maxProcesses", "limits",
	"egress.mode", "egress.domains", "egress",
	"session.maxLifetimeSeconds", "session.idleTimeoutSeconds", "session.reconnect", "session",
	"labels", "previewPorts", "env", "workdir", "runtime", "hostedBy",
}

func fieldRank(field string) int {
	best, bestLen := len(fieldOrder), -1
	for i, p := range fieldOrder {
		if (field == p || strings.HasPrefix(field, p+".") || strings.HasPrefix(field, p+"[")) && len(p) > bestLen {
			best, bestLen = i, len(p)
		}
	}
	return best
}

// Compiled on first use: the CLI links plan but most of its runs refuse nothing.
var indexedPath = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(sandboxes|workloads)\[(\d+)\]\.?(.*)$`) })

func fromFieldError(fe *spec.FieldError) item {
	r := &Refusal{SandboxID: fe.SandboxID, Field: fe.Path, Value: fe.Value, Rule: fe.Rule, Message: fe.Message}
	m := indexedPath().FindStringSubmatch(fe.Path)
	if m == nil {
		return item{group: groupStack, r: r}
	}
	idx, _ := strconv.Atoi(m[2])
	if m[1] == "workloads" {
		return item{group: groupWorkload, index: idx, r: r}
	}
	return item{group: groupSandbox, index: idx, rank: fieldRank(m[3]), r: r}
}

// checker collects the capability and bound refusals of one sandbox, and what its undeclared
// properties become.
type checker struct {
	platform capability.Platform
	set      capability.Set
	index    int
	declared spec.Sandbox // as written
	sb       spec.Sandbox // after defaults
	// stack holds the sandbox (nil for one sandbox alone: a backend's Create, Defaults), for
	// the rules only a stack can answer (gcp.requiresHost).
	stack      *spec.Stack
	items      []item
	undeclared []Value
}

// checkSandbox checks declared, the sandbox at index i of its stack (its refusals' paths are
// sandboxes[i].…), against platform's set. Stack-level rules (id.duplicate, hostedBy.unknown) and
// validation are Check's.
func checkSandbox(platform capability.Platform, set capability.Set, st *spec.Stack, i int, declared spec.Sandbox) *checker {
	c := &checker{platform: platform, set: set, stack: st, index: i, declared: declared, undeclared: []Value{}}
	c.sb = declared // a copy: ApplyDefaults assigns fields, never writes through pointers
	c.sb.ApplyDefaults()
	c.check()
	return c
}

func (c *checker) add(field, value string, cap capability.Name, rule, msg string) {
	c.items = append(c.items, item{group: groupSandbox, index: c.index, rank: fieldRank(field), r: &Refusal{
		SandboxID: c.sb.ID, Field: fmt.Sprintf("sandboxes[%d].%s", c.index, field),
		Value: value, Capability: cap, Rule: rule, Message: msg,
	}})
}

// need refuses field unless the platform has capability n. what describes the value for the
// message; defaulted marks a value the declaration left to its default.
func (c *checker) need(n capability.Name, field, value, what string, defaulted bool) {
	if c.set.Has(n) {
		return
	}
	why := c.set.Entries[n].Reason
	if why == "" {
		why = fmt.Sprintf("the %s set publishes no value for %s", c.platform, n)
	}
	if defaulted {
		what += " (default)"
	}
	c.add(field, value, n, RuleCapability, fmt.Sprintf("%s cannot be honoured on %s: %s", what, c.platform, why))
}

// property checks defaulted property p, whose value after defaults is value, against capability
// n ("" when p needs none). A declared value needs n. An undeclared one is airlock's default
// when the platform has n, else the platform's own value when the set publishes one, else it
// needs n like a declared value. It reports whether airlock's value (declared or default) is
// the one that applies, so that the caller checks it against the platform's bounds.
func (c *checker) property(p capability.Property, declared bool, n capability.Name, value, what string) bool {
	if declared {
		if n != "" {
			c.need(n, string(p), value, what, false)
		}
		return true
	}
	if n == "" || c.set.Has(n) {
		c.undeclared = append(c.undeclared, Value{Field: p, Value: value, Source: SourceDefault})
		return true
	}
	if v, ok := c.set.PlatformValues[p]; ok && v != "" && p.Replaceable() {
		c.undeclared = append(c.undeclared, Value{Field: p, Value: v, Source: SourcePlatform})
		return false
	}
	c.need(n, string(p), value, what, true)
	return true
}

var imageCapability = map[spec.ImageKind]capability.Name{
	spec.ImageHost:      capability.ImageHost,
	spec.ImageRef:       capability.ImageRef,
	spec.ImageOCILayout: capability.ImageOCI,
	spec.ImageTarball:   capability.ImageOCI,
	spec.ImageDir:       capability.ImageDir,
	spec.ImageSnapshot:  capability.Snapshot,
}

func (c *checker) check() {
	sb, d, b := c.sb, c.declared, c.set.Bounds

	// An image with no or several sources is a validation refusal already.
	if n, ok := imageCapability[sb.Image.Kind()]; ok {
		c.need(n, "image", sb.Image.String(), "image "+sb.Image.String(), false)
	}

	cpu := string(sb.Limits.CPU)
	if c.property(capability.PropCPU, d.Limits.CPU != "", capability.EnforcedLimits, cpu, "cpu ceiling "+cpu) {
		if m, err := sb.Limits.CPU.MilliValue(); err == nil && b.MaxCPUMillis > 0 && m > b.MaxCPUMillis {
			c.add("limits.cpu", cpu, "", RuleBoundCPU,
				fmt.Sprintf("cpu %s exceeds %s's ceiling of %dm", sb.Limits.CPU, c.platform, b.MaxCPUMillis))
		}
	}
	mem := string(sb.Limits.Memory)
	if c.property(capability.PropMemory, d.Limits.Memory != "", capability.EnforcedLimits, mem, "memory ceiling "+mem) {
		if n, err := sb.Limits.Memory.Bytes(); err == nil && b.MaxMemoryBytes > 0 && n > b.MaxMemoryBytes {
			c.add("limits.memory", mem, "", RuleBoundMemory,
				fmt.Sprintf("memory %s exceeds %s's ceiling of %d bytes", sb.Limits.Memory, c.platform, b.MaxMemoryBytes))
		}
	}
	disk := string(sb.Limits.Disk)
	c.property(capability.PropDisk, d.Limits.Disk != "", capability.DiskLimit, disk, "disk limit "+disk)
	procs := strconv.FormatInt(sb.Limits.Processes(), 10)
	if c.property(capability.PropMaxProcesses, d.Limits.MaxProcesses != nil, capability.ProcessLimit, procs, "process limit "+procs) {
		if b.MaxProcesses > 0 && sb.Limits.Processes() > b.MaxProcesses {
			c.add("limits.maxProcesses", procs, "", RuleBoundProcesses,
				fmt.Sprintf("maxProcesses %s exceeds %s's ceiling of %d", procs, c.platform, b.MaxProcesses))
		}
	}

	mode := string(sb.Egress.Mode)
	switch sb.Egress.Mode {
	case spec.EgressDeny:
		c.property(capability.PropEgressMode, d.Egress.Mode != "", capability.EgressDeny, mode, "egress mode deny")
	case spec.EgressAllow:
		c.need(capability.PublicOnlyEgress, "egress.mode", mode, "egress mode allow (public internet only)", false)
	case spec.EgressAllowDomains:
		c.need(capability.DomainEgressRules, "egress.mode", mode, "egress mode allowDomains (hostname allowlist)", false)
		if b.MaxDomains > 0 && len(sb.Egress.Domains) > b.MaxDomains {
			c.add("egress.domains", strings.Join(sb.Egress.Domains, ","), "", RuleBoundDomains,
				fmt.Sprintf("%d domains exceed %s's limit of %d", len(sb.Egress.Domains), c.platform, b.MaxDomains))
		}
	case spec.EgressOpen:
		// No restriction asks nothing of a platform: every network path can be left open.
	}

	life := sb.Session.Lifetime()
	lifeS := strconv.FormatInt(life, 10)
	lifeHeld := false
	if c.property(capability.PropLifetime, d.Session.MaxLifetimeSeconds != nil, capability.SessionLifetime, lifeS, "max lifetime "+lifeS+"s") {
		lifeHeld = c.set.Has(capability.SessionLifetime)
		if b.MaxLifetimeSeconds > 0 && life > b.MaxLifetimeSeconds {
			c.add("session.maxLifetimeSeconds", lifeS, "", RuleBoundLifetime,
				fmt.Sprintf("max lifetime %ss exceeds %s's ceiling of %ds", lifeS, c.platform, b.MaxLifetimeSeconds))
		}
	}
	// An idle timeout no shorter than the lifetime is held by the lifetime itself: the sandbox
	// ends no later than the idle timeout could end it.
	idle := sb.Session.IdleTimeout()
	idleS := strconv.FormatInt(idle, 10)
	idleNeeds := capability.IdleTimeout
	if idle >= life && lifeHeld {
		idleNeeds = ""
	}
	if c.property(capability.PropIdleTimeout, d.Session.IdleTimeoutSeconds != nil, idleNeeds, idleS, "idle timeout "+idleS+"s") &&
		idleNeeds != "" && b.MinIdleTimeoutSeconds > 0 && idle < b.MinIdleTimeoutSeconds {
		c.add("session.idleTimeoutSeconds", idleS, "", RuleBoundIdle,
			fmt.Sprintf("idle timeout %ss is shorter than %s's minimum of %ds", idleS, c.platform, b.MinIdleTimeoutSeconds))
	}
	reconnect := strconv.FormatBool(sb.Session.CanReconnect())
	reconnectNeeds := capability.Reconnect
	if !sb.Session.CanReconnect() {
		reconnectNeeds = ""
	}
	c.property(capability.PropReconnect, d.Session.Reconnect != nil, reconnectNeeds, reconnect, "reconnect")

	if len(sb.Labels) > 0 {
		c.need(capability.Labels, "labels", joinMap(sb.Labels, true), "labels", false)
	}
	if len(sb.PreviewPorts) > 0 {
		ports := make([]string, len(sb.PreviewPorts))
		for i, p := range sb.PreviewPorts {
			ports[i] = strconv.Itoa(p)
		}
		c.need(capability.Preview, "previewPorts", strings.Join(ports, ","), "preview ports", false)
	}
	if len(sb.Env) > 0 {
		// Names only: environment values are often secrets.
		c.need(capability.Env, "env", joinMap(sb.Env, false), "environment variables", false)
	}
	c.property(capability.PropWorkdir, d.Workdir != "", capability.Workdir, sb.Workdir, "workdir "+sb.Workdir)
	switch sb.Runtime {
	case spec.RuntimeGVisor:
		c.need(capability.GVisor, "runtime", string(sb.Runtime), "runtime gvisor", false)
	case spec.RuntimeDocker:
		c.need(capability.DockerRuntime, "runtime", string(sb.Runtime), "runtime docker", false)
	}
	c.platformRules()
}

// platformRules are what a platform refuses beyond its capabilities.
func (c *checker) platformRules() {
	sb := c.sb
	switch c.platform {
	case capability.GCP:
		// In a stack the link is either side's: the sandbox's hostedBy or a workload's hosts.
		// One sandbox alone (a backend's Create) is hosted by the process creating it.
		if c.stack != nil && sb.HostedBy == "" && !slices.ContainsFunc(c.stack.Workloads, func(w spec.Workload) bool { return slices.Contains(w.Hosts, sb.ID) }) {
			c.add("hostedBy", "", "", RuleGCPRequiresHost,
				"a gcp sandbox runs inside a hosting workload: set hostedBy to the id of a workload in this stack, or list the sandbox in a workload's hosts")
		}
	case capability.Azure:
		// backend/azure's Create refuses both too.
		if sb.Image.Kind() == spec.ImageRef && !AzureDiskImage(sb.Image.Ref) {
			c.add("image", sb.Image.Ref, "", RuleAzureDiskImage,
				"an azure sandbox starts from a disk image of its sandbox group, named in lower-case letters, digits, '.', '_' and '-' (image: ubuntu); building one from an OCI reference is not supported")
		}
		for _, k := range slices.Sorted(maps.Keys(sb.Labels)) {
			if strings.HasPrefix(k, AzureLabelPrefix) {
				c.add("labels["+k+"]", k+"="+sb.Labels[k], "", RuleAzureLabel,
					fmt.Sprintf("label keys starting with %s are the azure backend's own: use another key", AzureLabelPrefix))
			}
		}
	case capability.Kubernetes:
		// The operator's Accept (operator/accept.go) refuses all three.
		for _, k := range slices.Sorted(maps.Keys(sb.Labels)) {
			if strings.HasPrefix(k, kubernetesLabelPrefix) || k == kubernetesLabelManagedBy {
				c.add("labels["+k+"]", k+"="+sb.Labels[k], "", RuleKubernetesLabel,
					fmt.Sprintf("label %s is the operator's own (the %s prefix and %s select pods for claims and NetworkPolicy): use another key",
						k, kubernetesLabelPrefix, kubernetesLabelManagedBy))
			}
		}
		mem, errM := sb.Limits.MemoryBytes()
		disk, errD := sb.Limits.DiskBytes()
		if errM == nil && errD == nil && disk > math.MaxInt64-mem {
			c.add("limits.disk", string(cmp.Or(sb.Limits.Disk, spec.DefaultDisk)), "", RuleKubernetesMemoryPlusDisk,
				fmt.Sprintf("a pod's disk is a tmpfs in its memory, so its memory limit is limits.memory + limits.disk, at most 8 EiB: with limits.memory %s, declare a smaller disk", cmp.Or(sb.Limits.Memory, spec.DefaultMemory)))
		}
		if sb.HostedBy != "" {
			c.add("hostedBy", sb.HostedBy, "", RuleKubernetesHostedBy,
				"the operator runs no sandbox inside a workload (hostedBy is for gcp): leave it empty")
		}
	}
}

// AzureLabelPrefix starts the label keys the azure backend puts on its sandboxes.
const AzureLabelPrefix = "airlock-"

// AzureDiskImage reports whether ref names a disk image as the azure data plane takes it:
// [a-z0-9][a-z0-9._-]{0,127} (no registry, tag or digest).
func AzureDiskImage(ref string) bool {
	return len(ref) >= 1 && len(ref) <= 128 && strings.IndexByte("._-", ref[0]) < 0 &&
		strings.Trim(ref, "abcdefghijklmnopqrstuvwxyz0123456789._-") == ""
}

// joinMap renders a map's keys (and values when withValues) sorted, comma-separated.
func joinMap(m map[string]string, withValues bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if withValues {
		for i, k := range keys {
			keys[i] = k + "=" + m[k]
		}
	}
	return strings.Join(keys, ",")
}

// Defaults is declared with airlock's default filled in for every undeclared property the
// platform holds, and left unset where the platform's own value applies instead
// (capability.Set.PlatformValues): the declaration a backend is given to create, so that it
// applies only what it enforces and never takes a platform value for a declared one. Refusals
// are Check's; Defaults fills what it can whatever they are.
func Defaults(platform capability.Platform, set capability.Set, declared spec.Sandbox) spec.Sandbox {
	c := checkSandbox(platform, set, nil, 0, declared)
	sb := c.sb
	for _, v := range c.undeclared {
		if v.Source != SourcePlatform {
			continue
		}
		switch v.Field {
		case capability.PropCPU:
			sb.Limits.CPU = ""
		case capability.PropMemory:
			sb.Limits.Memory = ""
		case capability.PropDisk:
			sb.Limits.Disk = ""
		case capability.PropMaxProcesses:
			sb.Limits.MaxProcesses = nil
		case capability.PropLifetime:
			sb.Session.MaxLifetimeSeconds = nil
		case capability.PropIdleTimeout:
			sb.Session.IdleTimeoutSeconds = nil
		case capability.PropReconnect:
			sb.Session.Reconnect = nil
		case capability.PropWorkdir:
			sb.Workdir = ""
		}
	}
	return sb
}
