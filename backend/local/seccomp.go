package local

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	seccompbpf "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The sandbox's seccomp filter is Docker's default profile as Docker applies it to a
// container with no capabilities: the capability-gated rules (mount, unshare, namespace clone
// flags, bpf, perf_event_open, ptrace, keyctl...) are left out, so those calls fail with EPERM.
// It is compiled here, on the host, once per process; the init stage only loads the bytes, so
// the profile library stays out of the agent binary.

// SeccompProgram is the compiled filter and what the conversion left out.
type SeccompProgram struct {
	// BPF is the struct sock_filter array in native byte order.
	BPF []byte
	// Instructions is len(BPF)/8.
	Instructions int
	// Unknown lists profile syscall names the filter library has no number for on this
	// architecture; they fall to the default action (EPERM), which only ever denies more.
	Unknown []string
}

var seccompCache = sync.OnceValues(compileDefaultSeccomp)

// DefaultSeccomp returns the compiled default filter (cached for the process).
func DefaultSeccomp() (*SeccompProgram, error) { return seccompCache() }

func compileDefaultSeccomp() (*SeccompProgram, error) {
	// No capabilities: the includes/excludes keyed on caps resolve as for an unprivileged
	// container; arches and minimum kernels resolve against this host.
	rs := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	prof, err := mobyseccomp.GetDefaultProfile(rs)
	if err != nil {
		return nil, fmt.Errorf("seccomp: docker default profile: %w", err)
	}
	// Docker allows ptrace on kernels from 4.8 on; this runtime refuses it as well: LLM code
	// has no need to trace, and it is the first tool of an escape. First match wins, so a
	// rule placed first overrides the profile's allowance.
	deny := specs.LinuxSyscall{Names: extraDenied, Action: specs.ActErrno}
	prof.Syscalls = append([]specs.LinuxSyscall{deny}, prof.Syscalls...)
	return compileSeccomp(prof)
}

// extraDenied are syscalls the default profile allows and this runtime refuses.
var extraDenied = []string{"ptrace"}

// compileSeccomp converts an OCI seccomp profile to a BPF program for this architecture. It
// refuses every construct it cannot express exactly rather than allowing more than the profile.
func compileSeccomp(prof *specs.LinuxSeccomp) (*SeccompProgram, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	def, err := seccompAction(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default action: %w", err)
	}
	// The filter library returns EPERM for a bare errno action; the default must be exactly that.
	if def != seccompbpf.ActionErrno && def != seccompbpf.ActionAllow {
		return nil, fmt.Errorf("seccomp: default action %s with errno %v is not supported (only EPERM)", prof.DefaultAction, prof.DefaultErrnoRet)
	}
	if len(prof.Flags) > 0 || prof.ListenerPath != "" {
		return nil, fmt.Errorf("seccomp: profile flags %v / listener %q are not supported", prof.Flags, prof.ListenerPath)
	}
	policy := seccompbpf.Policy{DefaultAction: def}
	var unknown []string
	for i, rule := range prof.Syscalls {
		action, err := seccompAction(rule.Action, rule.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule %d (%v): %w", i, rule.Names, err)
		}
		conds, err := seccompConditions(rule.Args)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule %d (%v): %w", i, rule.Names, err)
		}
		group := seccompbpf.SyscallGroup{Action: action}
		for _, name := range rule.Names {
			if _, ok := info.SyscallNames[name]; !ok {
				if !slices.Contains(unknown, name) {
					unknown = append(unknown, name)
				}
				continue
			}
			if conds == nil {
				group.Names = append(group.Names, name)
			} else {
				group.NamesWithCondtions = append(group.NamesWithCondtions, seccompbpf.NameWithConditions{Name: name, Conditions: conds})
			}
		}
		if len(group.Names)+len(group.NamesWithCondtions) > 0 {
			// One group per profile rule, in profile order: the first matching rule decides.
			policy.Syscalls = append(policy.Syscalls, group)
		}
	}
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble bpf: %w", err)
	}
	if len(raw) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program has %d instructions, the kernel takes at most %d", len(raw), unix.BPF_MAXINSNS)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return &SeccompProgram{BPF: out, Instructions: len(raw), Unknown: unknown}, nil
}

func seccompAction(a specs.LinuxSeccompAction, errno *uint) (seccompbpf.Action, error) {
	switch a {
	case specs.ActAllow:
		return seccompbpf.ActionAllow, nil
	case specs.ActErrno:
		if errno == nil || *errno == uint(unix.EPERM) {
			return seccompbpf.ActionErrno, nil // the library adds EPERM
		}
		if *errno > 0xffff {
			return 0, fmt.Errorf("errno %d does not fit SECCOMP_RET_DATA", *errno)
		}
		return seccompbpf.ActionErrno | seccompbpf.Action(*errno), nil
	case specs.ActKillThread, specs.ActKill:
		return seccompbpf.ActionKillThread, nil
	case specs.ActKillProcess:
		return seccompbpf.ActionKillProcess, nil
	}
	return 0, fmt.Errorf("action %q is not supported", a)
}

// seccompConditions converts a rule's argument comparisons; all must hold (libseccomp's AND).
// nil means the rule has none.
func seccompConditions(args []specs.LinuxSeccompArg) (seccompbpf.ArgumentConditions, error) {
	if len(args) == 0 {
		return nil, nil
	}
	var conds seccompbpf.ArgumentConditions
	seen := map[uint]bool{}
	for _, a := range args {
		if a.Index > 5 {
			return nil, fmt.Errorf("argument index %d is past the sixth argument", a.Index)
		}
		// runc turns repeated comparisons of one argument into OR rules; the filter library
		// would AND them. Refuse rather than guess.
		if seen[a.Index] {
			return nil, fmt.Errorf("argument %d is compared more than once in one rule", a.Index)
		}
		seen[a.Index] = true
		c := seccompbpf.Condition{Argument: uint32(a.Index), Value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.Operation = seccompbpf.Equal
		case specs.OpNotEqual:
			c.Operation = seccompbpf.NotEqual
		case specs.OpGreaterThan:
			c.Operation = seccompbpf.GreaterThan
		case specs.OpGreaterEqual:
			c.Operation = seccompbpf.GreaterOrEqual
		case specs.OpLessThan:
			c.Operation = seccompbpf.LessThan
		case specs.OpLessEqual:
			c.Operation = seccompbpf.LessOrEqual
		case specs.OpMaskedEqual:
			// (arg & mask) == 0 is "none of the mask's bits set"; other masked comparisons
			// have no equivalent in the filter library.
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("masked-equal with a non-zero value (%#x & %#x == %#x) is not supported", a.Index, a.Value, a.ValueTwo)
			}
			c.Operation = seccompbpf.BitsNotSet
		default:
			return nil, fmt.Errorf("operator %q is not supported", a.Op)
		}
		conds = append(conds, c)
	}
	return conds, nil
}
