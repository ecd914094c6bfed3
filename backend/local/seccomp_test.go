package local

import (
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// simulate runs the compiled program in x/net/bpf's VM. The VM loads 32-bit words big-endian
// while the program was built for this (little-endian) machine, so each word of seccomp_data is
// written big-endian at the offset the little-endian layout gives it.
func simulate(t *testing.T, prog []byte, archID uint32, nr int, args ...uint64) uint32 {
	t.Helper()
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

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

func TestDefaultSeccompDecisions(t *testing.T) {
	if runtime.GOARCH != "amd64" || binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the syscall numbers below are amd64's")
	}
	prog, err := DefaultSeccomp()
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
	if got := simulate(t, prog.BPF, x86, 0x40000000|unix.SYS_READ); got != retENOSYS {
		t.Errorf("x32 read: got %#x, want ENOSYS", got)
	}
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
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}, false},
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
		_, err := compileSeccomp(c.prof)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
