// Package plan checks a stack against a platform before anything runs and reports every refusal.
package plan

import (
	"errors"
	"fmt"
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
	// The platform's own ceilings (capability.Bounds).
	RuleBoundLifetime  = "bound.lifetime"
	RuleBoundDomains   = "bound.domains"
	RuleBoundCPU       = "bound.cpu"
	RuleBoundMemory    = "bound.memory"
	RuleBoundProcesses = "bound.processes"
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
// workloads.
type Result struct {
	Platform capability.Platform `json:"platform"`
	Refusals []*Refusal          `json:"refusals"`
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
// declaration AFTER defaults: a default is enforced like a declared value, so a platform that
// cannot hold the default memory ceiling refuses rather than silently running unbounded.
// The one property that needs no capability of its own is an idle timeout no shorter than an
// enforced lifetime. st is not modified.
func Check(st *spec.Stack, platform capability.Platform, set capability.Set) Result {
	if st == nil {
		st = &spec.Stack{}
	}
	res := Result{Platform: platform, Refusals: []*Refusal{}}
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
			c := checker{platform: platform, set: set, index: i, declared: st.Sandboxes[i]}
			c.sb = st.Sandboxes[i] // a copy: ApplyDefaults assigns fields, never writes through pointers
			c.sb.ApplyDefaults()
			c.check()
			items = append(items, c.items...)
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

// checker collects the capability and bound refusals of one sandbox.
type checker struct {
	platform capability.Platform
	set      capability.Set
	index    int
	declared spec.Sandbox // as written
	sb       spec.Sandbox // after defaults
	items    []item
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

	c.need(capability.EnforcedLimits, "limits.cpu", string(sb.Limits.CPU), "cpu ceiling "+string(sb.Limits.CPU), d.Limits.CPU == "")
	if m, err := sb.Limits.CPU.MilliValue(); err == nil && b.MaxCPUMillis > 0 && m > b.MaxCPUMillis {
		c.add("limits.cpu", string(sb.Limits.CPU), "", RuleBoundCPU,
			fmt.Sprintf("cpu %s exceeds %s's ceiling of %dm", sb.Limits.CPU, c.platform, b.MaxCPUMillis))
	}
	c.need(capability.EnforcedLimits, "limits.memory", string(sb.Limits.Memory), "memory ceiling "+string(sb.Limits.Memory), d.Limits.Memory == "")
	if n, err := sb.Limits.Memory.Bytes(); err == nil && b.MaxMemoryBytes > 0 && n > b.MaxMemoryBytes {
		c.add("limits.memory", string(sb.Limits.Memory), "", RuleBoundMemory,
			fmt.Sprintf("memory %s exceeds %s's ceiling of %d bytes", sb.Limits.Memory, c.platform, b.MaxMemoryBytes))
	}
	c.need(capability.DiskLimit, "limits.disk", string(sb.Limits.Disk), "disk limit "+string(sb.Limits.Disk), d.Limits.Disk == "")
	procs := strconv.FormatInt(sb.Limits.Processes(), 10)
	c.need(capability.ProcessLimit, "limits.maxProcesses", procs, "process limit "+procs, d.Limits.MaxProcesses == nil)
	if b.MaxProcesses > 0 && sb.Limits.Processes() > b.MaxProcesses {
		c.add("limits.maxProcesses", procs, "", RuleBoundProcesses,
			fmt.Sprintf("maxProcesses %s exceeds %s's ceiling of %d", procs, c.platform, b.MaxProcesses))
	}

	mode := string(sb.Egress.Mode)
	switch sb.Egress.Mode {
	case spec.EgressDeny:
		c.need(capability.EgressDeny, "egress.mode", mode, "egress mode deny", d.Egress.Mode == "")
	case spec.EgressAllow:
		c.need(capability.PublicOnlyEgress, "egress.mode", mode, "egress mode allow (public internet only)", false)
	case spec.EgressAllowDomains:
		c.need(capability.DomainEgressRules, "egress.mode", mode, "egress mode allowDomains (hostname allowlist)", false)
		if b.MaxDomains > 0 && len(sb.Egress.Domains) > b.MaxDomains {
			c.add("egress.domains", strings.Join(sb.Egress.Domains, ","), "", RuleBoundDomains,
				fmt.Sprintf("%d domains exceed %s's limit of %d", len(sb.Egress.Domains), c.platform, b.MaxDomains))
		}
	}

	life := sb.Session.Lifetime()
	lifeS := strconv.FormatInt(life, 10)
	c.need(capability.SessionLifetime, "session.maxLifetimeSeconds", lifeS, "max lifetime "+lifeS+"s", d.Session.MaxLifetimeSeconds == nil)
	if b.MaxLifetimeSeconds > 0 && life > b.MaxLifetimeSeconds {
		c.add("session.maxLifetimeSeconds", lifeS, "", RuleBoundLifetime,
			fmt.Sprintf("max lifetime %ss exceeds %s's ceiling of %ds", lifeS, c.platform, b.MaxLifetimeSeconds))
	}
	// An idle timeout no shorter than the lifetime is held by the lifetime itself: the sandbox
	// ends no later than the idle timeout could end it.
	idle := strconv.FormatInt(sb.Session.IdleTimeout(), 10)
	if !(sb.Session.IdleTimeout() >= life && c.set.Has(capability.SessionLifetime)) {
		c.need(capability.IdleTimeout, "session.idleTimeoutSeconds", idle, "idle timeout "+idle+"s", d.Session.IdleTimeoutSeconds == nil)
	}
	if sb.Session.CanReconnect() {
		c.need(capability.Reconnect, "session.reconnect", "true", "reconnect", d.Session.Reconnect == nil)
	}

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
	c.need(capability.Workdir, "workdir", sb.Workdir, "workdir "+sb.Workdir, d.Workdir == "")
	switch sb.Runtime {
	case spec.RuntimeGVisor:
		c.need(capability.GVisor, "runtime", string(sb.Runtime), "runtime gvisor", false)
	case spec.RuntimeDocker:
		c.need(capability.DockerRuntime, "runtime", string(sb.Runtime), "runtime docker", false)
	}
	if c.platform == capability.GCP && sb.HostedBy == "" {
		c.add("hostedBy", "", "", RuleGCPRequiresHost,
			"a gcp sandbox runs inside a hosting workload: set hostedBy to the id of a workload in this stack")
	}
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
