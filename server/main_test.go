package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server"
	"github.com/airlock-sandbox/airlock/spec"
)

// agentBin is the agent binary TestMain builds, so the suite runs what ships.
var agentBin string

func TestMain(m *testing.M) { os.Exit(testutil.MainWithAgent(m, &agentBin)) }

const testAPIKey = "test-api-key-0123456789"

// harness is a real daemon: the local backend behind a server on a unix socket and on TLS
// loopback TCP.
type harness struct {
	backend *local.Backend
	srv     *server.Server
	sock    string
	tcpURL  string
	tlsConf *tls.Config // trusts the server's certificate
	key     ed25519.PrivateKey
	reg     *prometheus.Registry
	logs    *testutil.SyncBuffer // JSON log lines from every goroutine of the server
	c       *client.Client       // the socket's caller: full rights
}

func newHarness(t *testing.T, templates map[string]spec.Sandbox) *harness {
	t.Helper()
	return newHarnessWith(t, harnessConfig{templates: templates})
}

// harnessConfig varies the daemon: egress options for the local backend, and a wrapper that
// hides or changes what the backend offers.
type harnessConfig struct {
	templates map[string]spec.Sandbox
	egress    local.EgressOptions
	wrap      func(*local.Backend) sandbox.Backend
}

func newHarnessWith(t *testing.T, cfg harnessConfig) *harness {
	t.Helper()
	templates := cfg.templates
	testutil.RequireRoot(t)
	stateDir := runcodetest.StateDir(t)
	parent := runcodetest.CgroupParent(t)
	dir := t.TempDir()
	h := &harness{logs: &testutil.SyncBuffer{}, reg: prometheus.NewRegistry()}
	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	// Images and snapshots in the test's own directory, never the host's store.
	h.backend, err = local.New(context.Background(), local.Options{StateDir: stateDir, ImageCacheDir: filepath.Join(stateDir, "images"), AgentPath: agentBin, CgroupParent: parent, Logger: log, Egress: cfg.egress})
	if err != nil {
		t.Fatal(err)
	}
	var backend sandbox.Backend = h.backend
	if cfg.wrap != nil {
		backend = cfg.wrap(h.backend)
	}
	_, h.key, _ = ed25519.GenerateKey(rand.Reader)
	h.srv, err = server.New(server.Options{
		Backend: backend, Templates: templates, APIKeys: []string{testAPIKey}, SigningKey: h.key,
		MaxTokenTTL: 30 * time.Minute, Logger: log, Registry: h.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.sock = filepath.Join(dir, "airlock.sock")
	uln, err := server.ListenUnix(h.sock, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cert, pool := selfSigned(t)
	h.tlsConf = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	h.tcpURL = "https://" + tln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- h.srv.Serve(ctx,
			server.Endpoint{Listener: uln, Transport: server.Unix},
			server.Endpoint{Listener: tln, Transport: server.TCP, TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	}()
	h.c, err = client.Dial(h.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.c.Close()
		bctx := context.Background()
		list, _ := h.backend.List(bctx)
		for _, s := range list {
			if err := h.backend.Terminate(bctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		h.backend.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", h.logs.String())
		}
	})
	return h
}

// clientWith returns a client with the given options, closed when the test ends.
func (h *harness) clientWith(t *testing.T, o client.Options) *client.Client {
	t.Helper()
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// selfSigned makes a loopback server certificate and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k, Leaf: leaf}, pool
}

// hostDecl is a small declaration the local runtime can honour.
func hostDecl(id string, labels map[string]string) spec.Sandbox {
	return spec.Sandbox{ID: id, Image: spec.Image{Host: true}, Labels: labels,
		Session: spec.Session{MaxLifetimeSeconds: new(int64(600))}}
}
