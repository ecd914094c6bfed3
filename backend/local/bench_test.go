package local

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// BenchmarkSandboxPython is a fresh sandbox, python3 -c 'print(2+2)', terminate.
func BenchmarkSandboxPython(b *testing.B) {
	be := newTestBackend(b)
	ctx := context.Background()
	for b.Loop() {
		s, err := be.Create(ctx, hostDecl("bench"))
		if err != nil {
			b.Fatal(err)
		}
		a, err := be.Connect(ctx, s.ID)
		if err != nil {
			b.Fatal(err)
		}
		res, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", "print(2+2)"}, Timeout: time.Minute}, io.Discard, io.Discard)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(err, res)
		}
		a.Close()
		if err := be.Terminate(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHostPython is the same python3 unsandboxed, for the ratio.
func BenchmarkHostPython(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/usr/bin/python3", "-c", "print(2+2)").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
