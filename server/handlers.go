package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Platform: s.backend.Platform()})
}

func (s *Server) capabilities(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.backend.Capabilities(r.Context()))
}

// readBody reads a bounded request body.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, s.opts.MaxBodyBytes))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("%w: request body exceeds %d bytes", sandbox.ErrTooLarge, mbe.Limit)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read request body: %v", sandbox.ErrInvalid, err)
	}
	return b, nil
}

// decodeStrict decodes exactly one JSON value with no unknown fields.
func decodeStrict(b []byte, v any, what string) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %v", sandbox.ErrInvalid, what, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: %s: trailing data after the JSON object", sandbox.ErrInvalid, what)
	}
	return nil
}

func (s *Server) readJSON(r *http.Request, v any, what string) error {
	b, err := s.readBody(r)
	if err != nil {
		return err
	}
	return decodeStrict(b, v, what)
}

// declaration reads a create body: a template request or a declaration (JSON or YAML).
func (s *Server) declaration(body []byte) (spec.Sandbox, error) {
	if js, err := yaml.YAMLToJSON(body); err == nil {
		var probe map[string]json.RawMessage
		if json.Unmarshal(js, &probe) == nil {
			if _, ok := probe["template"]; ok {
				var req api.CreateRequest
				if err := decodeStrict(js, &req, "template request"); err != nil {
					return spec.Sandbox{}, err
				}
				return s.fromTemplate(req)
			}
		}
	}
	d, err := spec.ParseSandbox(body)
	if err != nil {
		return spec.Sandbox{}, err
	}
	// A relative path would be resolved against the daemon's working directory, which the
	// caller neither knows nor chose.
	for _, f := range []struct{ name, val string }{{"image.dir", d.Image.Dir}, {"image.ociLayout", d.Image.OCILayout}, {"image.tarball", d.Image.Tarball}} {
		if f.val != "" && !filepath.IsAbs(f.val) {
			return spec.Sandbox{}, fmt.Errorf("%w: %s %q: a path sent to the daemon must be absolute (it is read on the daemon's host)", sandbox.ErrInvalid, f.name, f.val)
		}
	}
	return *d, nil
}

func (s *Server) fromTemplate(req api.CreateRequest) (spec.Sandbox, error) {
	t, ok := s.opts.Templates[req.Template]
	if !ok {
		names := slices.Sorted(maps.Keys(s.opts.Templates))
		if len(names) == 0 {
			return spec.Sandbox{}, fmt.Errorf("%w: template %q: this daemon has no templates (airlock serve --templates FILE)", sandbox.ErrInvalid, req.Template)
		}
		return spec.Sandbox{}, fmt.Errorf("%w: template %q is not configured; templates: %s", sandbox.ErrInvalid, req.Template, strings.Join(names, ", "))
	}
	// The template's maps are shared by every create: copy before merging.
	t.Labels = maps.Clone(t.Labels)
	if len(req.Labels) > 0 && t.Labels == nil {
		t.Labels = map[string]string{}
	}
	maps.Copy(t.Labels, req.Labels)
	t.Env = maps.Clone(t.Env)
	t.PreviewPorts = slices.Clone(t.PreviewPorts)
	t.Egress.Domains = slices.Clone(t.Egress.Domains)
	return t, nil
}

// create validates a declaration, refuses what this backend cannot enforce (every refusal in
// the answer), applies defaults and creates the sandbox.
func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	decl, err := s.declaration(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if fes := decl.Validate(""); len(fes) > 0 {
		msgs := make([]string, len(fes))
		for i, fe := range fes {
			msgs[i] = fe.Error()
		}
		s.writeError(w, r, &problemsError{class: sandbox.ErrInvalid, problems: problemsOfFields(fes),
			msg: "invalid declaration: " + strings.Join(msgs, "; ")})
		return
	}
	ctx := r.Context()
	platform, set := s.backend.Platform(), s.backend.Capabilities(ctx)
	res := plan.CheckCreate(decl, platform, set)
	if res.Refused() {
		problems := problemsOfRefusals(res.Refusals)
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = fmt.Sprintf("%s: %s (needs %s)", p.Field, p.Message, res.Refusals[i].Needs())
		}
		s.writeError(w, r, &problemsError{class: sandbox.ErrRefused, problems: problems,
			msg: fmt.Sprintf("refused on %s: %s", platform, strings.Join(msgs, "; "))})
		return
	}
	// Undeclared properties get airlock's default where the platform holds it and stay unset
	// where the platform's own value applies: Create checks what it is given as declared.
	decl = plan.Defaults(platform, set, decl)
	start := time.Now()
	sess, err := s.backend.Create(ctx, decl)
	s.metrics.observeCreate(time.Since(start), err)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(ctx).log.Info("sandbox created", "session", sess.ID, "sandbox", sess.SandboxID, "duration", time.Since(start))
	writeJSON(w, http.StatusCreated, sess)
}

// parseLabelSelector reads label=k=v parameters; a session matches when it has every one.
func parseLabelSelector(vals []string) (map[string]string, error) {
	sel := map[string]string{}
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: label selector %q: want key=value", sandbox.ErrInvalid, v)
		}
		if old, dup := sel[k]; dup && old != val {
			return nil, fmt.Errorf("%w: label selector: key %q asked for both %q and %q", sandbox.ErrInvalid, k, old, val)
		}
		sel[k] = val
	}
	return sel, nil
}

func matchLabels(have, sel map[string]string) bool {
	for k, v := range sel {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// list answers every session matching the label selector; a delegated caller sees only the
// session its token names.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	sel, err := parseLabelSelector(r.URL.Query()["label"])
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx := r.Context()
	var all []*sandbox.Session
	if p := principalOf(ctx); p.delegated() {
		sess, err := s.backend.Get(ctx, p.claims.Session)
		switch {
		case errors.Is(err, sandbox.ErrNotFound):
		case err != nil:
			s.writeError(w, r, err)
			return
		case claimsMatch(p.claims, sess) == nil:
			all = append(all, sess)
		}
	} else if all, err = s.backend.List(ctx); err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.SandboxList{Sandboxes: []*sandbox.Session{}}
	for _, sess := range all {
		if matchLabels(sess.Labels, sel) {
			out.Sandboxes = append(out.Sandboxes, sess)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sess, err := s.backend.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sess)
}

func (s *Server) terminate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.backend.Terminate(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(r.Context()).log.Info("sandbox terminated", "session", id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	s.pauseResume(w, r, func(p sandbox.Pauser) func(context.Context, string) error { return p.Pause })
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	s.pauseResume(w, r, func(p sandbox.Pauser) func(context.Context, string) error { return p.Resume })
}

func (s *Server) pauseResume(w http.ResponseWriter, r *http.Request, op func(sandbox.Pauser) func(context.Context, string) error) {
	p, err := sandbox.Feature[sandbox.Pauser](r.Context(), s.backend)
	if err == nil {
		err = op(p)(r.Context(), r.PathValue("id"))
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.get(w, r)
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	src, err := sandbox.Feature[sandbox.StatsReader](r.Context(), s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := src.Stats(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// mintToken signs a delegated capability token for one session with the daemon's key.
func (s *Server) mintToken(w http.ResponseWriter, r *http.Request) {
	var req api.TokenRequest
	if err := s.readJSON(r, &req, "token request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Class != token.Execute && req.Class != token.Manage {
		s.writeError(w, r, fmt.Errorf("%w: class %q: allowed are %q and %q", sandbox.ErrInvalid, req.Class, token.Execute, token.Manage))
		return
	}
	ttl := s.opts.DefaultTokenTTL
	if req.TTLSeconds != 0 {
		max := int64(s.opts.MaxTokenTTL / time.Second)
		if req.TTLSeconds < 1 || req.TTLSeconds > max {
			s.writeError(w, r, fmt.Errorf("%w: ttlSeconds %d: allowed is 1..%d", sandbox.ErrInvalid, req.TTLSeconds, max))
			return
		}
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	sess, err := s.backend.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	now := time.Now()
	exp := now.Add(ttl).Truncate(time.Second)
	tok, err := token.Mint(s.opts.SigningKey, token.Claims{
		Sandbox: sess.SandboxID, Session: sess.ID, Generation: sess.Generation, Class: req.Class,
		IssuedAt: now.Unix(), Expiry: exp.Unix(),
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(r.Context()).log.Info("token minted", "session", sess.ID, "class", string(req.Class), "expires", exp)
	writeJSON(w, http.StatusCreated, api.TokenResponse{Token: tok, Session: sess.ID, Class: req.Class, ExpiresAt: exp.UTC()})
}
