package spec

import (
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// ErrInvalid is the class of every parse and validation error of this package; sandbox.ErrInvalid
// is the same value (sbtypes defines it), so callers test with errors.Is(err, sandbox.ErrInvalid).
var ErrInvalid = sbtypes.ErrInvalid

// ParseError is a document that cannot be read into the declaration types: bad YAML or JSON,
// an unknown or duplicate field, a value of the wrong type, more than one document.
type ParseError struct {
	// Path locates the field, e.g. "sandboxes[0].limits.cpuu"; empty for the whole document.
	Path string
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *ParseError) Unwrap() error { return ErrInvalid }

// FieldError is one validation problem.
type FieldError struct {
	// SandboxID is the id of the sandbox the problem belongs to; "" when the id itself is bad
	// or the problem is not about a sandbox.
	SandboxID string
	// Path locates the field, e.g. "sandboxes[1].limits.memory".
	Path string
	// Value is the offending value as written ("" when it is absent or withheld, as for env values).
	Value string
	// Rule is a stable machine name such as "quantity.syntax"; see the Rule constants.
	Rule string
	// Message is human text naming what is allowed.
	Message string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	b.WriteString(" (")
	if e.Value != "" {
		b.WriteString("got ")
		b.WriteString(quote(e.Value))
		b.WriteString("; ")
	}
	b.WriteString("rule ")
	b.WriteString(e.Rule)
	b.WriteString(")")
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Rule names reported in FieldError.Rule. They are stable: tools and tests match on them.
const (
	RuleAPIVersion                       = "apiVersion"
	RuleKind                             = "kind"
	RuleSandboxesRequired                = "sandboxes.required"
	RuleIDFormat                         = "id.format"
	RuleIDDuplicate                      = "id.duplicate"
	RuleIDImmutable                      = "id.immutable"
	RuleImageRequired                    = "image.required"
	RuleImageOneOf                       = "image.oneOf"
	RuleImageRef                         = "image.ref"
	RuleImagePath                        = "image.path"
	RuleImageSnapshot                    = "image.snapshot"
	RuleQuantitySyntax                   = "quantity.syntax"
	RuleQuantityPositive                 = "quantity.positive"
	RuleQuantityTooLarge                 = "quantity.tooLarge"
	RuleQuantityWholeBytes               = "quantity.wholeBytes"
	RuleQuantityMinimum                  = "quantity.minimum"
	RuleCPUMillicores                    = "cpu.millicores"
	RuleMaxProcessesPositive             = "maxProcesses.positive"
	RuleEgressMode                       = "egress.mode"
	RuleEgressDomainsEmpty               = "egress.domainsEmpty"
	RuleEgressDomainsWithoutAllowDomains = "egress.domainsWithoutAllowDomains"
	RuleDomainSyntax                     = "domain.syntax"
	RuleDomainIPLiteral                  = "domain.ipLiteral"
	RuleDomainWildcard                   = "domain.wildcard"
	RuleSessionLifetimePositive          = "session.lifetimePositive"
	RuleSessionIdlePositive              = "session.idlePositive"
	RuleSessionIdleExceedsLifetime       = "session.idleExceedsLifetime"
	RuleLabelKey                         = "label.key"
	RuleLabelValue                       = "label.value"
	RulePreviewPortRange                 = "previewPort.range"
	RulePreviewPortDuplicate             = "previewPort.duplicate"
	RuleEnvName                          = "env.name"
	RuleEnvValue                         = "env.value"
	RuleWorkdirAbsolute                  = "workdir.absolute"
	RuleRuntimeUnknown                   = "runtime.unknown"
	RuleHostedByUnknown                  = "hostedBy.unknown"
	RuleWorkloadID                       = "workload.id"
	RuleWorkloadHostsUnknown             = "workload.hostsUnknown"
)
