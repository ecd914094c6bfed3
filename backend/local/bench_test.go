package local

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
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

// BenchmarkCreateByRoot is create + terminate per kind of root: the host's, a directory image
// (its locked clone, idmap.go) and an unpacked OCI image (the same, idmapped: one more clone
// of this process for the user namespace of the mapping).
func BenchmarkCreateByRoot(b *testing.B) {
	be := newTestBackend(b)
	ctx := context.Background()
	root := minimalRootfs(b)
	layoutDir := writeOCILayout(b, root)
	for _, tc := range []struct {
		name  string
		image spec.Image
	}{
		{"host", spec.Image{Host: true}},
		{"dir", spec.Image{Dir: root}},
		{"oci", spec.Image{OCILayout: layoutDir}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := hostDecl("bench")
			d.Image = tc.image
			for b.Loop() {
				s, err := be.Create(ctx, d)
				if err != nil {
					b.Fatal(err)
				}
				if err := be.Terminate(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTerminateAdopted is the terminate of a sandbox another backend made (as airlock run
// ends a parked sandbox a filler made): only the terminate is timed.
func BenchmarkTerminateAdopted(b *testing.B) {
	maker := newTestBackend(b)
	be := newTestBackendAt(b, maker.opts.StateDir)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		s, err := maker.Create(ctx, hostDecl("bench"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := be.Get(ctx, s.ID); err != nil { // adopted
			b.Fatal(err)
		}
		b.StartTimer()
		if err := be.Terminate(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
	}
}
