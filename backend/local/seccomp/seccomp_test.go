package seccomp

import (
	"encoding/binary"
	"runtime"
	"slices"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// simulate runs the compiled program in x/net/bpf's VM. The VM loads 32-bit words big-endian
// while the program was built for this (little-endian) machine, so each word of seccomp_data is
// written big-endian at the offset the little-endian layout gives it.
func simulate(t *testing.T, prog []byte, archID uint32, nr int, args ...uint64) uint32 {
	t.Helper()
	vm := vmCache[&prog[0]]
	if vm == nil {
		vm = newVM(t, prog)
		vmCache[&prog[0]] = vm
	}
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], uint32(nr))
	binary.BigEndian.PutUint32(data[4:], archID)
	for i, a := range args {
		off := 16 + 8*i
		binary.BigEndian.PutUint32(data[off:], uint32(a))       // low word first on little-endian
		binary.BigEndian.PutUint32(data[off+4:], uint32(a>>32)) // then the high word
	}
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

var vmCache = map[*byte]*bpf.VM{}

func newVM(t *testing.T, prog []byte) *bpf.VM {
	var insts []bpf.Instruction
	for i := 0; i < len(prog); i += 8 {
		raw := bpf.RawInstruction{
			Op: binary.NativeEndian.Uint16(prog[i:]),
			Jt: prog[i+2], Jf: prog[i+3],
			K: binary.NativeEndian.Uint32(prog[i+4:]),
		}
		insts = append(insts, raw.Disassemble())
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

func TestDefaultSeccompDecisions(t *testing.T) {
	if runtime.GOARCH != "amd64" || binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the syscall numbers below are amd64's")
	}
	prog, err := defaultFilter()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d instructions; names without a number here: %v", prog.Instructions, prog.Unknown)
	x86 := uint32(arch.X86_64.ID)
	newNS := uint64(unix.CLONE_NEWUSER)
	cases := []struct {
		name string
		nr   int
		args []uint64
		want uint32
	}{
		{"read", unix.SYS_READ, nil, retAllow},
		{"execve", unix.SYS_EXECVE, nil, retAllow},
		{"clone thread", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND}, retAllow},
		{"clone new user ns", unix.SYS_CLONE, []uint64{newNS}, retEPERM},
		{"clone new net ns", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNET | uint64(unix.SIGCHLD)}, retEPERM},
		{"clone3 falls back", unix.SYS_CLONE3, nil, retENOSYS},
		{"unshare", unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, retEPERM},
		{"mount", unix.SYS_MOUNT, nil, retEPERM},
		{"umount2", unix.SYS_UMOUNT2, nil, retEPERM},
		{"ptrace", unix.SYS_PTRACE, nil, retEPERM},
		{"process_vm_readv", unix.SYS_PROCESS_VM_READV, nil, retEPERM},
		{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV, nil, retEPERM},
		{"bpf", unix.SYS_BPF, nil, retEPERM},
		{"keyctl", unix.SYS_KEYCTL, nil, retEPERM},
		{"add_key", unix.SYS_ADD_KEY, nil, retEPERM},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, nil, retEPERM},
		{"setns", unix.SYS_SETNS, nil, retEPERM},
		{"init_module", unix.SYS_INIT_MODULE, nil, retEPERM},
		{"personality linux", unix.SYS_PERSONALITY, []uint64{0}, retAllow},
		{"personality other", unix.SYS_PERSONALITY, []uint64{0x0040000}, retEPERM},
		{"socket inet", unix.SYS_SOCKET, []uint64{unix.AF_INET}, retAllow},
		{"socket vsock", unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, retEPERM},
		{"unknown number", 999, nil, retEPERM},
	}
	for _, c := range cases {
		if got := simulate(t, prog.BPF, x86, c.nr, c.args...); got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, got, c.want)
		}
	}
	// Other ABIs are refused: i386 numbers as a whole, x32 by its syscall bit.
	if got := simulate(t, prog.BPF, uint32(arch.I386.ID), unix.SYS_READ); got != retEPERM {
		t.Errorf("i386 read: got %#x, want EPERM", got)
	}
	if got := simulate(t, prog.BPF, x86, 0x40000000|unix.SYS_READ); got != retEPERM {
		t.Errorf("x32 read: got %#x, want EPERM", got)
	}
}

// TestSeccompConditionFallthrough: when a syscall's argument conditions fail, the decision must
// not fall into later rules with the argument in place of the syscall number.
func TestSeccompConditionFallthrough(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("amd64 numbers")
	}
	one := uint(1)
	eq := func(v uint64) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: v, Op: specs.OpEqualTo}}}
	}
	prof := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &one, Syscalls: []specs.LinuxSyscall{
		eq(7), eq(10),
		{Names: []string{"sendfile"}, Action: specs.ActAllow}, // number 40 on amd64
	}}
	prog, err := compile(prof)
	if err != nil {
		t.Fatal(err)
	}
	x86 := uint32(arch.X86_64.ID)
	for _, c := range []struct {
		arg  uint64
		want uint32
	}{{7, retAllow}, {10, retAllow}, {unix.SYS_SENDFILE, retEPERM}, {1, retEPERM}} {
		if got := simulate(t, prog.BPF, x86, unix.SYS_SOCKET, c.arg); got != c.want {
			t.Errorf("socket(%d): got %#x, want %#x", c.arg, got, c.want)
		}
	}
}

// refDecision evaluates a profile directly: a syscall's rules in profile order, the first whose
// argument comparisons all hold decides; else the default.
func refDecision(t *testing.T, prof *specs.LinuxSeccomp, nrName map[int]string, nr int, args []uint64) uint32 {
	t.Helper()
	ret := func(a specs.LinuxSeccompAction, e *uint) uint32 {
		v, err := actionOf(a, e)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	name := nrName[nr]
	for _, r := range prof.Syscalls {
		if !slices.Contains(r.Names, name) {
			continue
		}
		holds := true
		for _, a := range r.Args {
			v := args[a.Index]
			switch a.Op {
			case specs.OpEqualTo:
				holds = holds && v == a.Value
			case specs.OpNotEqual:
				holds = holds && v != a.Value
			case specs.OpLessThan:
				holds = holds && v < a.Value
			case specs.OpLessEqual:
				holds = holds && v <= a.Value
			case specs.OpGreaterThan:
				holds = holds && v > a.Value
			case specs.OpGreaterEqual:
				holds = holds && v >= a.Value
			case specs.OpMaskedEqual:
				holds = holds && v&a.Value == a.ValueTwo
			default:
				t.Fatalf("op %s", a.Op)
			}
		}
		if holds {
			return ret(r.Action, r.ErrnoRet)
		}
	}
	return ret(prof.DefaultAction, prof.DefaultErrnoRet)
}

// TestSeccompMatchesProfile checks the compiled default program against the profile read
// directly, for every syscall number and a spread of argument values around the profile's
// own comparison constants.
func TestSeccompMatchesProfile(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("amd64 numbers")
	}
	rs := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	prof, err := mobyseccomp.GetDefaultProfile(rs)
	if err != nil {
		t.Fatal(err)
	}
	prof.Syscalls = append([]specs.LinuxSyscall{{Names: extraDenied, Action: specs.ActErrno}}, prof.Syscalls...)
	prog, err := defaultFilter()
	if err != nil {
		t.Fatal(err)
	}
	info := arch.X86_64
	nrName := map[int]string{}
	for name, nr := range info.SyscallNames {
		nrName[nr] = name
	}
	values := []uint64{0, 1, 1 << 32, 1<<32 | 10, ^uint64(0), 0xffffffff}
	for _, r := range prof.Syscalls {
		for _, a := range r.Args {
			values = append(values, a.Value-1, a.Value, a.Value+1, a.Value|1<<32, a.Value|unix.CLONE_NEWNS)
		}
	}
	checked := 0
	for nr := 0; nr < 500; nr++ {
		for _, v := range values {
			for idx := 0; idx < 2; idx++ {
				args := make([]uint64, 6)
				args[idx] = v
				want := refDecision(t, prof, nrName, nr, args)
				if got := simulate(t, prog.BPF, uint32(info.ID), nr, args...); got != want {
					t.Fatalf("syscall %d (%s) args %#x: got %#x, want %#x", nr, nrName[nr], args, got, want)
				}
				checked++
			}
		}
	}
	t.Logf("%d decisions agree", checked)
}

func TestCompileSeccompRefuses(t *testing.T) {
	one := uint(1)
	nosys := uint(unix.ENOSYS)
	base := func(rules ...specs.LinuxSyscall) *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &one, Syscalls: rules}
	}
	cases := []struct {
		name string
		prof *specs.LinuxSeccomp
		ok   bool
	}{
		{"plain", base(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow}), true},
		{"errno rule", base(specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &nosys}), true},
		{"default ENOSYS", &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &nosys,
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}, true},
		{"trace action", base(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActTrace}), false},
		{"notify action", base(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActNotify}), false},
		{"masked with value", base(specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xff, ValueTwo: 1, Op: specs.OpMaskedEqual}}}), false},
		{"same arg twice", base(specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpGreaterThan}, {Index: 0, Value: 9, Op: specs.OpLessThan}}}), false},
		{"flags", &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Flags: []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog},
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}, false},
	}
	for _, c := range cases {
		_, err := compile(c.prof)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}

// TestSeccompOperators checks every comparison on 64-bit values whose high and low words
// differ in each direction.
func TestSeccompOperators(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("amd64 numbers")
	}
	one := uint(1)
	const v = 0x0000_0002_8000_0005
	inputs := []uint64{0, 5, v - 1, v, v + 1, 0x0000_0002_0000_0000, 0x0000_0003_0000_0000, 0x0000_0001_ffff_ffff, 0x8000_0005, ^uint64(0), 0x0000_0002_8000_0004}
	ops := []specs.LinuxSeccompOperator{specs.OpEqualTo, specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual,
		specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpMaskedEqual}
	nrName := map[int]string{unix.SYS_SOCKET: "socket"}
	for _, op := range ops {
		prof := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &one, Syscalls: []specs.LinuxSyscall{{
			Names: []string{"socket"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: v, Op: op}},
		}}}
		prog, err := compile(prof)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		for _, in := range inputs {
			args := []uint64{0, in, 0, 0, 0, 0}
			want := refDecision(t, prof, nrName, unix.SYS_SOCKET, args)
			if got := simulate(t, prog.BPF, uint32(arch.X86_64.ID), unix.SYS_SOCKET, args...); got != want {
				t.Errorf("%s %#x vs %#x: got %#x, want %#x", op, in, uint64(v), got, want)
			}
		}
	}
}

// TestSeccompSearchTreeLongJumps: a profile whose argument checks make one half of the search
// tree longer than a conditional jump reaches still decides every number as the profile does
// (the far half is reached by an unconditional jump).
func TestSeccompSearchTreeLongJumps(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("amd64 numbers")
	}
	one := uint(1)
	info := arch.X86_64
	nrName := map[int]string{}
	for name, nr := range info.SyscallNames {
		nrName[nr] = name
	}
	prof := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &one}
	// Every third number from 0 to 150 with three argument checks (~20 instructions each),
	// the others allowed outright or left to the default.
	for nr := 0; nr < 150; nr++ {
		name, ok := nrName[nr]
		if !ok {
			continue
		}
		switch nr % 3 {
		case 0:
			prof.Syscalls = append(prof.Syscalls, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: uint64(nr), Op: specs.OpEqualTo},
					{Index: 1, Value: 1 << 33, Op: specs.OpLessThan}, {Index: 2, Value: 4, Op: specs.OpMaskedEqual}}})
		case 1:
			prof.Syscalls = append(prof.Syscalls, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActAllow})
		}
	}
	prog, err := compile(prof)
	if err != nil {
		t.Fatal(err)
	}
	long := false
	for i := 0; i+8 <= len(prog.BPF); i += 8 {
		if binary.NativeEndian.Uint16(prog.BPF[i:]) == unix.BPF_JMP|unix.BPF_JA {
			long = true
		}
	}
	if !long {
		t.Fatalf("%d instructions and no long jump: the test does not reach the case it is for", prog.Instructions)
	}
	for nr := 0; nr < 200; nr++ {
		for _, args := range [][]uint64{{0, 0, 0}, {uint64(nr), 0, 0}, {uint64(nr), 1 << 33, 0}, {uint64(nr), 5, 4}, {uint64(nr), 5, 8}} {
			full := append(args, 0, 0, 0)
			want := refDecision(t, prof, nrName, nr, full)
			if got := simulate(t, prog.BPF, uint32(info.ID), nr, full...); got != want {
				t.Fatalf("syscall %d args %v: got %#x, want %#x", nr, args, got, want)
			}
		}
	}
}

// TestSeccompV2OnlyAddsClone3: the cgroup v2 filter allows clone3 (the agent's
// CLONE_INTO_CGROUP) and decides every other call as the v1 one, Docker's, does.
func TestSeccompV2OnlyAddsClone3(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("amd64 numbers")
	}
	v1, err := For(1)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := For(2)
	if err != nil {
		t.Fatal(err)
	}
	x86 := uint32(arch.X86_64.ID)
	if got := simulate(t, v1.BPF, x86, unix.SYS_CLONE3); got != retENOSYS {
		t.Errorf("v1 clone3: got %#x, want ENOSYS", got)
	}
	if got := simulate(t, v2.BPF, x86, unix.SYS_CLONE3); got != retAllow {
		t.Errorf("v2 clone3: got %#x, want allow", got)
	}
	for nr := 0; nr < 500; nr++ {
		if nr == unix.SYS_CLONE3 {
			continue
		}
		for _, a := range []uint64{0, unix.CLONE_NEWUSER, unix.CLONE_NEWNS | uint64(unix.SIGCHLD), unix.AF_INET, ^uint64(0)} {
			if d1, d2 := simulate(t, v1.BPF, x86, nr, a), simulate(t, v2.BPF, x86, nr, a); d1 != d2 {
				t.Errorf("syscall %d arg %#x: v1 %#x, v2 %#x", nr, a, d1, d2)
			}
		}
	}
}
