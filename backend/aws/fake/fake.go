// Package fake is an in-process AWS Lambda MicroVM service for tests: SigV4 verified, real state transitions, injected faults, and a guest behind each MicroVM's endpoint.
package fake

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/airlock-sandbox/airlock/agent"
	awsb "github.com/airlock-sandbox/airlock/backend/aws"
)

// Test credentials the fake accepts.
const (
	AccessKey = "AKIDAIRLOCKFAKE0001"
	SecretKey = "airlock-fake-secret-key/0123456789abcdef"
)

// Guest is what runs inside one MicroVM.
type Guest interface {
	// Serve answers a request the endpoint proxy let through, for a guest port.
	Serve(port int, w http.ResponseWriter, r *http.Request)
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Close ends the guest; it returns once nothing of it runs.
	Close(ctx context.Context) error
}

// RunInfo is what the service knows when it starts a guest.
type RunInfo struct {
	MicrovmID string
	ImageArn  string
	// Connector is set when the MicroVM runs behind an egress connector.
	Connector bool
	Lifetime  time.Duration
	// Guest is the run hook's payload as our agent reads it.
	Guest agent.Config
	// BuiltFrom is the FROM of the bundle the image was built from here ("" for an image the
	// fake was given in Images).
	BuiltFrom string
}

// Starter starts a MicroVM's guest.
type Starter func(ctx context.Context, info RunInfo) (Guest, error)

// Fault is an error answer to inject.
type Fault struct {
	Status     int
	Type       string // x-amzn-ErrorType; "" sends none
	Message    string
	Body       string // raw body, instead of {"message": Message}
	RetryAfter int    // seconds, as Retry-After and retryAfterSeconds
	// AfterWork answers the fault after the operation did its work (an answer lost on the way).
	AfterWork bool
}

// Server is the fake service.
type Server struct {
	Region string
	// Images are the image ARNs RunMicrovm accepts.
	Images []string
	// Connectors are the egress connector ARNs RunMicrovm accepts.
	Connectors []string
	// RestoreFailures is how many requests through a new MicroVM's endpoint answer 502 (empty
	// body) first, as while its snapshot restores.
	RestoreFailures int
	// TerminatingGets is how many GetMicrovm calls answer TERMINATING after a terminate before
	// TERMINATED (a slow delete); the guest is closed before it ends either way.
	TerminatingGets int
	// StartDelayGets is how many GetMicrovm calls answer PENDING without an endpoint first.
	StartDelayGets int
	// Account is the account id in the ARNs of images CreateMicrovmImage makes.
	Account string
	// Buckets are the S3 buckets PutObject accepts.
	Buckets []string
	// BuildSteps is how many GetMicrovmImageVersion reads of a new version answer before its
	// build ends: the first PENDING, the rest IN_PROGRESS.
	BuildSteps int

	start    Starter
	srv      *httptest.Server
	s3srv    *httptest.Server
	signer   *v4.Signer
	s3signer *v4.Signer

	mu      sync.Mutex
	vms     map[string]*vm
	tokens  map[string]string // client token → MicroVM id
	auth    map[string]*authToken
	faults  map[string][]Fault
	calls   map[string]int
	seq     int
	stopped bool

	objects     map[string][]byte // "bucket/key" → bytes
	uploads     map[string]*multipart
	images      map[string]*image // by name
	imageTokens map[string]imageCall
	buildFaults []string // reasons the next builds fail with
}

type vm struct {
	m           awsb.Microvm
	srv         *httptest.Server
	guest       Guest
	restoreLeft int
	pendingLeft int
	termLeft    int
	guestGone   bool
	timer       *time.Timer
	done        chan struct{} // closed once the guest is closed
}

type authToken struct {
	vm      string
	ports   []awsb.AllowedPort
	expires time.Time
}

// New starts the fake; close it with Close.
func New(region string, start Starter) *Server {
	s := &Server{Region: region, Account: "123456789012", start: start, signer: v4.NewSigner(),
		s3signer: v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }),
		vms:      map[string]*vm{}, tokens: map[string]string{}, auth: map[string]*authToken{}, faults: map[string][]Fault{}, calls: map[string]int{},
		objects: map[string][]byte{}, uploads: map[string]*multipart{}, images: map[string]*image{}, imageTokens: map[string]imageCall{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveAPI))
	s.s3srv = httptest.NewServer(http.HandlerFunc(s.serveS3))
	return s
}

// URL is the API endpoint (the backend's aws.endpoint).
func (s *Server) URL() string { return s.srv.URL }

// Credentials are the test credentials, for a backend's Config.
func Credentials() awssdk.CredentialsProvider {
	return awssdk.CredentialsProviderFunc(func(context.Context) (awssdk.Credentials, error) {
		return awssdk.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey, Source: "fake"}, nil
	})
}

// Inject queues faults for an operation ("RunMicrovm", "GetMicrovm", "TerminateMicrovm",
// "SuspendMicrovm", "ResumeMicrovm", "CreateMicrovmAuthToken", "ListMicrovms",
// "CreateMicrovmImage", "UpdateMicrovmImage", "GetMicrovmImage", "GetMicrovmImageVersion",
// "ListMicrovmImageBuilds"; S3's "PutObject", "CreateMultipartUpload", "UploadPart",
// "CompleteMultipartUpload", whose Type is the S3 error code): each call answers the next one
// instead of doing its work.
func (s *Server) Inject(op string, f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[op] = append(s.faults[op], f...)
}

// Tune changes the knobs (RestoreFailures, TerminatingGets, StartDelayGets, Images,
// Connectors) while the service runs; MicroVMs take them when they are run.
func (s *Server) Tune(fn func(s *Server)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s)
}

// ClearFaults drops every fault still queued.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.faults)
}

// Calls is how many requests an operation has received (faults included).
func (s *Server) Calls(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// Running lists the MicroVMs whose guest still runs (anything not fully terminated).
func (s *Server) Running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id, v := range s.vms {
		if !v.guestGone {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// MicroVMs is how many MicroVMs RunMicrovm has made.
func (s *Server) MicroVMs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.vms)
}

// State is a MicroVM's true state ("" when unknown).
func (s *Server) State(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.vms[id]; v != nil {
		return v.m.State
	}
	return ""
}

// Close terminates every guest and stops the servers.
func (s *Server) Close() {
	s.mu.Lock()
	s.stopped = true
	var ids []string
	for id, v := range s.vms {
		if v.m.State != awsb.StateTerminated && v.m.State != awsb.StateTerminating {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.terminate(id, "service stopped")
	}
	s.mu.Lock()
	var waits []chan struct{}
	for _, v := range s.vms {
		waits = append(waits, v.done)
	}
	s.mu.Unlock()
	for _, w := range waits {
		<-w
	}
	s.srv.Close()
	s.s3srv.Close()
}

func writeErr(w http.ResponseWriter, f Fault) {
	if f.Type != "" {
		w.Header().Set("X-Amzn-Errortype", f.Type)
	}
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.Status)
	if f.Body != "" {
		io.WriteString(w, f.Body)
		return
	}
	b := awsb.ErrorBody{Message: f.Message, RetryAfterSeconds: f.RetryAfter}
	json.NewEncoder(w).Encode(b)
}

func errf(status int, typ, format string, a ...any) Fault {
	return Fault{Status: status, Type: typ, Message: fmt.Sprintf(format, a...)}
}

// verify checks the request's SigV4 signature as the service does: known key, the service's
// name, this region (another region is a 404 from the MicroVM API, as the real endpoint
// gives), and a signature recomputed over the same signed headers and payload hash. For s3 the
// payload hash travels in X-Amz-Content-Sha256 and must be the body's.
func (s *Server) verify(r *http.Request, body []byte, service string) *Fault {
	auth := r.Header.Get("Authorization")
	const prefix = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(auth, prefix) {
		f := errf(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
		if service == "s3" {
			f = errf(403, "AccessDenied", "Anonymous access is forbidden for this operation")
		}
		return &f
	}
	parts := map[string]string{}
	for _, p := range strings.Split(strings.TrimPrefix(auth, prefix), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		parts[k] = v
	}
	scope := strings.Split(parts["Credential"], "/")
	if len(scope) != 5 || scope[4] != "aws4_request" {
		f := errf(403, "IncompleteSignatureException", "malformed credential scope")
		return &f
	}
	if scope[0] != AccessKey {
		f := errf(403, "UnrecognizedClientException", "The security token included in the request is invalid.")
		if service == "s3" {
			f = errf(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
		}
		return &f
	}
	if scope[3] != service {
		f := errf(403, "InvalidSignatureException", "Credential should be scoped to correct service: '%s'.", service)
		return &f
	}
	if scope[2] != s.Region {
		if service == "s3" {
			f := errf(400, "AuthorizationHeaderMalformed", "The authorization header is malformed; the region '%s' is wrong; expecting '%s'", scope[2], s.Region)
			return &f
		}
		// The real service answers a request signed for another region with a 404.
		f := Fault{Status: 404, Body: "<UnknownOperationException/>"}
		return &f
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		f := errf(403, "InvalidSignatureException", "missing or bad X-Amz-Date")
		return &f
	}
	sum := sha256.Sum256(body)
	payload := hex.EncodeToString(sum[:])
	signer := s.signer
	if service == "s3" {
		switch h := r.Header.Get("X-Amz-Content-Sha256"); {
		case h == "":
			f := errf(400, "InvalidRequest", "Missing required header for this request: x-amz-content-sha256")
			return &f
		case h == "UNSIGNED-PAYLOAD" || strings.HasPrefix(h, "STREAMING-"):
			// The SDK sends these over TLS only; the fake is plain HTTP and checks every byte.
			f := errf(501, "NotImplemented", "the fake verifies signed payloads only, not %s", h)
			return &f
		case h != payload:
			f := errf(400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.")
			return &f
		}
		signer = s.s3signer
	}
	u := *r.URL
	u.Scheme, u.Host = "http", r.Host
	req, _ := http.NewRequest(r.Method, u.String(), bytes.NewReader(body))
	req.Host = r.Host
	for _, h := range strings.Split(parts["SignedHeaders"], ";") {
		if h == "host" {
			continue
		}
		if v, ok := r.Header[http.CanonicalHeaderKey(h)]; ok {
			req.Header[http.CanonicalHeaderKey(h)] = v
		}
	}
	req.ContentLength = int64(len(body))
	creds := awssdk.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey}
	if err := signer.SignHTTP(r.Context(), creds, req, payload, service, s.Region, when); err != nil {
		f := errf(500, awsb.TypeInternal, "%v", err)
		return &f
	}
	if req.Header.Get("Authorization") != auth {
		f := errf(403, "InvalidSignatureException", "The request signature we calculated does not match the signature you provided.")
		if service == "s3" {
			f.Type = "SignatureDoesNotMatch"
		}
		return &f
	}
	return nil
}

// operations maps the API's routes (below /<APIVersion>/) to their operation names; the mux
// only matches, it serves nothing.
var operations = map[string]string{
	"POST /microvms":                                     "RunMicrovm",
	"GET /microvms":                                      "ListMicrovms",
	"GET /microvms/{id}":                                 "GetMicrovm",
	"DELETE /microvms/{id}":                              "TerminateMicrovm",
	"POST /microvms/{id}/suspend":                        "SuspendMicrovm",
	"POST /microvms/{id}/resume":                         "ResumeMicrovm",
	"POST /microvms/{id}/auth-token":                     "CreateMicrovmAuthToken",
	"POST /microvm-images":                               "CreateMicrovmImage",
	"PUT /microvm-images/{id}":                           "UpdateMicrovmImage",
	"GET /microvm-images/{id}":                           "GetMicrovmImage",
	"GET /microvm-images/{id}/versions/{version}":        "GetMicrovmImageVersion",
	"GET /microvm-images/{id}/versions/{version}/builds": "ListMicrovmImageBuilds",
}

var operationMux = func() *http.ServeMux {
	mux := http.NewServeMux()
	for pattern := range operations {
		mux.Handle(pattern, http.NotFoundHandler())
	}
	return mux
}()

// operation names the operation a request for path rest (below /<APIVersion>/) is, or "".
func operation(method, rest string) string {
	if method == http.MethodHead {
		return "" // the mux lets HEAD match a GET route; the service has no HEAD operations
	}
	_, pattern := operationMux.Handler(&http.Request{Method: method, URL: &url.URL{Path: "/" + rest}})
	return operations[pattern]
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeErr(w, errf(400, awsb.TypeValidation, "read body: %v", err))
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/"+awsb.APIVersion+"/")
	if !ok {
		writeErr(w, Fault{Status: 404, Body: "<UnknownOperationException/>"})
		return
	}
	seg := strings.Split(rest, "/")
	op := operation(r.Method, rest)
	if op == "" {
		writeErr(w, Fault{Status: 404, Body: "<UnknownOperationException/>"})
		return
	}
	if f := s.verify(r, body, awsb.SigningService); f != nil {
		writeErr(w, *f)
		return
	}
	s.mu.Lock()
	s.calls[op]++
	var lost *Fault
	if q := s.faults[op]; len(q) > 0 {
		f := q[0]
		s.faults[op] = q[1:]
		if !f.AfterWork {
			s.mu.Unlock()
			writeErr(w, f)
			return
		}
		lost = &f
	}
	s.mu.Unlock()
	var id string
	if len(seg) >= 2 {
		id, _ = url.PathUnescape(seg[1])
	}
	var out any
	var f *Fault
	status := http.StatusOK
	switch op {
	case "RunMicrovm":
		out, f = s.run(body)
	case "GetMicrovm":
		out, f = s.get(id)
	case "TerminateMicrovm":
		out, f = s.terminateOp(id)
	case "SuspendMicrovm":
		out, f = s.suspend(id)
	case "ResumeMicrovm":
		out, f = s.resume(id)
	case "CreateMicrovmAuthToken":
		out, f = s.authToken(id, body)
	case "ListMicrovms":
		out, f = s.list(r.URL.Query())
	case "CreateMicrovmImage":
		status, out, f = s.createImage(body)
	case "UpdateMicrovmImage":
		status, out, f = s.updateImage(id, body)
	case "GetMicrovmImage":
		out, f = s.getImage(id)
	case "GetMicrovmImageVersion":
		out, f = s.getVersion(id, seg[3])
	case "ListMicrovmImageBuilds":
		out, f = s.listBuilds(id, seg[3])
	}
	if f == nil {
		f = lost
	}
	if f != nil {
		writeErr(w, *f)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(out)
}

func notFound(id string) *Fault {
	b, _ := json.Marshal(awsb.ErrorBody{Message: "MicroVM " + id + " not found", ResourceID: id, ResourceType: "Microvm"})
	return &Fault{Status: 404, Type: awsb.TypeNotFound, Body: string(b)}
}

func bad(format string, a ...any) *Fault {
	f := errf(400, awsb.TypeValidation, format, a...)
	return &f
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// run is RunMicrovm: the model's constraints, client tokens, then a PENDING MicroVM whose guest
// starts in the background.
func (s *Server) run(body []byte) (any, *Fault) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, bad("body: %v", err)
	}
	var req awsb.RunRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, bad("body: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !strings.HasPrefix(req.ImageIdentifier, "arn:") {
		return nil, bad("Malformed ARN - doesn't start with 'arn:'")
	}
	if !slices.Contains(s.Images, req.ImageIdentifier) {
		f := errf(404, awsb.TypeNotFound, "image %s not found", req.ImageIdentifier)
		return nil, &f
	}
	version, f := s.runVersionLocked(req.ImageIdentifier, req.ImageVersion)
	if f != nil {
		return nil, f
	}
	if n := len(req.ClientToken); n > 128 {
		return nil, bad("clientToken: length %d, at most 128", n)
	}
	if req.MaximumDurationInSeconds != 0 && (req.MaximumDurationInSeconds < 1 || req.MaximumDurationInSeconds > 28800) {
		return nil, bad("maximumDurationInSeconds %d: 1 to 28800", req.MaximumDurationInSeconds)
	}
	if ip, ok := raw["idlePolicy"]; ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(ip, &m); err != nil {
			return nil, bad("idlePolicy: %v", err)
		}
		for _, k := range []string{"maxIdleDurationSeconds", "suspendedDurationSeconds", "autoResumeEnabled"} {
			if _, ok := m[k]; !ok {
				return nil, bad("idlePolicy.%s is required", k)
			}
		}
		if req.IdlePolicy.MaxIdleDurationSeconds < 60 || req.IdlePolicy.SuspendedDurationSeconds < 0 {
			return nil, bad("idlePolicy: maxIdleDurationSeconds at least 60, suspendedDurationSeconds at least 0")
		}
	}
	if len(req.RunHookPayload) > awsb.MaxRunHookPayload {
		return nil, bad("runHookPayload: length %d, at most %d", len(req.RunHookPayload), awsb.MaxRunHookPayload)
	}
	if req.ExecutionRoleArn != "" {
		return nil, bad("the fake runs no execution role")
	}
	if len(req.EgressNetworkConnectors) > 10 {
		return nil, bad("egressNetworkConnectors: at most 10")
	}
	for _, c := range req.EgressNetworkConnectors {
		if !slices.Contains(s.Connectors, c) {
			f := errf(404, awsb.TypeNotFound, "network connector %s not found", c)
			return nil, &f
		}
	}
	cfg, err := awsb.ParseGuestConfig(req.RunHookPayload)
	if err != nil {
		return nil, bad("%v", err)
	}
	if s.stopped {
		f := errf(500, awsb.TypeInternal, "stopped")
		return nil, &f
	}
	if req.ClientToken != "" {
		if id, ok := s.tokens[req.ClientToken]; ok {
			// A reused token answers the MicroVM it first made, even a terminated one.
			return s.vms[id].m, nil
		}
	}
	s.seq++
	id := fmt.Sprintf("mvm-%04d%s", s.seq, randHex(6))
	life := req.MaximumDurationInSeconds
	if life == 0 {
		life = 28800
	}
	v := &vm{m: awsb.Microvm{MicrovmID: id, State: awsb.StatePending, ImageArn: req.ImageIdentifier, ImageVersion: version,
		IdlePolicy: req.IdlePolicy, MaximumDurationInSeconds: life, StartedAt: float64(time.Now().UnixNano()) / 1e9,
		EgressNetworkConnectors: req.EgressNetworkConnectors},
		restoreLeft: s.RestoreFailures, pendingLeft: s.StartDelayGets, termLeft: s.TerminatingGets, done: make(chan struct{})}
	v.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.proxy(id, w, r) }))
	s.vms[id] = v
	if req.ClientToken != "" {
		s.tokens[req.ClientToken] = id
	}
	info := RunInfo{MicrovmID: id, ImageArn: req.ImageIdentifier, Connector: len(req.EgressNetworkConnectors) > 0,
		Lifetime: time.Duration(life) * time.Second, Guest: cfg, BuiltFrom: s.builtFromLocked(req.ImageIdentifier)}
	v.timer = time.AfterFunc(info.Lifetime, func() { s.terminate(id, "maximum duration reached") })
	go s.boot(v, info)
	return v.m, nil
}

// boot starts the guest; the MicroVM is RUNNING once it has.
func (s *Server) boot(v *vm, info RunInfo) {
	g, err := s.start(context.Background(), info)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		v.m.State, v.m.StateReason = awsb.StateTerminated, "guest failed to start: "+err.Error()
		v.m.TerminatedAt = float64(time.Now().Unix())
		v.guestGone = true
		v.timer.Stop()
		close(v.done)
		go v.srv.Close()
		return
	}
	if v.m.State != awsb.StatePending {
		// Terminated while booting: end the guest now.
		go func() {
			g.Close(context.Background())
			s.mu.Lock()
			v.guestGone = true
			s.mu.Unlock()
			v.srv.Close()
			close(v.done)
		}()
		return
	}
	v.guest = g
	v.m.State = awsb.StateRunning
	v.m.Endpoint = v.srv.URL
}

func (s *Server) get(id string) (any, *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[id]
	if v == nil {
		return nil, notFound(id)
	}
	m := v.m
	switch {
	case m.State == awsb.StateRunning && v.pendingLeft > 0:
		// Eventually consistent: the state lags, and no endpoint is shown yet.
		v.pendingLeft--
		m.State, m.Endpoint = awsb.StatePending, ""
	case m.State == awsb.StateTerminating && v.guestGone:
		if v.termLeft > 0 {
			v.termLeft--
		} else {
			v.m.State = awsb.StateTerminated
			v.m.TerminatedAt = float64(time.Now().Unix())
			m = v.m
		}
	}
	return m, nil
}

func (s *Server) terminateOp(id string) (any, *Fault) {
	s.mu.Lock()
	_, ok := s.vms[id]
	s.mu.Unlock()
	if !ok {
		return nil, notFound(id)
	}
	s.terminate(id, "terminated by the caller")
	return struct{}{}, nil
}

// terminate moves a MicroVM to TERMINATING and closes its guest in the background.
func (s *Server) terminate(id, reason string) {
	s.mu.Lock()
	v := s.vms[id]
	if v == nil || v.m.State == awsb.StateTerminating || v.m.State == awsb.StateTerminated {
		s.mu.Unlock()
		return
	}
	booting := v.m.State == awsb.StatePending
	v.m.State, v.m.StateReason = awsb.StateTerminating, reason
	v.timer.Stop()
	g := v.guest
	s.mu.Unlock()
	if booting || g == nil {
		return // boot closes the guest when it comes up
	}
	go func() {
		g.Close(context.Background())
		s.mu.Lock()
		v.guestGone = true
		s.mu.Unlock()
		v.srv.Close()
		close(v.done)
	}()
}

func (s *Server) suspend(id string) (any, *Fault) {
	s.mu.Lock()
	v := s.vms[id]
	if v == nil {
		s.mu.Unlock()
		return nil, notFound(id)
	}
	if v.m.State == awsb.StateSuspended || v.m.State == awsb.StateSuspending {
		s.mu.Unlock()
		return struct{}{}, nil
	}
	if v.m.State != awsb.StateRunning {
		s.mu.Unlock()
		f := errf(409, awsb.TypeConflict, "MicroVM %s is %s", id, v.m.State)
		return nil, &f
	}
	v.m.State = awsb.StateSuspending
	g := v.guest
	s.mu.Unlock()
	go func() {
		err := g.Pause(context.Background())
		s.mu.Lock()
		defer s.mu.Unlock()
		if v.m.State != awsb.StateSuspending {
			return
		}
		if err != nil {
			v.m.State, v.m.StateReason = awsb.StateRunning, "suspend failed: "+err.Error()
			return
		}
		v.m.State = awsb.StateSuspended
	}()
	return struct{}{}, nil
}

func (s *Server) resume(id string) (any, *Fault) {
	s.mu.Lock()
	v := s.vms[id]
	if v == nil {
		s.mu.Unlock()
		return nil, notFound(id)
	}
	if v.m.State == awsb.StateRunning {
		s.mu.Unlock()
		return struct{}{}, nil
	}
	if v.m.State != awsb.StateSuspended {
		s.mu.Unlock()
		f := errf(409, awsb.TypeConflict, "MicroVM %s is %s", id, v.m.State)
		return nil, &f
	}
	g := v.guest
	s.mu.Unlock()
	if err := g.Resume(context.Background()); err != nil {
		f := errf(500, awsb.TypeInternal, "resume: %v", err)
		return nil, &f
	}
	s.mu.Lock()
	if v.m.State == awsb.StateSuspended {
		v.m.State = awsb.StateRunning
	}
	s.mu.Unlock()
	return struct{}{}, nil
}

func (s *Server) authToken(id string, body []byte) (any, *Fault) {
	var req struct {
		AllowedPorts        []json.RawMessage `json:"allowedPorts"`
		ExpirationInMinutes *int              `json:"expirationInMinutes"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, bad("body: %v", err)
	}
	if len(req.AllowedPorts) == 0 {
		return nil, bad("allowedPorts: at least one entry")
	}
	if req.ExpirationInMinutes == nil || *req.ExpirationInMinutes < 1 || *req.ExpirationInMinutes > 60 {
		return nil, bad("expirationInMinutes: required, 1 to 60")
	}
	var ports []awsb.AllowedPort
	for i, raw := range req.AllowedPorts {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil || len(m) != 1 {
			return nil, bad("allowedPorts[%d]: exactly one of port, range, allPorts", i)
		}
		var p awsb.AllowedPort
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, bad("allowedPorts[%d]: %v", i, err)
		}
		ports = append(ports, p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[id]
	if v == nil {
		return nil, notFound(id)
	}
	if v.m.State == awsb.StateTerminated || v.m.State == awsb.StateTerminating {
		f := errf(409, awsb.TypeConflict, "MicroVM %s is %s", id, v.m.State)
		return nil, &f
	}
	tok := "jwe." + randHex(24)
	s.auth[tok] = &authToken{vm: id, ports: ports, expires: time.Now().Add(time.Duration(*req.ExpirationInMinutes) * time.Minute)}
	return awsb.AuthTokenResponse{AuthToken: map[string]string{"X-aws-proxy-auth": tok}}, nil
}

func (s *Server) list(q url.Values) (any, *Fault) {
	max := 50
	if v := q.Get("maxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			return nil, bad("maxResults %q: 1 to 50", v)
		}
		max = n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, v := range s.vms {
		if img := q.Get("imageIdentifier"); img == "" || img == v.m.ImageArn {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	start := 0
	if t := q.Get("nextToken"); t != "" {
		start = slices.Index(ids, t)
		if start < 0 {
			return nil, bad("nextToken %q", t)
		}
	}
	resp := awsb.ListResponse{Items: []awsb.MicrovmItem{}}
	for i := start; i < len(ids); i++ {
		if len(resp.Items) == max {
			next := ids[i]
			resp.NextToken = &next
			break
		}
		m := s.vms[ids[i]].m
		resp.Items = append(resp.Items, awsb.MicrovmItem{MicrovmID: m.MicrovmID, State: m.State, ImageArn: m.ImageArn, ImageVersion: m.ImageVersion, StartedAt: m.StartedAt})
	}
	return resp, nil
}

func portAllowed(ports []awsb.AllowedPort, port int) bool {
	for _, p := range ports {
		switch {
		case p.AllPorts != nil:
			return true
		case p.Port != nil && *p.Port == port:
			return true
		case p.Range != nil && p.Range.StartPort <= port && port <= p.Range.EndPort:
			return true
		}
	}
	return false
}

// proxy is a MicroVM's endpoint: 502 (empty) while it restores or is not running, 403 without
// a valid credential for the port, else the guest.
func (s *Server) proxy(id string, w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	v := s.vms[id]
	if v != nil && v.m.State == awsb.StateSuspended && v.m.IdlePolicy != nil && v.m.IdlePolicy.AutoResumeEnabled {
		// Traffic resumes a MicroVM whose idle policy says so.
		g := v.guest
		s.mu.Unlock()
		if err := g.Resume(r.Context()); err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		s.mu.Lock()
		if v.m.State == awsb.StateSuspended {
			v.m.State = awsb.StateRunning
		}
	}
	if v == nil || v.m.State != awsb.StateRunning || v.guest == nil {
		s.mu.Unlock()
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if v.restoreLeft > 0 {
		v.restoreLeft--
		s.mu.Unlock()
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	g := v.guest
	tok := s.auth[r.Header.Get("X-Aws-Proxy-Auth")]
	s.mu.Unlock()
	forbid := func(msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{"message": msg})
	}
	if r.Header.Get("Authorization") != "" {
		// The endpoint reads Authorization as its own; a bearer there is not its token.
		forbid("Forbidden: invalid Authorization header")
		return
	}
	if tok == nil || tok.vm != id || time.Now().After(tok.expires) {
		forbid("Forbidden")
		return
	}
	port := 8080
	if p := r.Header.Get("X-Aws-Proxy-Port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			forbid("bad X-aws-proxy-port")
			return
		}
		port = n
	}
	if !portAllowed(tok.ports, port) {
		forbid(fmt.Sprintf("port %d is not allowed by this token", port))
		return
	}
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-aws-proxy-") {
			r.Header.Del(k)
		}
	}
	g.Serve(port, w, r)
}
