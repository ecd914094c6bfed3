package plan

import (
	"errors"
	"strings"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/spec"
)

// CheckSandbox is the check a backend's Create runs on one declaration against its own set:
// every capability and bound refusal, joined (nil when there is none). Each is a *Refusal
// naming the field, the value and the capability, and errors.Is(err, sandbox.ErrRefused)
// holds. The declaration is checked after defaults, as Check does; validation is the
// caller's (spec.Sandbox.Validate), so a backend refuses with the same words plan does.
func CheckSandbox(decl spec.Sandbox, set capability.Set) error {
	c := checker{platform: set.Platform, set: set, declared: decl, sb: decl}
	c.sb.ApplyDefaults()
	c.check()
	errs := make([]error, len(c.items))
	for i, it := range c.items {
		// One sandbox, no stack: the field is the sandbox's own path.
		it.r.Field = strings.TrimPrefix(it.r.Field, "sandboxes[0].")
		errs[i] = it.r
	}
	return errors.Join(errs...)
}
