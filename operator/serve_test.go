package operator

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/airlock-sandbox/airlock/operator/brokerapi"
)

// writeCertPair writes a self-signed certificate with the given serial into dir as tls.crt/tls.key.
func writeCertPair(t *testing.T, dir string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "airlock-broker.airlock-system.svc"},
		DNSNames: []string{"airlock-broker.airlock-system.svc"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// secretVolume lays files out as the kubelet does for a Secret volume: tls.crt -> ..data/tls.crt,
// ..data -> a timestamped directory, swapped atomically on update.
type secretVolume struct {
	t   *testing.T
	dir string
	n   int
}

func newSecretVolume(t *testing.T) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(v.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// update writes a new pair with serial into a fresh directory and swaps ..data to it.
func (v *secretVolume) update(serial int64) {
	v.n++
	ts := filepath.Join(v.dir, "..2026_"+strings.Repeat("x", v.n))
	writeCertPair(v.t, ts, serial)
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

func (v *secretVolume) reloader() *CertReloader {
	return &CertReloader{CertFile: filepath.Join(v.dir, "tls.crt"), KeyFile: filepath.Join(v.dir, "tls.key"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// servedSerial makes a new TLS connection to addr and returns the serial of the certificate served.
func servedSerial(t *testing.T, addr string) int64 {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the serial is what is checked
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// startServer serves s on a loopback port until the returned stop is called; stop returns Serve's error.
func startServer(t *testing.T, s *BrokerServer) (addr string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	stop = func() error {
		once.Do(func() { cancel(); serveErr = <-errc })
		return serveErr
	}
	t.Cleanup(func() { stop() })
	return ln.Addr().String(), stop
}

// TestCertReloadWithoutRestart: the broker serves a rotated certificate on the next connection,
// as the kubelet swaps the Secret volume; a broken update keeps the previous certificate.
func TestCertReloadWithoutRestart(t *testing.T) {
	f := newBrokerFixture(t, 0)
	vol := newSecretVolume(t)
	vol.update(1)
	addr, stop := startServer(t, &BrokerServer{Broker: f.broker(), TLS: vol.reloader(), Log: f.broker().Log})
	if got := servedSerial(t, addr); got != 1 {
		t.Fatalf("serial %d, want 1", got)
	}
	vol.update(2)
	if got := servedSerial(t, addr); got != 2 {
		t.Fatalf("after rotation: serial %d, want 2 (no reload)", got)
	}
	// A key that does not match its certificate: the previous pair stays in service.
	bad := filepath.Join(vol.dir, "..bad")
	writeCertPair(t, bad, 3)
	other := t.TempDir()
	writeCertPair(t, other, 4)
	key, _ := os.ReadFile(filepath.Join(other, "tls.key"))
	if err := os.WriteFile(filepath.Join(bad, "tls.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..bad", filepath.Join(vol.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(vol.dir, "..data_tmp"), filepath.Join(vol.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, addr); got != 2 {
		t.Fatalf("after a broken update: serial %d, want the previous 2", got)
	}
	vol.update(5)
	if got := servedSerial(t, addr); got != 5 {
		t.Fatalf("after a good update: serial %d, want 5", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestCertReloaderRefusesToStartWithoutACertificate(t *testing.T) {
	f := newBrokerFixture(t, 0)
	vol := newSecretVolume(t) // ..data points nowhere yet
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = (&BrokerServer{Broker: f.broker(), TLS: vol.reloader()}).Serve(context.Background(), ln)
	if err == nil || !strings.Contains(err.Error(), "tls.crt") {
		t.Fatalf("Serve without a certificate: %v, want an error naming the file", err)
	}
}

// TestDrainFinishesClaimsInFlight: when the broker is told to stop, a claim already running
// completes with its grant, new connections are refused, and Serve returns nil.
func TestDrainFinishesClaimsInFlight(t *testing.T) {
	f := newBrokerFixture(t, 1)
	entered, release := make(chan struct{}), make(chan struct{})
	br := f.broker()
	br.FirstCall = func(context.Context, string, string) error {
		close(entered)
		<-release
		return nil
	}
	addr, stop := startServer(t, &BrokerServer{Broker: br, DrainTimeout: time.Minute, Log: br.Log})
	type result struct {
		code int
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		js, _ := json.Marshal(brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"})
		req, _ := http.NewRequest("POST", "http://"+addr+brokerapi.PathClaim, bytes.NewReader(js))
		req.Header.Set("Authorization", "Bearer user:alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{code: resp.StatusCode, body: b}
	}()
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The listener closes: new connections are refused while the claim is still running.
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		select {
		case err := <-stopped:
			t.Fatalf("Serve returned (%v) with a claim in flight", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(release)
	r := <-done
	if r.err != nil || r.code != http.StatusOK {
		t.Fatalf("claim in flight during drain: HTTP %d %s %v, want 200", r.code, r.body, r.err)
	}
	var g brokerapi.Grant
	if err := json.Unmarshal(r.body, &g); err != nil || g.ExecuteToken == "" {
		t.Fatalf("grant %s: %v", r.body, err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Serve after a complete drain: %v", err)
	}
}

// TestDrainTimeout: a claim that outlives the drain timeout is cut off and Serve says so.
func TestDrainTimeout(t *testing.T) {
	f := newBrokerFixture(t, 1)
	entered, release := make(chan struct{}), make(chan struct{})
	br := f.broker()
	br.FirstCall = func(ctx context.Context, _, _ string) error {
		close(entered)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	addr, stop := startServer(t, &BrokerServer{Broker: br, DrainTimeout: 50 * time.Millisecond})
	done := make(chan struct{})
	go func() {
		defer close(done)
		js, _ := json.Marshal(brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"})
		req, _ := http.NewRequest("POST", "http://"+addr+brokerapi.PathClaim, bytes.NewReader(js))
		req.Header.Set("Authorization", "Bearer user:alice")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	if err := stop(); err == nil || !strings.Contains(err.Error(), "in flight") {
		t.Fatalf("Serve: %v, want the drain timeout named", err)
	}
	close(release)
	<-done
}

// TestHealthzTurnsUnreadyWhileDraining: /healthz is 204 while serving and 503 once draining
// (on a connection opened before), so the Service stops routing claims to a stopping replica.
func TestHealthzTurnsUnreadyWhileDraining(t *testing.T) {
	f := newBrokerFixture(t, 0)
	s := &BrokerServer{Broker: f.broker()}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		draining bool
		want     int
	}{{false, http.StatusNoContent}, {true, http.StatusServiceUnavailable}} {
		s.draining.Store(tc.draining)
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("draining %v: /healthz %d, want %d", tc.draining, resp.StatusCode, tc.want)
		}
	}
}

// TestReplicasNeverClaimTwice: brokers of several replicas, each with its own informer cache that
// never catches up (every pod looks idle to every replica forever), claim concurrently against one
// API: each pod goes to exactly one claimer, and exactly as many claims succeed as there are pods.
// So too with idle queues (IdlePods) fed from those stale caches: in disjoint shards, and with
// every replica handing out every pod (the resourceVersion precondition is the arbiter).
func TestReplicasNeverClaimTwice(t *testing.T) {
	for _, mode := range []string{"list", "idle queues, disjoint shards", "idle queues, every pod in every replica"} {
		t.Run(mode, func(t *testing.T) { replicasNeverClaimTwice(t, mode) })
	}
}

func replicasNeverClaimTwice(t *testing.T, mode string) {
	const pods, replicas, claimers = 8, 3, 32
	f := newBrokerFixture(t, pods)
	// The stale caches: a snapshot of the API before any claim.
	var snapshot []client.Object
	for _, p := range listPods(t, f) {
		snapshot = append(snapshot, p.DeepCopy())
	}
	var servers []*httptest.Server
	for i := range replicas {
		br := f.broker()
		br.Reader = fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(append(snapshot, sbx("box", nil))...).Build()
		if mode != "list" {
			br.Idle = &IdlePods{}
			if mode == "idle queues, disjoint shards" {
				br.Idle.Shard, br.Idle.Shards = uint32(i), replicas
			}
			for _, p := range snapshot {
				br.Idle.Observe(p)
			}
		}
		srv := httptest.NewServer(br.Handler())
		defer srv.Close()
		servers = append(servers, srv)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := map[string]string{} // pod → session
	ok, empty := 0, 0
	var errs []error
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			js, _ := json.Marshal(brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"})
			req, _ := http.NewRequest("POST", servers[i%replicas].URL+brokerapi.PathClaim, bytes.NewReader(js))
			req.Header.Set("Authorization", "Bearer user:alice")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			mu.Lock()
			defer mu.Unlock()
			switch resp.StatusCode {
			case http.StatusOK:
				var g brokerapi.Grant
				if err := json.Unmarshal(b, &g); err != nil {
					errs = append(errs, err)
					return
				}
				if prev, dup := granted[g.Pod]; dup {
					errs = append(errs, errors.New("pod "+g.Pod+" granted twice: sessions "+prev+" and "+g.Session.ID))
				}
				granted[g.Pod] = g.Session.ID
				ok++
			case http.StatusServiceUnavailable:
				empty++
			default:
				errs = append(errs, errors.New("HTTP "+resp.Status+": "+string(b)))
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if ok != pods || empty != claimers-pods {
		t.Errorf("%d claims granted, %d answered empty; want %d and %d", ok, empty, pods, claimers-pods)
	}
	// Every pod is claimed once, by the owner the grant names.
	for _, p := range listPods(t, f) {
		if p.Labels[LabelState] != StateClaimed || p.Annotations[AnnotationOwner] != "alice" {
			t.Errorf("pod %s: state %s owner %q", p.Name, p.Labels[LabelState], p.Annotations[AnnotationOwner])
		}
	}
}

func listPods(t *testing.T, f *brokerFixture) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	if err := f.c.List(context.Background(), &l, client.InNamespace("ns")); err != nil {
		t.Fatal(err)
	}
	return l.Items
}
