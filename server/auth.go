package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/token"
)

// MinAPIKeyLen is the shortest API key accepted (a key is a secret, not a password).
const MinAPIKeyLen = 16

// access is what an endpoint asks of its caller.
type access int

const (
	accessNone    access = iota // no credential (health)
	accessAdmin                 // the daemon's own callers: the socket or an API key
	accessAny                   // any valid credential; a delegated one sees only its session
	accessRead                  // the path's session: admin, or a token of either class for it
	accessExecute               // the path's session: admin, or an execute token for it
	accessManage                // the path's session: admin, or a manage token for it
)

// Authentication kinds, as logged.
const (
	viaSocket = "socket"
	viaAPIKey = "apiKey"
	viaToken  = "token"
)

// principal is an authenticated caller.
type principal struct {
	via string
	// claims are set for a delegated caller (a verified capability token).
	claims *token.Claims
}

func (p *principal) delegated() bool { return p != nil && p.claims != nil }

type principalKey struct{}

func principalOf(ctx context.Context) *principal {
	p, _ := ctx.Value(principalKey{}).(*principal)
	return p
}

// reasonError is an error class with a machine-readable reason for the caller.
type reasonError struct {
	class  error
	reason string
	msg    string
}

func (e *reasonError) Error() string { return e.msg }
func (e *reasonError) Unwrap() error { return e.class }

func unauthenticated(reason, format string, args ...any) error {
	return &reasonError{class: sandbox.ErrUnauthenticated, reason: reason, msg: "unauthenticated: " + fmt.Sprintf(format, args...)}
}

func forbidden(reason, format string, args ...any) error {
	return &reasonError{class: sandbox.ErrForbidden, reason: reason, msg: "forbidden: " + fmt.Sprintf(format, args...)}
}

// parseBearer returns the credential of an `Authorization: Bearer <credential>` header.
func parseBearer(h string) (string, error) {
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", unauthenticated("scheme", "the Authorization header must be `Bearer <API key or capability token>`")
	}
	cred = strings.TrimLeft(cred, " ")
	if cred == "" || strings.ContainsAny(cred, " \t\r\n") {
		return "", unauthenticated("malformed", "the bearer credential is empty or contains whitespace")
	}
	return cred, nil
}

// authenticate finds who is calling. On the unix socket a caller without credentials is the
// daemon's own (the socket's permissions let it in) unless an API key is required there too;
// any credential presented must be valid, wherever it arrives.
func (s *Server) authenticate(r *http.Request, t Transport) (*principal, error) {
	hs := r.Header.Values("Authorization")
	switch {
	case len(hs) > 1:
		return nil, unauthenticated("ambiguous", "%d Authorization headers; send one", len(hs))
	case len(hs) == 0:
		if t == Unix && !s.opts.RequireAPIKeyOnUnix {
			return &principal{via: viaSocket}, nil
		}
		return nil, unauthenticated("missing", "this endpoint needs `Authorization: Bearer <API key or capability token>`")
	}
	cred, err := parseBearer(hs[0])
	if err != nil {
		return nil, err
	}
	if s.isAPIKey(cred) {
		return &principal{via: viaAPIKey}, nil
	}
	if !strings.Contains(cred, ".") {
		return nil, unauthenticated("unknownKey", "the credential is not an API key of this daemon, nor a capability token")
	}
	c, err := s.verifyToken(cred)
	if err != nil {
		var te *token.Error
		if errors.As(err, &te) {
			return nil, unauthenticated(string(te.Reason), "capability token refused: %v", err)
		}
		return nil, unauthenticated(string(token.ReasonMalformed), "capability token refused: %v", err)
	}
	return &principal{via: viaToken, claims: &c}, nil
}

// isAPIKey compares cred with every key in time independent of where they differ.
func (s *Server) isAPIKey(cred string) bool {
	h := sha256.Sum256([]byte(cred))
	found := 0
	for i := range s.keys {
		found |= subtle.ConstantTimeCompare(h[:], s.keys[i][:])
	}
	return found == 1
}

// verifyToken checks a delegated token against the daemon's key ring. Which session it may
// touch is decided per endpoint (authorize), so the token's own claims serve as the
// expectation here: token.Verify checks the signature before it trusts any of them.
func (s *Server) verifyToken(tok string) (token.Claims, error) {
	c, ok := peekClaims(tok)
	if !ok {
		return token.Claims{}, &token.Error{Reason: token.ReasonMalformed, Detail: "claims part is not base64url JSON"}
	}
	return token.Verify(s.ring, tok, token.Expect{Sandbox: c.Sandbox, Session: c.Session, Generation: c.Generation, Class: c.Class})
}

func peekClaims(tok string) (token.Claims, bool) {
	if len(tok) > token.MaxTokenSize {
		return token.Claims{}, false
	}
	payload, _, _ := strings.Cut(tok, ".")
	js, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return token.Claims{}, false
	}
	var c token.Claims
	if err := json.Unmarshal(js, &c); err != nil {
		return token.Claims{}, false
	}
	return c, true
}

// authorize decides whether p may call an endpoint that needs need. A delegated caller is
// held to the session, sandbox, generation and class its token names; nothing about another
// session is looked up before that check, so a refusal tells nothing of whether it exists.
func (s *Server) authorize(r *http.Request, p *principal, need access) error {
	if !p.delegated() {
		return nil
	}
	c := p.claims
	switch need {
	case accessAdmin:
		return forbidden("delegated", "a capability token cannot call %s %s; it is limited to session %s", r.Method, r.URL.Path, c.Session)
	case accessAny, accessNone:
		return nil
	}
	id := r.PathValue("id")
	if id != c.Session {
		return forbidden(string(token.ReasonWrongSession), "the token is for session %q, not %q", c.Session, id)
	}
	switch {
	case need == accessExecute && c.Class != token.Execute,
		need == accessManage && c.Class != token.Manage:
		want := token.Execute
		if need == accessManage {
			want = token.Manage
		}
		return forbidden(string(token.ReasonWrongClass), "the token grants %q; %s %s needs %q", c.Class, r.Method, r.URL.Path, want)
	}
	sess, err := s.backend.Get(r.Context(), id)
	if err != nil {
		return err
	}
	return claimsMatch(c, sess)
}

// claimsMatch checks that a token for a session id is for that very sandbox incarnation.
func claimsMatch(c *token.Claims, sess *sandbox.Session) error {
	if sess.SandboxID != c.Sandbox {
		return forbidden(string(token.ReasonWrongSandbox), "the token is for sandbox %q, session %s is sandbox %q", c.Sandbox, sess.ID, sess.SandboxID)
	}
	if sess.Generation != c.Generation {
		return forbidden(string(token.ReasonStaleGeneration), "the token is for generation %d of session %s, which is at generation %d", c.Generation, sess.ID, sess.Generation)
	}
	return nil
}

// guard authenticates and authorises a call before its handler runs.
func (s *Server) guard(t Transport, need access, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if need == accessNone {
			h(w, r)
			return
		}
		p, err := s.authenticate(r, t)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		rs := stateOf(r.Context())
		rs.log = rs.log.With("auth", p.via)
		if p.delegated() {
			rs.log = rs.log.With("token_session", p.claims.Session, "token_class", string(p.claims.Class))
		}
		if err := s.authorize(r, p, need); err != nil {
			s.writeError(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}
