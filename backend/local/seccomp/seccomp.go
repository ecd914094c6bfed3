// Package seccomp compiles the sandbox's seccomp filter: Docker's default profile for a container without capabilities, as BPF.
package seccomp

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

// The filter is Docker's default profile as Docker applies it to a container with no
// capabilities: the capability-gated rules (mount, unshare, namespace clone flags, bpf,
// perf_event_open, ptrace, keyctl...) are left out, so those calls fail with EPERM. It is
// compiled on the host, once per process; the init stage only loads the bytes, so the profile
// library stays out of the agent binary.

// Program is the compiled filter and what the conversion left out.
type Program struct {
	// BPF is the struct sock_filter array in native byte order.
	BPF []byte
	// Instructions is len(BPF)/8.
	Instructions int
	// Unknown lists profile syscall names the filter library has no number for on this
	// architecture; they fall to the default action (EPERM), which only ever denies more.
	Unknown []string
}

var (
	cache   = sync.OnceValues(func() (*Program, error) { return compileDefault(false) })
	v2Cache = sync.OnceValues(func() (*Program, error) { return compileDefault(true) })
)

// defaultFilter returns the compiled default filter (cached for the process).
func defaultFilter() (*Program, error) { return cache() }

// For is the filter for sandboxes on a cgroup version's hosts: defaultFilter, plus
// clone3 on v2 (allowClone3).
func For(cgroupVersion int) (*Program, error) {
	if cgroupVersion == 2 {
		return v2Cache()
	}
	return cache()
}

// allowClone3: on cgroup v2 the agent starts each command with clone3(CLONE_INTO_CGROUP), the
// one way to have a process born in its exec cgroup (v2 moves whole processes only, and a
// move after the fork would let the command run, and fork, outside it first); the filter is
// on the thread that forks, so the command inherits the allowance. Docker answers clone3 with
// ENOSYS because a filter cannot read its flags in memory, and the flags it guards are the
// namespace ones. Here the user namespace's own limit guards them instead, in the kernel and
// for every path to them: init sets user.max_user_namespaces to 0 in the sandbox's user
// namespace (nsinit), so no nested user namespace can be made, and without one the code (no
// capabilities, no_new_privs) can make no other namespace either. That holds while the code
// runs as a non-root uid without capabilities (nsinit.CodeUID) and holds no handle on a
// cgroup directory (CLONE_INTO_CGROUP checks its own write access): then clone3 grants
// nothing clone does not. The v1 filter stays Docker's.
func compileDefault(allowClone3 bool) (*Program, error) {
	// No capabilities: the includes/excludes keyed on caps resolve as for an unprivileged
	// container; arches and minimum kernels resolve against this host.
	rs := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	prof, err := mobyseccomp.GetDefaultProfile(rs)
	if err != nil {
		return nil, fmt.Errorf("seccomp: docker default profile: %w", err)
	}
	// Docker allows ptrace on kernels from 4.8 on; this runtime refuses it (and its siblings
	// in extraDenied) as well: LLM code has no need to trace, and it is the first tool of an
	// escape. First match wins, so a rule placed first overrides the profile's allowance.
	deny := specs.LinuxSyscall{Names: extraDenied, Action: specs.ActErrno}
	first := []specs.LinuxSyscall{deny}
	if allowClone3 {
		first = append(first, specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow})
	}
	prof.Syscalls = append(first, prof.Syscalls...)
	return compile(prof)
}

// extraDenied are syscalls the default profile allows and this runtime refuses.
// process_vm_readv/writev read and write another process's memory without ptrace (same
// checks as PTRACE_MODE_ATTACH); refused for the same reason.
var extraDenied = []string{"ptrace", "process_vm_readv", "process_vm_writev"}

// compile converts an OCI seccomp profile to a BPF program for this architecture. It
// refuses every construct it cannot express exactly rather than allowing more than the profile.
//
// The syscall names, numbers and audit arch come from go-seccomp-bpf; the program is laid out
// here. go-seccomp-bpf's own Policy.Assemble leaves an argument in the accumulator when a
// syscall's argument conditions fail and then compares that argument against the syscall
// numbers of the rules that follow: with Docker's profile socket(AF_INET6) was refused, and an
// argument equal to a later allowed syscall's number would be allowed. Here every syscall with
// conditions gets one block that always ends in a return, so the accumulator never leaks past
// it (TestSeccompConditionFallthrough, TestSeccompMatchesProfile).
func compile(prof *specs.LinuxSeccomp) (*Program, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	def, err := actionOf(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default action: %w", err)
	}
	if len(prof.Flags) > 0 || prof.ListenerPath != "" {
		return nil, fmt.Errorf("seccomp: profile flags %v / listener %q are not supported", prof.Flags, prof.ListenerPath)
	}
	var order []uint32 // syscall numbers in order of first appearance
	rules := map[uint32][]rule{}
	var unknown []string
	for i, r := range prof.Syscalls {
		action, err := actionOf(r.Action, r.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule %d (%v): %w", i, r.Names, err)
		}
		conds, err := conditionsOf(r.Args)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule %d (%v): %w", i, r.Names, err)
		}
		for _, name := range r.Names {
			num, ok := info.SyscallNames[name]
			if !ok {
				if !slices.Contains(unknown, name) {
					unknown = append(unknown, name)
				}
				continue
			}
			nr := uint32(num)
			if _, seen := rules[nr]; !seen {
				order = append(order, nr)
			}
			rules[nr] = append(rules[nr], rule{conds: conds, action: action})
		}
	}

	var prog []bpf.Instruction
	// Any other audit arch (i386) gets the default action: the profile is written in this
	// architecture's numbers. So does x32, which shares x86_64's arch but sets bit 30.
	prog = append(prog,
		bpf.LoadAbsolute{Off: 4, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: def},
		bpf.LoadAbsolute{Off: 0, Size: 4},
	)
	if info.ID == arch.X86_64.ID {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: 0x40000000, SkipFalse: 1},
			bpf.RetConstant{Val: def},
		)
	}
	// The syscall number picks its decision through a binary search over intervals of numbers
	// (a run of numbers with the same unconditional action is one interval, every number not
	// in the profile gets the default): about log2(intervals) comparisons per syscall instead
	// of a linear scan of every number the profile names. The kernel runs the filter once per
	// syscall number when it is installed (to cache the constant decisions), so its length
	// and depth are paid on every sandbox start: a linear scan took 0.3-0.7 ms there.
	var ivs []interval
	slices.Sort(order)
	next := uint32(0)
	for _, nr := range order {
		if nr > next {
			ivs = appendInterval(ivs, interval{start: next, action: def})
		}
		rs := rules[nr]
		iv := interval{start: nr, action: rs[0].action}
		if len(rs[0].conds) > 0 {
			if iv.block, err = conditionBlock(rs, def); err != nil {
				return nil, fmt.Errorf("seccomp: syscall %d: %w", nr, err)
			}
		}
		ivs = appendInterval(ivs, iv)
		next = nr + 1
	}
	ivs = appendInterval(ivs, interval{start: next, action: def})
	prog = append(prog, searchTree(ivs)...)
	raw, err := bpf.Assemble(prog)
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
	return &Program{BPF: out, Instructions: len(raw), Unknown: unknown}, nil
}

// interval is the decision for the syscall numbers from start up to the next
// interval's start: a return of action, or (block != nil, a single number) its argument checks.
type interval struct {
	start  uint32
	action uint32
	block  []bpf.Instruction
}

// appendInterval adds iv, merged into the previous interval when both return the same action.
func appendInterval(ivs []interval, iv interval) []interval {
	if n := len(ivs); n > 0 && ivs[n-1].block == nil && iv.block == nil && ivs[n-1].action == iv.action {
		return ivs
	}
	return append(ivs, iv)
}

// searchTree decides among ivs (sorted, the first starting at or below the number in the
// accumulator) by binary search. Every path ends in a return.
func searchTree(ivs []interval) []bpf.Instruction {
	if len(ivs) == 1 {
		if ivs[0].block != nil {
			return ivs[0].block
		}
		return []bpf.Instruction{bpf.RetConstant{Val: ivs[0].action}}
	}
	mid := len(ivs) / 2
	left, right := searchTree(ivs[:mid]), searchTree(ivs[mid:])
	var out []bpf.Instruction
	if len(left) <= 255 {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: ivs[mid].start, SkipTrue: uint8(len(left))})
	} else {
		// Past a conditional jump's reach: an unconditional jump over the left half.
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: ivs[mid].start, SkipFalse: 1},
			bpf.Jump{Skip: uint32(len(left))})
	}
	out = append(out, left...)
	return append(out, right...)
}

// rule is one profile rule for one syscall.
type rule struct {
	conds  []seccompbpf.Condition // all must hold; none: always matches
	action uint32
}

// conditionBlock evaluates one syscall's rules in order (the first whose conditions all hold
// decides) and ends in the default action: every path returns.
func conditionBlock(rs []rule, def uint32) ([]bpf.Instruction, error) {
	var block []bpf.Instruction
	for _, r := range rs {
		if len(r.conds) == 0 {
			return append(block, bpf.RetConstant{Val: r.action}), nil
		}
		// A failed test jumps to the next rule, which starts right after this rule's return.
		var body []bpf.Instruction
		var fails []int // indexes of jumps whose fail branch must reach the end of this rule
		for _, c := range r.conds {
			seq, failAt, err := conditionSeq(c)
			if err != nil {
				return nil, err
			}
			for _, f := range failAt {
				fails = append(fails, len(body)+f)
			}
			body = append(body, seq...)
		}
		body = append(body, bpf.RetConstant{Val: r.action})
		end := len(body)
		for _, i := range fails {
			j := body[i].(bpf.JumpIf)
			skip := end - i - 1
			if skip > 255 {
				return nil, fmt.Errorf("argument checks too long")
			}
			if j.SkipTrue == failMark {
				j.SkipTrue = uint8(skip)
			}
			if j.SkipFalse == failMark {
				j.SkipFalse = uint8(skip)
			}
			body[i] = j
		}
		block = append(block, body...)
	}
	return append(block, bpf.RetConstant{Val: def}), nil
}

// failMark stands for "the condition fails" in a sequence until the rule's end is known.
const failMark = 0xff

// conditionSeq is one 64-bit argument comparison from 32-bit loads. Falling through the
// sequence means the condition holds; branches marked failMark mean it fails (failAt lists
// those jumps).
func conditionSeq(c seccompbpf.Condition) (seq []bpf.Instruction, failAt []int, err error) {
	hiOff, loOff := 16+8*c.Argument+4, 16+8*c.Argument
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 { // big-endian: the high word comes first
		hiOff, loOff = loOff, hiOff
	}
	hi, lo := uint32(c.Value>>32), uint32(c.Value)
	ldHi := bpf.LoadAbsolute{Off: hiOff, Size: 4}
	ldLo := bpf.LoadAbsolute{Off: loOff, Size: 4}
	switch c.Operation {
	case seccompbpf.Equal:
		seq = []bpf.Instruction{ldHi, bpf.JumpIf{Cond: bpf.JumpEqual, Val: hi, SkipFalse: failMark},
			ldLo, bpf.JumpIf{Cond: bpf.JumpEqual, Val: lo, SkipFalse: failMark}}
		failAt = []int{1, 3}
	case seccompbpf.NotEqual:
		// A differing high word holds at once (skip the low test); else the low word must differ.
		seq = []bpf.Instruction{ldHi, bpf.JumpIf{Cond: bpf.JumpEqual, Val: hi, SkipFalse: 2},
			ldLo, bpf.JumpIf{Cond: bpf.JumpEqual, Val: lo, SkipTrue: failMark}}
		failAt = []int{3}
	case seccompbpf.GreaterThan, seccompbpf.GreaterOrEqual, seccompbpf.LessThan, seccompbpf.LessOrEqual:
		// The high word decides unless equal; then the low word does (unsigned throughout).
		var hiHolds, loTest bpf.JumpTest
		switch c.Operation {
		case seccompbpf.GreaterThan:
			hiHolds, loTest = bpf.JumpGreaterThan, bpf.JumpGreaterThan
		case seccompbpf.GreaterOrEqual:
			hiHolds, loTest = bpf.JumpGreaterThan, bpf.JumpGreaterOrEqual
		case seccompbpf.LessThan:
			hiHolds, loTest = bpf.JumpLessThan, bpf.JumpLessThan
		default:
			hiHolds, loTest = bpf.JumpLessThan, bpf.JumpLessOrEqual
		}
		seq = []bpf.Instruction{
			ldHi,
			bpf.JumpIf{Cond: hiHolds, Val: hi, SkipTrue: 3},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: hi, SkipFalse: failMark},
			ldLo,
			bpf.JumpIf{Cond: loTest, Val: lo, SkipFalse: failMark},
		}
		failAt = []int{2, 4}
	case seccompbpf.BitsNotSet:
		seq = []bpf.Instruction{ldHi, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: hi, SkipTrue: failMark},
			ldLo, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: lo, SkipTrue: failMark}}
		failAt = []int{1, 3}
	default:
		return nil, nil, fmt.Errorf("operation %s is not supported", c.Operation)
	}
	return seq, failAt, nil
}

// actionOf is the filter's return value for an action.
func actionOf(a specs.LinuxSeccompAction, errno *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActErrno:
		e := uint(unix.EPERM)
		if errno != nil {
			e = *errno
		}
		if e == 0 || e > 0xfff {
			return 0, fmt.Errorf("errno %d is not a valid error number", e)
		}
		return unix.SECCOMP_RET_ERRNO | uint32(e), nil
	case specs.ActKillThread, specs.ActKill:
		return unix.SECCOMP_RET_KILL_THREAD, nil
	case specs.ActKillProcess:
		return unix.SECCOMP_RET_KILL_PROCESS, nil
	}
	return 0, fmt.Errorf("action %q is not supported", a)
}

// conditionsOf converts a rule's argument comparisons; all must hold (libseccomp's AND).
// nil means the rule has none.
func conditionsOf(args []specs.LinuxSeccompArg) (seccompbpf.ArgumentConditions, error) {
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
