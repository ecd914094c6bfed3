package kubernetes

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// fakeJWT is a token shaped like a ServiceAccount's (unsigned: nothing here verifies it).
func fakeJWT(sub string) string {
	enc := base64.RawURLEncoding
	payload, _ := json.Marshal(map[string]string{"sub": sub})
	return enc.EncodeToString([]byte(`{"alg":"RS256"}`)) + "." + enc.EncodeToString(payload) + ".c2ln"
}

// fakeAPIServer stands in for kube-apiserver where discovery meets it: the TokenRequest API,
// and the service and pod proxies, which (like the real one, k8s.io/apiserver's
// WithAuthentication) authenticate Authorization and delete it before proxying.
type fakeAPIServer struct {
	t      *testing.T
	srv    *httptest.Server
	bearer string // the credential the API server accepts

	mu        sync.Mutex
	requested []string // "ns/name audience" per TokenRequest
	proxied   []string // "path X-Airlock-Authorization" per proxied request
}

func newFakeAPIServer(t *testing.T, bearer string) *fakeAPIServer {
	f := &fakeAPIServer{t: t, bearer: bearer}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", func(w http.ResponseWriter, r *http.Request) {
		var tr authnv1.TokenRequest
		json.NewDecoder(r.Body).Decode(&tr)
		f.mu.Lock()
		f.requested = append(f.requested, r.PathValue("ns")+"/"+r.PathValue("sa")+" "+strings.Join(tr.Spec.Audiences, ","))
		f.mu.Unlock()
		tr.Status = authnv1.TokenRequestStatus{Token: "sa-token-" + r.PathValue("sa"), ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(tr)
	})
	proxied := func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.proxied = append(f.proxied, r.URL.Path+" "+r.Header.Get(brokerapi.HeaderAuthorization))
		f.mu.Unlock()
		rest := r.URL.Path[strings.Index(r.URL.Path, "/proxy/")+len("/proxy"):]
		switch {
		case rest == brokerapi.PathClaim:
			json.NewEncoder(w).Encode(brokerapi.Grant{
				Session:  brokerapi.Session{ID: "s1", Namespace: "apps", Sandbox: "box"},
				Endpoint: "tcp:10.244.0.9:7070", Pod: "box-abc", ExecuteToken: "exec-token", TokenExpiresAt: time.Now().Add(time.Hour),
			})
		case rest == "/v1/health":
			w.Write([]byte(`{"ok":true,"protocolVersion":1}`))
		case rest == "/v1/files/stat":
			w.Write([]byte(`{"name":"/","isDir":true}`))
		default:
			http.NotFound(w, r)
		}
	}
	mux.HandleFunc("/api/v1/namespaces/airlock-system/services/https:airlock-broker:443/proxy/", proxied)
	mux.HandleFunc("/api/v1/namespaces/apps/pods/box-abc:7070/proxy/", proxied)
	f.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+f.bearer {
			http.Error(w, `{"kind":"Status","message":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		r.Header.Del("Authorization")
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPIServer) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// kubeconfigFor writes a kubeconfig for f's server, the CA as a file relative to the kubeconfig.
func kubeconfigFor(t *testing.T, f *fakeAPIServer, user string) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "ca.crt", string(f.caPEM()))
	return writeFile(t, dir, "config", `apiVersion: v1
kind: Config
current-context: test
clusters:
- name: c
  cluster: {server: "`+f.srv.URL+`", certificate-authority: ca.crt}
contexts:
- name: test
  context: {cluster: c, user: u, namespace: apps}
- name: other
  context: {cluster: c, user: u}
users:
- name: u
  user: `+user+`
`)
}

// TestDiscoverKubeconfigThroughAPIServer: from a kubeconfig, the broker and the agent are
// reached through the API server's service and pod proxies, the kubeconfig's credential in
// Authorization (which the API server consumes) and the ServiceAccount token from the
// TokenRequest API, then the capability token, in X-Airlock-Authorization.
func TestDiscoverKubeconfigThroughAPIServer(t *testing.T) {
	f := newFakeAPIServer(t, "kube-cred")
	kc := kubeconfigFor(t, f, "{token: kube-cred}")
	cfg, how, err := Discover(t.Context(), Discovery{Kubeconfig: kc, ServiceAccount: "app", Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Namespace != "apps" || !strings.Contains(how, "service proxy") || !strings.Contains(how, "pod proxy") {
		t.Errorf("namespace %q, how %q", cfg.Namespace, how)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := t.Context()
	g, err := b.Claim(ctx, "box", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx, "box", nil); err != nil { // the ServiceAccount token is reused
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, g.Session.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Stat(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := []string{"apps/app airlock-broker"}; strings.Join(f.requested, ";") != strings.Join(want, ";") {
		t.Errorf("token requests %q, want %q", f.requested, want)
	}
	want := []string{
		"/api/v1/namespaces/airlock-system/services/https:airlock-broker:443/proxy/v1/claim Bearer sa-token-app",
		"/api/v1/namespaces/airlock-system/services/https:airlock-broker:443/proxy/v1/claim Bearer sa-token-app",
		"/api/v1/namespaces/apps/pods/box-abc:7070/proxy/v1/health Bearer exec-token",
		"/api/v1/namespaces/apps/pods/box-abc:7070/proxy/v1/files/stat Bearer exec-token",
	}
	if strings.Join(f.proxied, "\n") != strings.Join(want, "\n") {
		t.Errorf("proxied:\n%s\nwant:\n%s", strings.Join(f.proxied, "\n"), strings.Join(want, "\n"))
	}
}

// TestDiscoverKubeconfigClientCert: a client-certificate user is presented in TLS; the
// context given is used (its namespace: none, so "default"), and a ServiceAccount's namespace.
func TestDiscoverKubeconfigClientCert(t *testing.T) {
	var (
		mu       sync.Mutex
		sawCert  bool
		sawPath  string
		sawCreds string
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sawCert = r.TLS != nil && len(r.TLS.PeerCertificates) == 1
		sawPath, sawCreds = r.URL.Path, r.Header.Get("Authorization")
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(authnv1.TokenRequest{Status: authnv1.TokenRequestStatus{Token: "t", ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}})
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	srv.StartTLS()
	defer srv.Close()
	cert := srv.TLS.Certificates[0] // httptest's certificate serves as the client's too
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFile(t, dir, "ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	writeFile(t, dir, "client.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})))
	writeFile(t, dir, "client.key", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})))
	// Relative file names: relative to the kubeconfig's directory.
	kc := writeFile(t, dir, "config", `current-context: test
clusters: [{name: c, cluster: {server: "`+srv.URL+`", certificate-authority: ca.crt}}]
contexts:
- {name: test, context: {cluster: c, user: u, namespace: apps}}
- {name: other, context: {cluster: c, user: u}}
users: [{name: u, user: {client-certificate: client.crt, client-key: client.key}}]
`)
	cfg, _, err := Discover(t.Context(), Discovery{Kubeconfig: kc, Context: "other", ServiceAccount: "team/app", Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cfg.closers {
			c()
		}
	}()
	if cfg.Namespace != "default" {
		t.Errorf("namespace %q, want default (context other has none)", cfg.Namespace)
	}
	if tok, err := cfg.Token(t.Context()); err != nil || tok != "t" {
		t.Fatalf("token %q, %v", tok, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !sawCert || sawPath != "/api/v1/namespaces/team/serviceaccounts/app/token" || sawCreds != "" {
		t.Errorf("client certificate presented %v, path %q, Authorization %q", sawCert, sawPath, sawCreds)
	}
}

func TestDiscoverKubeconfigRefusals(t *testing.T) {
	f := newFakeAPIServer(t, "x")
	tests := []struct {
		name  string
		user  string
		d     Discovery
		class error
		want  string
	}{
		{"exec plugin", "{exec: {command: aws-iam-authenticator, apiVersion: client.authentication.k8s.io/v1}}", Discovery{ServiceAccount: "app"}, sandbox.ErrUnsupported, "exec"},
		{"auth provider", "{auth-provider: {name: oidc}}", Discovery{ServiceAccount: "app"}, sandbox.ErrUnsupported, "auth-provider"},
		{"basic auth", "{username: a, password: b}", Discovery{ServiceAccount: "app"}, sandbox.ErrUnsupported, "basic"},
		{"no credential", "{}", Discovery{ServiceAccount: "app"}, sandbox.ErrInvalid, "no credential"},
		{"no ServiceAccount", "{token: x}", Discovery{}, sandbox.ErrInvalid, "kubernetes.serviceAccount"},
		{"unknown context", "{token: x}", Discovery{Context: "nope", ServiceAccount: "app"}, sandbox.ErrInvalid, `no context "nope"`},
		{"bad broker service", "{token: x}", Discovery{Broker: "airlock-broker", ServiceAccount: "app"}, sandbox.ErrInvalid, "namespace/name:port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.d.Kubeconfig = kubeconfigFor(t, f, tc.user)
			tc.d.Getenv = func(string) string { return "" }
			_, _, err := Discover(t.Context(), tc.d)
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Discover: %v, want %v naming %q", err, tc.class, tc.want)
			}
		})
	}
	t.Run("insecure-skip-tls-verify", func(t *testing.T) {
		kc := writeFile(t, t.TempDir(), "config", `current-context: c
clusters: [{name: c, cluster: {server: "`+f.srv.URL+`", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: x}}]
`)
		_, _, err := Discover(t.Context(), Discovery{Kubeconfig: kc, ServiceAccount: "app", Getenv: func(string) string { return "" }})
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "insecure-skip-tls-verify") {
			t.Fatalf("Discover: %v", err)
		}
	})
}

// TestKubeconfigListMerges: in a $KUBECONFIG list the first file to set a value wins, and
// missing files of a list are skipped, as kubectl does.
func TestKubeconfigListMerges(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a", `current-context: one
contexts: [{name: one, context: {cluster: c1, user: u, namespace: first}}]
`)
	b := writeFile(t, dir, "b", `current-context: two
clusters: [{name: c1, cluster: {server: "https://one.example"}}]
contexts: [{name: one, context: {cluster: c2, user: u, namespace: second}}]
users: [{name: u, user: {token: t}}]
`)
	kc, err := loadKubeconfig(strings.Join([]string{a, filepath.Join(dir, "missing"), b}, string(filepath.ListSeparator)))
	if err != nil {
		t.Fatal(err)
	}
	if kc.CurrentContext != "one" || kc.contexts["one"].Namespace != "first" || kc.clusters["c1"].Server != "https://one.example" || kc.users["u"].Token != "t" {
		t.Errorf("merged: %+v", kc)
	}
	if _, err := loadKubeconfig(filepath.Join(dir, "missing")); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a single missing kubeconfig: %v, want invalid", err)
	}
}

// TestDiscoverInCluster: in a pod (a fake ServiceAccount mount), the broker is its Service's
// DNS name, the namespace the pod's, and, without a projected broker token, the token comes
// from the TokenRequest API for the pod's own ServiceAccount, asked with the mounted token.
func TestDiscoverInCluster(t *testing.T) {
	saTok := fakeJWT("system:serviceaccount:team:runner")
	f := newFakeAPIServer(t, saTok)
	sa := t.TempDir()
	writeFile(t, sa, "token", saTok)
	writeFile(t, sa, "namespace", "team\n")
	writeFile(t, sa, "ca.crt", string(f.caPEM()))
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(f.srv.URL, "https://"))
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	getenv := func(k string) string { return env[k] }
	if exists(DefaultTokenFile) {
		t.Skipf("%s exists on this machine: it would be preferred", DefaultTokenFile)
	}

	cfg, how, err := Discover(t.Context(), Discovery{ServiceAccountDir: sa, Getenv: getenv})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cfg.closers {
			c()
		}
	}()
	if cfg.BrokerURL != "https://airlock-broker.airlock-system.svc" || cfg.Namespace != "team" || cfg.AgentBase != nil || cfg.HTTPClient != nil {
		t.Errorf("config %+v", cfg)
	}
	if !strings.Contains(how, "in-cluster") || !strings.Contains(how, "team/runner") {
		t.Errorf("how %q", how)
	}
	for range 2 {
		if tok, err := cfg.Token(t.Context()); err != nil || tok != "sa-token-runner" {
			t.Fatalf("token %q, %v", tok, err)
		}
	}
	f.mu.Lock()
	if got := strings.Join(f.requested, ";"); got != "team/runner airlock-broker" {
		t.Errorf("token requests %q, want one for team/runner with the broker's audience", got)
	}
	f.mu.Unlock()

	// A token file given, a namespace given, another broker Service: taken as they are.
	cfg, _, err = Discover(t.Context(), Discovery{ServiceAccountDir: sa, Getenv: getenv, TokenFile: "/t", Namespace: "x", Broker: "ops/broker:8443"})
	if err != nil || cfg.TokenFile != "/t" || cfg.Token != nil || cfg.Namespace != "x" || cfg.BrokerURL != "https://broker.ops.svc:8443" {
		t.Errorf("with a token file: %+v, %v", cfg, err)
	}
	// An explicit kubeconfig wins over the pod's own ServiceAccount.
	kc := kubeconfigFor(t, f, "{token: "+saTok+"}")
	cfg, how, err = Discover(t.Context(), Discovery{ServiceAccountDir: sa, Getenv: getenv, Kubeconfig: kc, ServiceAccount: "app"})
	if err != nil || !strings.Contains(how, "kubeconfig") {
		t.Errorf("explicit kubeconfig in a pod: %q, %v", how, err)
	}
	for _, c := range cfg.closers {
		c()
	}
	// An explicit broker URL: the pod's namespace is still the default.
	cfg, _, err = Discover(t.Context(), Discovery{ServiceAccountDir: sa, Getenv: getenv, BrokerURL: "https://b.example"})
	if err != nil || cfg.Namespace != "team" || cfg.BrokerURL != "https://b.example" {
		t.Errorf("explicit broker URL: %+v, %v", cfg, err)
	}
	// A token that is not a ServiceAccount's.
	writeFile(t, sa, "token", fakeJWT("alice"))
	if _, _, err := Discover(t.Context(), Discovery{ServiceAccountDir: sa, Getenv: getenv}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("non-ServiceAccount token: %v, want invalid", err)
	}
}

func TestServiceAccountOf(t *testing.T) {
	tests := []struct{ tok, want string }{
		{fakeJWT("system:serviceaccount:ns:sa"), "ns/sa"},
		{fakeJWT("system:serviceaccount:ns"), ""},
		{fakeJWT("system:node:n1"), ""},
		{"a.b", ""},
		{"a.!!!.c", ""},
	}
	for _, tc := range tests {
		got, err := serviceAccountOf(tc.tok)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("serviceAccountOf(%q) = %q, %v; want %q", tc.tok, got, err, tc.want)
		}
	}
}
