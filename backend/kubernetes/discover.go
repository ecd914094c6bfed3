package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	kubeconfigv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Where a cluster is found.
const (
	// DefaultBrokerService is the broker's Service (deploy/base/operator.yaml), as
	// namespace/name:port.
	DefaultBrokerService = "airlock-system/airlock-broker:443"
	// DefaultServiceAccountDir is where Kubernetes mounts a pod's ServiceAccount token,
	// namespace and the cluster's CA.
	DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// DefaultCAFile is where a pod may mount the CA of the broker's certificate (next to
	// DefaultTokenFile, e.g. a projected volume with a ConfigMap source).
	DefaultCAFile = "/var/run/secrets/airlock/ca.crt"
	// tokenRequestSeconds is the life asked of a token from the TokenRequest API.
	tokenRequestSeconds = 3600
)

// Discovery says how to find the cluster's broker; Discover turns it into a Config. Three ways,
// the first that applies:
//   - BrokerURL set: that URL, directly, with TokenFile (default DefaultTokenFile) and CAFile.
//   - In a pod (KUBERNETES_SERVICE_HOST set and a ServiceAccount mounted), unless Kubeconfig is
//     set: the broker's Service DNS name, the pod's namespace, and a token with audience
//     airlock-broker: TokenFile, else DefaultTokenFile if mounted, else one the pod's
//     ServiceAccount asks the TokenRequest API for (for itself, or ServiceAccount).
//   - A kubeconfig (Kubeconfig, else $KUBECONFIG, else ~/.kube/config; Context, else its
//     current context): the broker and the claimed pods' agents through the API server's
//     service and pod proxies, as kubectl reaches them, with a token from the TokenRequest API
//     for ServiceAccount (or TokenFile). The API server consumes the Authorization header (the
//     kubeconfig's credential), so the broker's and the agent's tokens travel in
//     brokerapi.HeaderAuthorization.
type Discovery struct {
	Kubeconfig string // a path, or a list joined like $KUBECONFIG
	Context    string
	// Namespace holds the Sandboxes (default: the pod's namespace, or the context's, or "default").
	Namespace string
	// ServiceAccount ("name" or "namespace/name"; namespace default Namespace) is who the broker
	// sees: the caller asks the TokenRequest API for its token, so the caller needs create on
	// serviceaccounts/token for it, and it needs the claim right.
	ServiceAccount string
	// Sandbox serves declarations with generated ids (Config.Sandbox).
	Sandbox string
	// Broker is the broker's Service as namespace/name:port (default DefaultBrokerService).
	Broker     string
	BrokerURL  string
	TokenFile  string
	CAFile     string
	ServerName string
	// DirectAgents dials the claimed pods' addresses from a kubeconfig too (the pod network
	// routes from here) instead of the API server's pod proxy.
	DirectAgents bool

	// ServiceAccountDir (default DefaultServiceAccountDir) and Getenv (default os.Getenv) are
	// what a pod is recognised by; tests give others.
	ServiceAccountDir string
	Getenv            func(string) string
}

// Discover turns d into a Config, and says how it found the cluster (for messages). It reads
// files; it makes no call (tokens are asked for at the first broker call).
func Discover(ctx context.Context, d Discovery) (Config, string, error) {
	if d.Getenv == nil {
		d.Getenv = os.Getenv
	}
	if d.ServiceAccountDir == "" {
		d.ServiceAccountDir = DefaultServiceAccountDir
	}
	if d.Broker == "" {
		d.Broker = DefaultBrokerService
	}
	svcNS, svcName, svcPort, err := parseService(d.Broker)
	if err != nil {
		return Config{}, "", err
	}
	cfg, how, err := discover(ctx, d, svcNS, svcName, svcPort)
	if err != nil {
		return Config{}, "", err
	}
	cfg.Sandbox = d.Sandbox
	if d.Sandbox != "" {
		how += ", runs from Sandbox " + d.Sandbox
	}
	return cfg, how, nil
}

func discover(ctx context.Context, d Discovery, svcNS, svcName string, svcPort int) (Config, string, error) {
	inPod := d.Getenv("KUBERNETES_SERVICE_HOST") != "" && exists(filepath.Join(d.ServiceAccountDir, "token"))
	podNS := ""
	if inPod {
		b, err := os.ReadFile(filepath.Join(d.ServiceAccountDir, "namespace"))
		if err != nil {
			return Config{}, "", fmt.Errorf("%w: kubernetes: the pod's ServiceAccount namespace: %v", sandbox.ErrInvalid, err)
		}
		podNS = strings.TrimSpace(string(b))
	}
	switch {
	case d.BrokerURL != "":
		ns := first(d.Namespace, podNS)
		if ns == "" {
			return Config{}, "", fmt.Errorf("%w: kubernetes: namespace is empty: set the namespace of your Sandboxes (config kubernetes.namespace)", sandbox.ErrInvalid)
		}
		return Config{BrokerURL: d.BrokerURL, Namespace: ns, TokenFile: d.TokenFile, CAFile: d.CAFile, ServerName: d.ServerName},
			"broker " + d.BrokerURL + " (configured)", nil
	case inPod && d.Kubeconfig == "":
		return inCluster(d, podNS, svcNS, svcName, svcPort)
	}
	return fromKubeconfig(ctx, d, svcNS, svcName, svcPort)
}

func inCluster(d Discovery, podNS, svcNS, svcName string, svcPort int) (Config, string, error) {
	host := svcName + "." + svcNS + ".svc"
	u := "https://" + host
	if svcPort != 443 {
		u += ":" + strconv.Itoa(svcPort)
	}
	cfg := Config{BrokerURL: u, Namespace: first(d.Namespace, podNS), CAFile: d.CAFile, ServerName: d.ServerName}
	if cfg.CAFile == "" && exists(DefaultCAFile) {
		cfg.CAFile = DefaultCAFile
	}
	how := "in-cluster: broker " + u + ", namespace " + cfg.Namespace
	switch {
	case d.TokenFile != "":
		cfg.TokenFile = d.TokenFile
	case d.ServiceAccount == "" && exists(DefaultTokenFile):
		cfg.TokenFile = DefaultTokenFile
		how += ", token " + DefaultTokenFile
	default:
		// The mounted token's audience is the API server's, which the broker refuses (a
		// token it accepted could be replayed at the API server): ask for one for the broker.
		sa := d.ServiceAccount
		saDir := d.ServiceAccountDir
		if sa == "" {
			raw, err := os.ReadFile(filepath.Join(saDir, "token"))
			if err != nil {
				return Config{}, "", fmt.Errorf("%w: kubernetes: the pod's ServiceAccount token: %v", sandbox.ErrInvalid, err)
			}
			if sa, err = serviceAccountOf(string(raw)); err != nil {
				return Config{}, "", err
			}
		}
		saNS, saName := splitSA(sa, cfg.Namespace)
		server := "https://" + net.JoinHostPort(d.Getenv("KUBERNETES_SERVICE_HOST"), first(d.Getenv("KUBERNETES_SERVICE_PORT"), "443"))
		ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
		if err != nil {
			return Config{}, "", fmt.Errorf("%w: kubernetes: the cluster's CA: %v", sandbox.ErrInvalid, err)
		}
		api, err := newAPIClient(&kubeconfigv1.Cluster{Server: server, CertificateAuthorityData: ca},
			&kubeconfigv1.AuthInfo{TokenFile: filepath.Join(saDir, "token")}, "")
		if err != nil {
			return Config{}, "", err
		}
		cfg.Token = api.tokenSource(saNS, saName)
		cfg.closers = append(cfg.closers, api.hc.CloseIdleConnections)
		how += ", token from the TokenRequest API for " + saNS + "/" + saName
	}
	return cfg, how, nil
}

func fromKubeconfig(_ context.Context, d Discovery, svcNS, svcName string, svcPort int) (Config, string, error) {
	paths := first(d.Kubeconfig, d.Getenv("KUBECONFIG"))
	if paths == "" {
		home, _ := os.UserHomeDir()
		if home == "" || !exists(filepath.Join(home, ".kube", "config")) {
			return Config{}, "", fmt.Errorf("%w: kubernetes: no cluster found: not in a pod (no ServiceAccount at %s), and no kubeconfig ($KUBECONFIG unset, no ~/.kube/config): set kubernetes.kubeconfig, or the broker URL (kubernetes.brokerURL) with kubernetes.tokenFile",
				sandbox.ErrInvalid, d.ServiceAccountDir)
		}
		paths = filepath.Join(home, ".kube", "config")
	}
	kc, err := loadKubeconfig(paths)
	if err != nil {
		return Config{}, "", err
	}
	ctxName := first(d.Context, kc.CurrentContext)
	if ctxName == "" {
		return Config{}, "", fmt.Errorf("%w: kubernetes: kubeconfig %s has no current context: set kubernetes.context", sandbox.ErrInvalid, paths)
	}
	kctx, ok := kc.contexts[ctxName]
	if !ok {
		return Config{}, "", fmt.Errorf("%w: kubernetes: kubeconfig %s has no context %q", sandbox.ErrInvalid, paths, ctxName)
	}
	cluster, ok := kc.clusters[kctx.Cluster]
	if !ok {
		return Config{}, "", fmt.Errorf("%w: kubernetes: kubeconfig %s: context %q names cluster %q, which it does not define", sandbox.ErrInvalid, paths, ctxName, kctx.Cluster)
	}
	user, ok := kc.users[kctx.AuthInfo]
	if !ok && kctx.AuthInfo != "" {
		return Config{}, "", fmt.Errorf("%w: kubernetes: kubeconfig %s: context %q names user %q, which it does not define", sandbox.ErrInvalid, paths, ctxName, kctx.AuthInfo)
	}
	api, err := newAPIClient(&cluster, &user, ctxName)
	if err != nil {
		return Config{}, "", err
	}
	ns := first(d.Namespace, kctx.Namespace, "default")
	cfg := Config{Namespace: ns, HTTPClient: api.hc, closers: []func(){api.hc.CloseIdleConnections}}
	cfg.BrokerURL = api.server + "/api/v1/namespaces/" + svcNS + "/services/https:" + svcName + ":" + strconv.Itoa(svcPort) + "/proxy"
	how := fmt.Sprintf("kubeconfig context %s: broker through the API server's service proxy (%s), namespace %s", ctxName, api.server, ns)
	switch {
	case d.TokenFile != "":
		cfg.TokenFile = d.TokenFile
	case d.ServiceAccount != "":
		saNS, saName := splitSA(d.ServiceAccount, ns)
		cfg.Token = api.tokenSource(saNS, saName)
		how += ", as ServiceAccount " + saNS + "/" + saName
	default:
		return Config{}, "", fmt.Errorf("%w: kubernetes: from a kubeconfig the broker needs a ServiceAccount to act as (it authenticates ServiceAccount tokens for audience %s): set kubernetes.serviceAccount to one in namespace %s that may claim (a RoleBinding to ClusterRole airlock-sandbox-claimer) and that you may create tokens for (create on serviceaccounts/token), or kubernetes.tokenFile",
			sandbox.ErrInvalid, brokerapi.DefaultAudience, ns)
	}
	if !d.DirectAgents {
		cfg.AgentHTTPClient = api.streamHC
		cfg.AgentBase = func(g *brokerapi.Grant) (string, error) {
			_, port, err := net.SplitHostPort(strings.TrimPrefix(g.Endpoint, "tcp:"))
			if err != nil || g.Pod == "" || g.Session.Namespace == "" {
				return "", fmt.Errorf("%w: broker gave pod %q in namespace %q, endpoint %q: the pod proxy needs all three (an older broker?)", sandbox.ErrOutcomeUnknown, g.Pod, g.Session.Namespace, g.Endpoint)
			}
			return api.server + "/api/v1/namespaces/" + g.Session.Namespace + "/pods/" + g.Pod + ":" + port + "/proxy", nil
		}
		cfg.closers = append(cfg.closers, api.streamHC.CloseIdleConnections)
		how += "; agents through its pod proxy"
	}
	return cfg, how, nil
}

// kubeconfig is one or more kubeconfig files merged as kubectl merges them: the first file
// that sets a value (the current context, a named cluster, user or context) wins.
type kubeconfig struct {
	CurrentContext string
	clusters       map[string]kubeconfigv1.Cluster
	users          map[string]kubeconfigv1.AuthInfo
	contexts       map[string]kubeconfigv1.Context
}

func loadKubeconfig(paths string) (*kubeconfig, error) {
	kc := &kubeconfig{clusters: map[string]kubeconfigv1.Cluster{}, users: map[string]kubeconfigv1.AuthInfo{}, contexts: map[string]kubeconfigv1.Context{}}
	read := 0
	for _, p := range filepath.SplitList(paths) {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) && strings.Contains(paths, string(filepath.ListSeparator)) {
			continue // kubectl skips missing files of a list
		}
		if err != nil {
			return nil, fmt.Errorf("%w: kubernetes: kubeconfig: %v", sandbox.ErrInvalid, err)
		}
		var f kubeconfigv1.Config
		if err := yaml.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("%w: kubernetes: kubeconfig %s: %v", sandbox.ErrInvalid, p, err)
		}
		read++
		dir := filepath.Dir(p)
		// Relative file names in a kubeconfig are relative to the file.
		abs := func(s string) string {
			if s == "" || filepath.IsAbs(s) {
				return s
			}
			return filepath.Join(dir, s)
		}
		if kc.CurrentContext == "" {
			kc.CurrentContext = f.CurrentContext
		}
		for _, c := range f.Clusters {
			if _, seen := kc.clusters[c.Name]; !seen {
				c.Cluster.CertificateAuthority = abs(c.Cluster.CertificateAuthority)
				kc.clusters[c.Name] = c.Cluster
			}
		}
		for _, u := range f.AuthInfos {
			if _, seen := kc.users[u.Name]; !seen {
				u.AuthInfo.ClientCertificate = abs(u.AuthInfo.ClientCertificate)
				u.AuthInfo.ClientKey = abs(u.AuthInfo.ClientKey)
				u.AuthInfo.TokenFile = abs(u.AuthInfo.TokenFile)
				kc.users[u.Name] = u.AuthInfo
			}
		}
		for _, c := range f.Contexts {
			if _, seen := kc.contexts[c.Name]; !seen {
				kc.contexts[c.Name] = c.Context
			}
		}
	}
	if read == 0 {
		return nil, fmt.Errorf("%w: kubernetes: no kubeconfig file in %q", sandbox.ErrInvalid, paths)
	}
	return kc, nil
}

// apiClient calls one API server with one kubeconfig user's credential.
type apiClient struct {
	server string
	// hc has a timeout (calls); streamHC has none (agent streams through the pod proxy).
	hc, streamHC *http.Client
}

// newAPIClient checks the cluster and user entries and builds clients for them. What airlock
// cannot use is refused, naming the field.
func newAPIClient(c *kubeconfigv1.Cluster, u *kubeconfigv1.AuthInfo, ctxName string) (*apiClient, error) {
	where := "kubeconfig"
	if ctxName != "" {
		where = "kubeconfig context " + ctxName
	}
	su, err := url.Parse(c.Server)
	if err != nil || su.Scheme != "https" || su.Host == "" {
		return nil, fmt.Errorf("%w: kubernetes: %s: server %q is not https://host[:port]", sandbox.ErrInvalid, where, c.Server)
	}
	if c.InsecureSkipTLSVerify {
		return nil, fmt.Errorf("%w: kubernetes: %s: insecure-skip-tls-verify: airlock sends ServiceAccount and capability tokens through this server; give certificate-authority(-data) instead", sandbox.ErrInvalid, where)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	ca := c.CertificateAuthorityData
	if len(ca) == 0 && c.CertificateAuthority != "" {
		if ca, err = os.ReadFile(c.CertificateAuthority); err != nil {
			return nil, fmt.Errorf("%w: kubernetes: %s: certificate-authority: %v", sandbox.ErrInvalid, where, err)
		}
	}
	if len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("%w: kubernetes: %s: certificate-authority holds no PEM certificate", sandbox.ErrInvalid, where)
		}
		tc.RootCAs = pool
	}
	switch {
	case u.Exec != nil:
		return nil, fmt.Errorf("%w: kubernetes: %s: user credential plugin (exec %q) is not supported yet; use a kubeconfig with a client certificate or token, or kubernetes.brokerURL with a token file", sandbox.ErrUnsupported, where, u.Exec.Command)
	case u.AuthProvider != nil:
		return nil, fmt.Errorf("%w: kubernetes: %s: auth-provider %q is not supported; use a client certificate or token", sandbox.ErrUnsupported, where, u.AuthProvider.Name)
	case u.Username != "" || u.Password != "":
		return nil, fmt.Errorf("%w: kubernetes: %s: basic authentication (username/password) is not supported; use a client certificate or token", sandbox.ErrUnsupported, where)
	case u.Impersonate != "" || len(u.ImpersonateGroups) > 0:
		return nil, fmt.Errorf("%w: kubernetes: %s: impersonation (as/as-groups) is not supported", sandbox.ErrUnsupported, where)
	}
	certPEM, keyPEM := u.ClientCertificateData, u.ClientKeyData
	if len(certPEM) == 0 && u.ClientCertificate != "" {
		if certPEM, err = os.ReadFile(u.ClientCertificate); err != nil {
			return nil, fmt.Errorf("%w: kubernetes: %s: client-certificate: %v", sandbox.ErrInvalid, where, err)
		}
	}
	if len(keyPEM) == 0 && u.ClientKey != "" {
		if keyPEM, err = os.ReadFile(u.ClientKey); err != nil {
			return nil, fmt.Errorf("%w: kubernetes: %s: client-key: %v", sandbox.ErrInvalid, where, err)
		}
	}
	if len(certPEM) > 0 || len(keyPEM) > 0 {
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%w: kubernetes: %s: client certificate and key: %v", sandbox.ErrInvalid, where, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	var bearer func() (string, error)
	switch {
	case u.Token != "":
		tok := u.Token
		bearer = func() (string, error) { return tok, nil }
	case u.TokenFile != "":
		f := u.TokenFile // re-read: a projected or rotated token
		bearer = func() (string, error) {
			b, err := os.ReadFile(f)
			if err != nil {
				return "", fmt.Errorf("%w: kubernetes: API server token: %v", sandbox.ErrUnauthenticated, err)
			}
			return strings.TrimSpace(string(b)), nil
		}
	case len(tc.Certificates) == 0:
		return nil, fmt.Errorf("%w: kubernetes: %s: the user has no credential airlock can use (client certificate, token or tokenFile)", sandbox.ErrInvalid, where)
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 10 * time.Second,
		// HTTP/2 to the API server: one connection carries every call, and a request body can
		// still be sent while the answer streams (exec with stdin through the pod proxy).
		ForceAttemptHTTP2:  true,
		MaxIdleConns:       16,
		IdleConnTimeout:    90 * time.Second,
		DisableCompression: true,
	}
	if c.ProxyURL != "" {
		pu, err := url.Parse(c.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf("%w: kubernetes: %s: proxy-url %q: %v", sandbox.ErrInvalid, where, c.ProxyURL, err)
		}
		tr.Proxy = http.ProxyURL(pu)
	}
	rt := &proxyAuth{next: tr, bearer: bearer}
	return &apiClient{server: strings.TrimSuffix(su.String(), "/"),
		hc: &http.Client{Timeout: 90 * time.Second, Transport: rt}, streamHC: &http.Client{Transport: rt}}, nil
}

// proxyAuth sends requests to the API server: the Authorization a caller set (the broker's or
// agent's token) moves to brokerapi.HeaderAuthorization, which the API server's proxies pass
// on, and Authorization carries the kubeconfig's bearer token (if it has one rather than a
// client certificate).
type proxyAuth struct {
	next   http.RoundTripper
	bearer func() (string, error)
}

func (p *proxyAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if a := r.Header.Get("Authorization"); a != "" {
		r.Header.Del("Authorization")
		r.Header.Set(brokerapi.HeaderAuthorization, a)
	}
	if p.bearer != nil {
		tok, err := p.bearer()
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	return p.next.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the transport.
func (p *proxyAuth) CloseIdleConnections() {
	if c, ok := p.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// tokenSource returns a Config.Token that asks the TokenRequest API for ServiceAccount ns/name's
// token with the broker's audience, and reuses it until a fifth of its life is left.
func (a *apiClient) tokenSource(ns, name string) func(context.Context) (string, error) {
	var (
		mu      sync.Mutex
		tok     string
		renewAt time.Time
	)
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if tok != "" && time.Now().Before(renewAt) {
			return tok, nil
		}
		t, exp, err := a.requestToken(ctx, ns, name)
		if err != nil {
			return "", err
		}
		now := time.Now()
		tok, renewAt = t, now.Add(exp.Sub(now)*4/5)
		return tok, nil
	}
}

func (a *apiClient) requestToken(ctx context.Context, ns, name string) (string, time.Time, error) {
	secs := int64(tokenRequestSeconds)
	body, _ := json.Marshal(tokenRequest{APIVersion: "authentication.k8s.io/v1", Kind: "TokenRequest",
		Spec: tokenRequestSpec{Audiences: []string{brokerapi.DefaultAudience}, ExpirationSeconds: secs}})
	u := a.server + "/api/v1/namespaces/" + url.PathEscape(ns) + "/serviceaccounts/" + url.PathEscape(name) + "/token"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: kubernetes: TokenRequest for ServiceAccount %s/%s: %w", sandbox.ErrUnreachable, ns, name, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		var st struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(raw, &st)
		class := sandbox.ErrUnreachable
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			class = sandbox.ErrUnauthenticated
		case http.StatusForbidden:
			class = sandbox.ErrForbidden
		case http.StatusNotFound:
			class = sandbox.ErrNotFound
		}
		return "", time.Time{}, fmt.Errorf("%w: kubernetes: TokenRequest for ServiceAccount %s/%s (audience %s): HTTP %d: %s",
			class, ns, name, brokerapi.DefaultAudience, resp.StatusCode, first(st.Message, strings.TrimSpace(string(raw))))
	}
	var tr tokenRequest
	if err := json.Unmarshal(raw, &tr); err != nil || tr.Status.Token == "" {
		return "", time.Time{}, fmt.Errorf("%w: kubernetes: TokenRequest for ServiceAccount %s/%s: answer without a token: %v", sandbox.ErrUnreachable, ns, name, err)
	}
	exp := tr.Status.ExpirationTimestamp
	if exp.IsZero() {
		exp = time.Now().Add(10 * time.Minute)
	}
	return tr.Status.Token, exp, nil
}

// tokenRequest is the subset of k8s.io/api/authentication/v1.TokenRequest airlock sends and
// reads. Not that type: it brings k8s.io/apimachinery's meta/v1 into the CLI, which every
// command pays for at start (measured: +3 MB of binary and ~0.35 ms of package init for meta/v1
// alone), and the CLI's run path is kept free of Kubernetes SDK weight (DESIGN.md). The wire
// names are the API's; TestDiscoverInCluster's fake API server decodes it with the real type.
type tokenRequest struct {
	APIVersion string           `json:"apiVersion,omitempty"`
	Kind       string           `json:"kind,omitempty"`
	Spec       tokenRequestSpec `json:"spec"`
	Status     struct {
		Token               string    `json:"token"`
		ExpirationTimestamp time.Time `json:"expirationTimestamp"`
	} `json:"status"`
}

type tokenRequestSpec struct {
	Audiences         []string `json:"audiences"`
	ExpirationSeconds int64    `json:"expirationSeconds"`
}

// serviceAccountOf reads "namespace/name" from a ServiceAccount token's subject
// ("system:serviceaccount:<ns>:<name>"). The token is not verified: the API server does that
// when it is used.
func serviceAccountOf(jwt string) (string, error) {
	parts := strings.Split(strings.TrimSpace(jwt), ".")
	bad := fmt.Errorf("%w: kubernetes: the pod's ServiceAccount token is not a ServiceAccount JWT", sandbox.ErrInvalid)
	if len(parts) != 3 {
		return "", bad
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", bad
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return "", bad
	}
	rest, ok := strings.CutPrefix(claims.Sub, "system:serviceaccount:")
	ns, name, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || name == "" {
		return "", bad
	}
	return ns + "/" + name, nil
}

// parseService reads "namespace/name:port".
func parseService(s string) (ns, name string, port int, err error) {
	ns, rest, ok := strings.Cut(s, "/")
	name, ps, ok2 := strings.Cut(rest, ":")
	port, perr := strconv.Atoi(ps)
	if !ok || !ok2 || ns == "" || name == "" || perr != nil || port < 1 || port > 65535 {
		return "", "", 0, fmt.Errorf("%w: kubernetes: broker service %q: want namespace/name:port, e.g. %s", sandbox.ErrInvalid, s, DefaultBrokerService)
	}
	return ns, name, port, nil
}

func splitSA(sa, defNS string) (ns, name string) {
	if n, m, ok := strings.Cut(sa, "/"); ok {
		return n, m
	}
	return defNS, sa
}

func first(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
