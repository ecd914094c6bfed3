// Package preview is the authenticated reverse proxy that exposes a sandbox's declared ports on host loopback.
package preview

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/token"
)

// A preview token is a signed URL credential for one port of one session, with an expiry:
//
//	pv1.base64url(claims).base64url(signature)
//
// signed with the session's Ed25519 key over "airlock-preview-v1." followed by the claims
// segment as sent. The prefix keeps the two token kinds apart: a preview token has two dots
// and is malformed to the agent's verifier, and its signature covers a different string, so
// it can never be replayed as an agent token (nor an agent token as a preview token). Claims
// must be canonical JSON, as for agent tokens (docs/tokens.md): one claim set, one spelling.

// Claims are what a preview token asserts. Field order is the wire order.
type Claims struct {
	Sandbox    string `json:"sbx"`
	Session    string `json:"ses"`
	Generation uint64 `json:"gen"`
	Port       int    `json:"port"`
	Expiry     int64  `json:"exp"` // unix seconds; the first second at which the token is invalid
	IssuedAt   int64  `json:"iat,omitempty"`
	KeyID      string `json:"kid"`
}

const (
	// Prefix starts every preview token.
	Prefix    = "pv1."
	sigPrefix = "airlock-preview-v1."
	sigB64Len = 86
)

// ReasonWrongPort is the rejection of a preview token presented for another port.
const ReasonWrongPort token.Reason = "wrongPort"

// ErrWrongPort matches a preview token for another port (errors.Is).
var ErrWrongPort error = &token.Error{Reason: ReasonWrongPort}

var b64 = base64.RawURLEncoding.Strict()

func (c *Claims) check() string {
	switch {
	case c.Sandbox == "" || !utf8.ValidString(c.Sandbox):
		return "sandbox (sbx) is empty or not UTF-8"
	case c.Session == "" || !utf8.ValidString(c.Session):
		return "session (ses) is empty or not UTF-8"
	case c.Port < 1 || c.Port > 65535:
		return fmt.Sprintf("port %d is outside 1..65535", c.Port)
	case c.Expiry <= 0 || c.Expiry > token.MaxExpiry:
		return fmt.Sprintf("expiry (exp) %d is outside 1..%d", c.Expiry, token.MaxExpiry)
	case c.IssuedAt < 0 || c.IssuedAt > c.Expiry:
		return fmt.Sprintf("issued-at (iat) %d is outside 0..exp", c.IssuedAt)
	case c.KeyID == "":
		return "key id (kid) is empty"
	}
	return ""
}

// Mint signs c with key; KeyID is set from the key.
func Mint(key ed25519.PrivateKey, c Claims) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("%w: ed25519 private key is %d bytes, want %d", token.ErrInvalid, len(key), ed25519.PrivateKeySize)
	}
	c.KeyID = token.KeyID(key.Public().(ed25519.PublicKey))
	if msg := c.check(); msg != "" {
		return "", fmt.Errorf("%w: mint preview token: %s", token.ErrInvalid, msg)
	}
	js, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	payload := b64.EncodeToString(js)
	sig := ed25519.Sign(key, []byte(sigPrefix+payload))
	return Prefix + payload + "." + b64.EncodeToString(sig), nil
}

// Expect is what Verify requires of a preview token.
type Expect struct {
	Sandbox    string
	Session    string
	Generation uint64
	Port       int
	Now        time.Time // zero means time.Now()
}

func reject(r token.Reason, detail string) error { return &token.Error{Reason: r, Detail: detail} }

// Verify checks a preview token: shape, signature against keys (each tried), canonical claims, key id,
// then sandbox, session, generation, expiry and port, in that order. Errors are *token.Error
// (errors.Is with token.ErrExpired, token.ErrWrongSession, ErrWrongPort, ...).
func Verify(keys []ed25519.PublicKey, tok string, want Expect) (Claims, error) {
	if len(tok) > token.MaxTokenSize {
		return Claims{}, reject(token.ReasonMalformed, fmt.Sprintf("token is %d bytes, at most %d allowed", len(tok), token.MaxTokenSize))
	}
	body, ok := strings.CutPrefix(tok, Prefix)
	if !ok || strings.Count(body, ".") != 1 {
		return Claims{}, reject(token.ReasonMalformed, "not a preview token (pv1.<claims>.<signature>)")
	}
	payload, sigText, _ := strings.Cut(body, ".")
	if payload == "" || len(sigText) != sigB64Len {
		return Claims{}, reject(token.ReasonMalformed, "empty claims or a signature of the wrong length")
	}
	js, err := canonical(payload)
	if err != nil {
		return Claims{}, reject(token.ReasonMalformed, "claims part: "+err.Error())
	}
	sig, err := canonical(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return Claims{}, reject(token.ReasonMalformed, "signature part is not 64 bytes of base64url")
	}
	kid := ""
	for _, k := range keys {
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(k, []byte(sigPrefix+payload), sig) {
			kid = token.KeyID(k)
			break
		}
	}
	if kid == "" {
		return Claims{}, reject(token.ReasonBadSignature, "signature matches no key of this session")
	}
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Claims{}, reject(token.ReasonBadClaims, "claims JSON: "+err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return Claims{}, reject(token.ReasonBadClaims, "trailing data after the claims")
	}
	if canon, err := json.Marshal(c); err != nil || !bytes.Equal(canon, js) {
		return Claims{}, reject(token.ReasonBadClaims, "claims JSON is not in canonical form")
	}
	if msg := c.check(); msg != "" {
		return Claims{}, reject(token.ReasonBadClaims, msg)
	}
	switch {
	case c.KeyID != kid:
		return Claims{}, reject(token.ReasonKeyMismatch, fmt.Sprintf("claims kid %q, signed by key %q", c.KeyID, kid))
	case c.Sandbox != want.Sandbox:
		return Claims{}, reject(token.ReasonWrongSandbox, fmt.Sprintf("token is for sandbox %q, want %q", c.Sandbox, want.Sandbox))
	case c.Session != want.Session:
		return Claims{}, reject(token.ReasonWrongSession, fmt.Sprintf("token is for session %q, want %q", c.Session, want.Session))
	case c.Generation != want.Generation:
		return Claims{}, reject(token.ReasonStaleGeneration, fmt.Sprintf("token is for generation %d, want %d", c.Generation, want.Generation))
	}
	now := want.Now
	if now.IsZero() {
		now = time.Now()
	}
	if !now.Before(time.Unix(c.Expiry, 0)) {
		return Claims{}, reject(token.ReasonExpired, "expired at "+time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339))
	}
	if c.Port != want.Port {
		return Claims{}, reject(ReasonWrongPort, fmt.Sprintf("token is for port %d, this address serves port %d", c.Port, want.Port))
	}
	return c, nil
}

// canonical decodes raw base64url and refuses any other spelling of the same bytes.
func canonical(s string) ([]byte, error) {
	b, err := b64.DecodeString(s)
	if err != nil {
		return nil, err
	}
	if b64.EncodeToString(b) != s {
		return nil, fmt.Errorf("not canonical base64url")
	}
	return b, nil
}
