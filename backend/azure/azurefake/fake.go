// Package azurefake is an in-process Azure for tests: ARM sandbox groups and the sandbox data plane over TLS, each sandbox a real local sandbox.
package azurefake

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Audiences the notes disagree on (../shared/notes/cloud-apis.md §2.1, §6).
const (
	AudienceDynamicSessions = "https://dynamicsessions.io"
	AudienceDevCompute      = "https://management.azuredevcompute.io"
	AudienceARM             = "https://management.azure.com"
	APIVersion              = "2026-02-01-preview"
)

// Config chooses among the readings of the wire the notes disagree on, and the timing.
type Config struct {
	Subscription, ResourceGroup string
	// Groups exist from the start (ARM); others are made by PUT.
	Groups []string
	// Audiences the data plane accepts (default both disputed ones).
	Audiences []string
	// StateField is "state" (default), "status" or "both": which field the sandbox JSON carries.
	StateField string
	// OmitExitCode leaves exitCode out of exec answers, as the live service sometimes does.
	OmitExitCode bool
	// BareList answers a list with a bare array instead of {value, nextLink}.
	BareList bool
	// PageSize splits lists into pages linked by nextLink (0: one page).
	PageSize int
	// CreatingPolls is how many GETs still see Creating once the sandbox runs; DeletingPolls
	// how many still see Deleting once it is gone (eventual consistency).
	CreatingPolls, DeletingPolls int
	// Images maps disk image names to what the local runtime starts (default ubuntu: host).
	Images map[string]spec.Image
	// Local runs the sandboxes (a backend/local instance, root).
	Local sandbox.Backend
}

// Fault is an answer the fake gives instead of the real one: to requests whose method is
// Method ("" any) and whose path contains Path, the next Times times (at least once). With
// After, the request is served first and its answer replaced (the service acted, the caller
// cannot know).
type Fault struct {
	Method, Path string
	Status       int
	RetryAfter   string
	Body         string
	Times        int
	After        bool
}

// Fake serves ARM (ARM) and the data plane (DataPlane), both TLS.
type Fake struct {
	cfg       Config
	ARM       *httptest.Server
	DataPlane *httptest.Server

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	groups    map[string]*fakeGroup
	faults    []*Fault
	audiences map[string]int // data-plane audiences seen
	requests  []string       // "METHOD path" of every data-plane request, in order
	wg        sync.WaitGroup
	ctx       context.Context
	cancel    context.CancelFunc
}

type fakeGroup struct {
	location string
	polls    int // GETs left before Succeeded
}

type fakeSandbox struct {
	json       map[string]any
	state      string
	local      string // the local session id ("" until it runs)
	polls      int    // GETs left that still see Creating / Deleting
	gone       bool   // deleted: 404 once polls reach 0
	terminated bool   // the local sandbox is confirmed gone
	err        string
}

// New starts the fake. Close it with Close.
func New(cfg Config) *Fake {
	if cfg.Subscription == "" {
		cfg.Subscription = "00000000-0000-0000-0000-000000000000"
	}
	if cfg.ResourceGroup == "" {
		cfg.ResourceGroup = "rg"
	}
	if len(cfg.Audiences) == 0 {
		cfg.Audiences = []string{AudienceDynamicSessions, AudienceDevCompute}
	}
	if cfg.StateField == "" {
		cfg.StateField = "state"
	}
	if cfg.Images == nil {
		cfg.Images = map[string]spec.Image{"ubuntu": {Host: true}}
	}
	f := &Fake{cfg: cfg, sandboxes: map[string]*fakeSandbox{}, groups: map[string]*fakeGroup{}, audiences: map[string]int{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	for _, g := range cfg.Groups {
		f.groups[g] = &fakeGroup{location: "westus2"}
	}
	f.ARM = httptest.NewTLSServer(http.HandlerFunc(f.serveARM))
	f.DataPlane = httptest.NewTLSServer(http.HandlerFunc(f.serveData))
	return f
}

// Close stops the servers and terminates every local sandbox still running.
func (f *Fake) Close() {
	f.ARM.Close()
	f.DataPlane.Close()
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	var left []string
	for _, s := range f.sandboxes {
		if s.local != "" && !s.terminated {
			left = append(left, s.local)
		}
	}
	f.mu.Unlock()
	for _, id := range left {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = f.cfg.Local.Terminate(ctx, id)
		cancel()
	}
}

// Inject queues a fault.
func (f *Fake) Inject(x Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, &x)
}

// ClearFaults drops every queued fault.
func (f *Fake) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
}

// Audiences returns how many data-plane requests carried each token audience.
func (f *Fake) Audiences() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.audiences {
		out[k] = v
	}
	return out
}

// Requests returns "METHOD path" of every data-plane request so far.
func (f *Fake) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// LocalSession is the local session running sandbox id ("" when none).
func (f *Fake) LocalSession(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.sandboxes[id]; s != nil && !s.terminated {
		return s.local
	}
	return ""
}

// Count is how many sandboxes the data plane still has (gone or not yet confirmed included).
func (f *Fake) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sandboxes)
}

// CertPEM is the servers' certificate (both use httptest's), for SSL_CERT_FILE.
func (f *Fake) CertPEM() []byte {
	return pemEncode(f.DataPlane.Certificate().Raw)
}

// Credential returns tokens a Fake accepts: the token is "aud=" and the scope's resource.
type Credential struct{}

// GetToken implements azcore.TokenCredential.
func (Credential) GetToken(_ context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	if len(o.Scopes) != 1 {
		return azcore.AccessToken{}, fmt.Errorf("want one scope, got %v", o.Scopes)
	}
	return azcore.AccessToken{Token: "aud=" + strings.TrimSuffix(o.Scopes[0], "/.default"), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// audience checks the bearer token and returns its audience, or answers 401.
func audience(w http.ResponseWriter, r *http.Request, allowed []string) (string, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	aud, ok2 := strings.CutPrefix(tok, "aud=")
	if !ok || !ok2 {
		writeError(w, http.StatusUnauthorized, "InvalidAuthenticationToken", "no bearer token")
		return "", false
	}
	for _, a := range allowed {
		if aud == a {
			return aud, true
		}
	}
	writeError(w, http.StatusUnauthorized, "InvalidAuthenticationTokenAudience", fmt.Sprintf("token audience %q is not accepted here", aud))
	return "", false
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("x-ms-error-code", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// fault answers with a queued fault for r, if one matches; serve is the real handler, run
// first for a fault After.
func (f *Fake) fault(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) bool {
	f.mu.Lock()
	var hit *Fault
	for i, x := range f.faults {
		if (x.Method == "" || x.Method == r.Method) && strings.Contains(r.URL.Path, x.Path) {
			hit = x
			if x.Times--; x.Times <= 0 {
				f.faults = append(f.faults[:i], f.faults[i+1:]...)
			}
			break
		}
	}
	f.mu.Unlock()
	if hit == nil {
		return false
	}
	if hit.After && serve != nil {
		serve(httptest.NewRecorder(), r)
	}
	if hit.RetryAfter != "" {
		w.Header().Set("Retry-After", hit.RetryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(hit.Status)
	_, _ = io.WriteString(w, hit.Body)
	return true
}

func (f *Fake) serveARM(w http.ResponseWriter, r *http.Request) {
	if _, ok := audience(w, r, []string{AudienceARM}); !ok {
		return
	}
	if f.fault(w, r, nil) {
		return
	}
	if v := r.URL.Query().Get("api-version"); v != APIVersion {
		writeError(w, http.StatusBadRequest, "InvalidApiVersionParameter", fmt.Sprintf("api-version %q is not supported", v))
		return
	}
	prefix := "/subscriptions/" + f.cfg.Subscription + "/resourceGroups/" + f.cfg.ResourceGroup + "/providers/Microsoft.App/sandboxGroups/"
	name, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok || name == "" || strings.Contains(name, "/") {
		writeError(w, http.StatusNotFound, "ResourceNotFound", "no such resource "+r.URL.Path)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.groups[name]
	switch r.Method {
	case http.MethodGet:
		if g == nil {
			writeError(w, http.StatusNotFound, "ResourceNotFound", "sandbox group "+name+" not found")
			return
		}
		state := "Succeeded"
		if g.polls > 0 {
			g.polls--
			state = "Creating"
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": r.URL.Path, "name": name, "location": g.location, "properties": map[string]string{"provisioningState": state}})
	case http.MethodPut:
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, "InvalidRequestContent", err.Error())
			return
		}
		if _, ok := body["id"]; ok {
			writeError(w, http.StatusBadRequest, "InvalidRequestContent", "id is read-only")
			return
		}
		loc, _ := body["location"].(string)
		if loc == "" {
			writeError(w, http.StatusBadRequest, "LocationRequired", "location is required")
			return
		}
		if g == nil {
			f.groups[name] = &fakeGroup{location: loc, polls: 2}
		}
		writeJSON(w, http.StatusCreated, map[string]any{"id": r.URL.Path, "name": name, "location": loc, "properties": map[string]string{"provisioningState": "Creating"}})
	default:
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method)
	}
}

func (f *Fake) serveData(w http.ResponseWriter, r *http.Request) {
	aud, ok := audience(w, r, f.cfg.Audiences)
	if !ok {
		return
	}
	f.mu.Lock()
	f.audiences[aud]++
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	if f.fault(w, r, f.route) {
		return
	}
	f.route(w, r)
}

// route serves one data-plane request.
func (f *Fake) route(w http.ResponseWriter, r *http.Request) {
	if v := r.URL.Query().Get("api-version"); v != APIVersion {
		writeError(w, http.StatusBadRequest, "InvalidApiVersionParameter", fmt.Sprintf("api-version %q is not supported", v))
		return
	}
	// Base path: no providers/Microsoft.App segment (borrowing ARM's shape is a 404).
	rest, ok := strings.CutPrefix(r.URL.Path, "/subscriptions/"+f.cfg.Subscription+"/resourceGroups/"+f.cfg.ResourceGroup+"/sandboxGroups/")
	group, rest, _ := strings.Cut(rest, "/")
	f.mu.Lock()
	known := f.groups[group] != nil
	f.mu.Unlock()
	if !ok || !known {
		writeError(w, http.StatusNotFound, "ResourceNotFound", "no such sandbox group "+r.URL.Path)
		return
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 1 && parts[0] == "sandboxes" && r.Method == http.MethodPut:
		f.create(w, r)
	case len(parts) == 1 && parts[0] == "sandboxes" && r.Method == http.MethodGet:
		f.list(w, r)
	case len(parts) == 2 && parts[0] == "sandboxes" && r.Method == http.MethodGet:
		f.get(w, parts[1])
	case len(parts) == 2 && parts[0] == "sandboxes" && r.Method == http.MethodDelete:
		f.delete(w, parts[1])
	case len(parts) == 3 && parts[2] == "executeShellCommand" && r.Method == http.MethodPost:
		f.exec(w, r, parts[1])
	case len(parts) == 3 && parts[2] == "files" && (r.Method == http.MethodGet || r.Method == http.MethodPut):
		f.files(w, r, parts[1])
	case len(parts) == 3 && parts[2] == "egresspolicy" && r.Method == http.MethodPost:
		f.egress(w, r, parts[1])
	default:
		writeError(w, http.StatusNotFound, "NotFound", r.Method+" "+r.URL.Path)
	}
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

type createReq struct {
	SourcesRef *struct {
		DiskImage *struct {
			Name     string `json:"name"`
			ID       string `json:"id"`
			IsPublic bool   `json:"isPublic"`
		} `json:"diskImage"`
	} `json:"sourcesRef"`
	Resources *struct {
		CPU    string `json:"cpu"`
		Memory string `json:"memory"`
	} `json:"resources"`
	Labels       map[string]string `json:"labels"`
	EgressPolicy *egressPolicy     `json:"egressPolicy"`
	Environment  map[string]string `json:"environment"`
}

type egressPolicy struct {
	DefaultAction     string `json:"defaultAction"`
	TrafficInspection string `json:"trafficInspection"`
	HostRules         []struct {
		Pattern string `json:"pattern"`
		Action  string `json:"action"`
	} `json:"hostRules"`
}

// egressOf is what the local runtime enforces for a policy: Deny alone is deny; Deny with Allow
// host rules is allowDomains; Allow with no rules is open.
func egressOf(p *egressPolicy) (spec.Egress, error) {
	if p == nil {
		return spec.Egress{Mode: spec.EgressOpen}, nil
	}
	switch p.DefaultAction {
	case "Deny":
		if len(p.HostRules) == 0 {
			return spec.Egress{Mode: spec.EgressDeny}, nil
		}
		e := spec.Egress{Mode: spec.EgressAllowDomains}
		for _, h := range p.HostRules {
			if h.Action != "Allow" {
				return spec.Egress{}, fmt.Errorf("host rule %s: action %q is not modelled by the fake", h.Pattern, h.Action)
			}
			e.Domains = append(e.Domains, h.Pattern)
		}
		return e, nil
	case "Allow":
		if len(p.HostRules) > 0 {
			return spec.Egress{}, errors.New("Allow with host rules is not modelled by the fake")
		}
		return spec.Egress{Mode: spec.EgressOpen}, nil
	}
	return spec.Egress{}, fmt.Errorf("defaultAction %q must be Allow or Deny", p.DefaultAction)
}

func (f *Fake) create(w http.ResponseWriter, r *http.Request) {
	var req createReq
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestContent", err.Error())
		return
	}
	if req.SourcesRef == nil || req.SourcesRef.DiskImage == nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestContent", "'sourcesRef' is required when not using a preset sandbox type")
		return
	}
	img, ok := f.cfg.Images[req.SourcesRef.DiskImage.Name]
	if !ok || !req.SourcesRef.DiskImage.IsPublic {
		writeError(w, http.StatusNotFound, "DiskImageNotFound", fmt.Sprintf("disk image %q not found", req.SourcesRef.DiskImage.Name))
		return
	}
	decl := spec.Sandbox{Image: img, Env: req.Environment}
	if req.Resources != nil {
		decl.Limits.CPU, decl.Limits.Memory = spec.Quantity(req.Resources.CPU), spec.Quantity(req.Resources.Memory)
	}
	eg, err := egressOf(req.EgressPolicy)
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidEgressPolicy", err.Error())
		return
	}
	decl.Egress = eg
	id := newID()
	decl.ID = "az-" + id[:8]
	// The sandbox lives until deleted: the longest the local runtime allows.
	life := int64(24 * 3600)
	decl.Session.MaxLifetimeSeconds = &life
	decl.ApplyDefaults()
	if errs := decl.Validate(""); len(errs) > 0 {
		writeError(w, http.StatusBadRequest, "InvalidRequestContent", errs[0].Error())
		return
	}
	body := map[string]any{"id": id, "labels": req.Labels, "createdAt": time.Now().UTC().Format(time.RFC3339Nano),
		"sourcesRef": req.SourcesRef, "resources": req.Resources, "egressPolicy": req.EgressPolicy}
	if req.Environment != nil {
		body["environment"] = req.Environment
	}
	s := &fakeSandbox{json: body, state: "Creating"}
	f.mu.Lock()
	f.sandboxes[id] = s
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		ctx, cancel := context.WithTimeout(f.ctx, 5*time.Minute)
		defer cancel()
		sess, err := f.cfg.Local.Create(ctx, decl)
		f.mu.Lock()
		defer f.mu.Unlock()
		if err != nil {
			s.state, s.err = "Failed", err.Error()
			return
		}
		s.local = sess.ID
		if s.gone {
			// Deleted while it was being made: its delete finishes now.
			f.wg.Add(1)
			go f.finishDelete(s, sess.ID)
			return
		}
		s.state, s.polls = "Running", f.cfg.CreatingPolls
	}()
	writeJSON(w, http.StatusCreated, f.render(s))
}

// render is a sandbox's JSON, with its state in the configured field. Call with f.mu held.
func (f *Fake) render(s *fakeSandbox) map[string]any {
	out := map[string]any{}
	for k, v := range s.json {
		out[k] = v
	}
	st := s.state
	if st == "Running" && s.polls > 0 {
		st = "Creating"
	}
	if f.cfg.StateField == "state" || f.cfg.StateField == "both" {
		out["state"] = st
	}
	if f.cfg.StateField == "status" || f.cfg.StateField == "both" {
		out["status"] = st
	}
	return out
}

func (f *Fake) get(w http.ResponseWriter, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sandboxes[id]
	if s == nil {
		writeError(w, http.StatusNotFound, "SandboxNotFound", "sandbox "+id+" not found")
		return
	}
	if s.gone && s.terminated {
		if s.polls <= 0 {
			delete(f.sandboxes, id)
			writeError(w, http.StatusNotFound, "SandboxNotFound", "sandbox "+id+" not found")
			return
		}
	}
	body := f.render(s)
	if s.polls > 0 {
		s.polls--
	}
	writeJSON(w, http.StatusOK, body)
}

func (f *Fake) list(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	for _, sel := range strings.Split(r.URL.Query().Get("labels"), ",") {
		if k, v, ok := strings.Cut(sel, "="); ok {
			want[k] = v
		}
	}
	skip, _ := strconv.Atoi(r.URL.Query().Get("skip"))
	f.mu.Lock()
	var all []map[string]any
	for _, s := range f.sandboxes {
		if s.gone && s.terminated && s.polls <= 0 {
			continue
		}
		labels, _ := s.json["labels"].(map[string]string)
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if match {
			all = append(all, f.render(s))
		}
	}
	f.mu.Unlock()
	// A stable order, so pages do not overlap.
	sortByID(all)
	if f.cfg.BareList {
		writeJSON(w, http.StatusOK, all)
		return
	}
	page := map[string]any{"value": all}
	if n := f.cfg.PageSize; n > 0 {
		if skip > len(all) {
			skip = len(all)
		}
		end := min(skip+n, len(all))
		page["value"] = all[skip:end]
		if end < len(all) {
			q := r.URL.Query()
			q.Set("skip", strconv.Itoa(end))
			page["nextLink"] = "https://" + r.Host + r.URL.Path + "?" + q.Encode()
		}
	}
	writeJSON(w, http.StatusOK, page)
}

func sortByID(v []map[string]any) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j]["id"].(string) < v[j-1]["id"].(string); j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}

func (f *Fake) delete(w http.ResponseWriter, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sandboxes[id]
	if s == nil {
		writeError(w, http.StatusNotFound, "SandboxNotFound", "sandbox "+id+" not found")
		return
	}
	if !s.gone {
		s.gone, s.state = true, "Deleting"
		if s.local != "" {
			f.wg.Add(1)
			go f.finishDelete(s, s.local)
		} else if s.err != "" {
			s.terminated = true
			s.polls = f.cfg.DeletingPolls
		}
	}
	w.WriteHeader(http.StatusAccepted)
}

// finishDelete terminates the local sandbox; the data plane forgets the sandbox after
// DeletingPolls more GETs.
func (f *Fake) finishDelete(s *fakeSandbox, local string) {
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := f.cfg.Local.Terminate(ctx, local)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		s.state, s.err = "Failed", "delete: "+err.Error()
		return
	}
	s.terminated, s.polls = true, f.cfg.DeletingPolls
}

// running returns the local session of a Running sandbox, or answers 404/409.
func (f *Fake) running(w http.ResponseWriter, id string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sandboxes[id]
	switch {
	case s == nil || s.gone && s.terminated:
		writeError(w, http.StatusNotFound, "SandboxNotFound", "sandbox "+id+" not found")
		return "", false
	case s.state != "Running":
		writeError(w, http.StatusConflict, "GlobalSandboxNotRunning", "sandbox "+id+" is "+s.state)
		return "", false
	}
	return s.local, true
}

func (f *Fake) exec(w http.ResponseWriter, r *http.Request, id string) {
	var req struct {
		Command          string `json:"command"`
		WorkingDirectory string `json:"workingDirectory"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Command == "" {
		writeError(w, http.StatusBadRequest, "InvalidRequestContent", fmt.Sprintf("command is required (%v)", err))
		return
	}
	a, ok := f.agent(w, r, id)
	if !ok {
		return
	}
	defer a.Close()
	var out, errb bytes.Buffer
	// The service has no timeout field: the local agent's own ceiling bounds the command.
	res, err := a.Exec(r.Context(), sandbox.ExecRequest{Shell: req.Command, Cwd: req.WorkingDirectory, Timeout: time.Hour}, &out, &errb)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, sandbox.ErrNotFound) {
			status = http.StatusBadRequest
		}
		writeError(w, status, "ExecFailed", err.Error())
		return
	}
	body := map[string]any{"stdout": out.String(), "stderr": errb.String()}
	if !f.cfg.OmitExitCode {
		code := res.ExitCode
		if res.Signal != "" {
			code = 137
		}
		body["exitCode"] = code
	}
	writeJSON(w, http.StatusOK, body)
}

// agent connects to the local sandbox standing for running sandbox id; on false it has
// answered the request.
func (f *Fake) agent(w http.ResponseWriter, r *http.Request, id string) (sandbox.Agent, bool) {
	local, ok := f.running(w, id)
	if !ok {
		return nil, false
	}
	a, err := f.cfg.Local.Connect(r.Context(), local)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return nil, false
	}
	return a, true
}

func (f *Fake) files(w http.ResponseWriter, r *http.Request, id string) {
	p := r.URL.Query().Get("path")
	if !path.IsAbs(p) {
		writeError(w, http.StatusBadRequest, "InvalidPath", "path must be absolute")
		return
	}
	a, ok := f.agent(w, r, id)
	if !ok {
		return
	}
	defer a.Close()
	status := func(err error) int {
		switch {
		case errors.Is(err, sandbox.ErrNotFound):
			return http.StatusNotFound
		case errors.Is(err, sandbox.ErrInvalid), errors.Is(err, sandbox.ErrForbidden):
			return http.StatusBadRequest
		}
		return http.StatusInternalServerError
	}
	if r.Method == http.MethodGet {
		rc, err := a.ReadFile(r.Context(), p, 0, -1)
		if err != nil {
			writeError(w, status(err), "FileError", err.Error())
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.Copy(w, rc)
		return
	}
	if r.URL.Query().Get("createDirs") == "true" {
		if err := a.Mkdir(r.Context(), path.Dir(p), 0o755); err != nil {
			writeError(w, status(err), "FileError", err.Error())
			return
		}
	}
	if err := a.WriteFile(r.Context(), p, r.Body, 0o644); err != nil {
		writeError(w, status(err), "FileError", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *Fake) egress(w http.ResponseWriter, r *http.Request, id string) {
	var p egressPolicy
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestContent", err.Error())
		return
	}
	e, err := egressOf(&p)
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidEgressPolicy", err.Error())
		return
	}
	local, ok := f.running(w, id)
	if !ok {
		return
	}
	setter, err := sandbox.Feature[sandbox.EgressSetter](r.Context(), f.cfg.Local)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	if err := setter.SetEgress(r.Context(), local, e); err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	f.mu.Lock()
	if s := f.sandboxes[id]; s != nil {
		s.json["egressPolicy"] = p
	}
	f.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// WriteCert writes the servers' certificate to a file, for SSL_CERT_FILE.
func (f *Fake) WriteCert(file string) error { return os.WriteFile(file, f.CertPEM(), 0o644) }

func pemEncode(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
