//go:build cluster

package kubernetes_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestKubeconfigThroughAPIServer is the outside path on the real cluster: from the kubeconfig
// hack/testcluster writes (a client certificate, which carries no token the broker could
// review), discovery reaches the broker through the API server's service proxy as a
// ServiceAccount whose token it asks the TokenRequest API for, and the claimed pod's agent
// through the pod proxy: the API server consumes Authorization, so the broker's and the
// agent's tokens travel in X-Airlock-Authorization, and TokenReview + SubjectAccessReview still
// judge the ServiceAccount.
func TestKubeconfigThroughAPIServer(t *testing.T) {
	e := newEnv(t)
	d := baseDecl("outside")
	e.sandboxCR(d, 1, 1)
	kubectl(t, "", "-n", e.ns, "create", "serviceaccount", "stranger")
	ctx := ctxT(t)

	open := func(sa string) *kb.Backend {
		cfg, how, err := kb.Discover(ctx, kb.Discovery{Kubeconfig: kubeconfig, Namespace: e.ns, ServiceAccount: sa})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(how, "service proxy") || !strings.Contains(how, "pod proxy") {
			t.Fatalf("discovery: %s", how)
		}
		b, err := kb.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}

	// Authorisation is the ServiceAccount's, not the kubeconfig user's (system:masters).
	if _, err := open("stranger").Claim(ctx, "outside", nil); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("claim as a ServiceAccount without the claim right: %v, want ErrForbidden", err)
	}

	b := open("app")
	sess, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sess.ID {
		t.Fatalf("get: %+v", got)
	}
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var out, errb bytes.Buffer
	res, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", "print(2+2)"}, Timeout: 30 * time.Second}, &out, &errb)
	if err != nil || res.ExitCode != 0 || out.String() != "4\n" {
		t.Fatalf("python through the pod proxy: %+v, %v, stdout %q stderr %q", res, err, out.String(), errb.String())
	}
	// Full duplex through the proxy: stdin streamed while the output streams back.
	out.Reset()
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("through the API server\n"))
		pw.Close()
	}()
	res, err = a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: pr, Timeout: 30 * time.Second}, &out, &errb)
	if err != nil || res.ExitCode != 0 || out.String() != "through the API server\n" {
		t.Fatalf("stdin through the pod proxy: %+v, %v, stdout %q", res, err, out.String())
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != sess.ID {
		t.Fatalf("list: %v, %v", list, err)
	}
	owner := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/session="+sess.ID, "-o", "jsonpath={.items[0].metadata.annotations.airlock\\.dev/owner}")
	if want := "system:serviceaccount:" + e.ns + ":app"; owner != want {
		t.Errorf("session owner %q, want %q (the ServiceAccount, not the kubeconfig's user)", owner, want)
	}
	if err := b.Terminate(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, sess.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get after terminate: %v, want not found", err)
	}
}
