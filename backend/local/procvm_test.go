package local

import (
	"strings"
	"testing"
	"time"
)

// TestAbuseProcessVM: process_vm_readv and process_vm_writev read and write another process's
// memory without ptrace; code in the sandbox gets EPERM for both, even on itself.
func TestAbuseProcessVM(t *testing.T) {
	x := newBox(t, nil)
	// A one-byte copy from and to the caller's own memory: allowed by the kernel for any
	// process on itself, so only the seccomp filter can refuse it.
	script := `
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src, dst = ctypes.create_string_buffer(b"s"), ctypes.create_string_buffer(b"d")
local, remote = iovec(ctypes.addressof(dst), 1), iovec(ctypes.addressof(src), 1)
for name, nr in (("process_vm_readv", 310), ("process_vm_writev", 311)):
    r = libc.syscall(nr, ctypes.c_long(os.getpid()), ctypes.byref(local), ctypes.c_long(1), ctypes.byref(remote), ctypes.c_long(1), ctypes.c_long(0))
    print(name, "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
`
	out, errs, res := x.run(t, "python3 -c '"+strings.ReplaceAll(script, "'", `'"'"'`)+"'", 30*time.Second)
	if res.ExitCode != 0 {
		t.Fatalf("probe failed: %+v %q %q", res, out, errs)
	}
	for _, name := range []string{"process_vm_readv", "process_vm_writev"} {
		if !strings.Contains(out, name+" EPERM\n") {
			t.Errorf("%s: want EPERM, got %q", name, out)
		}
	}
}
