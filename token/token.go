package token

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Class is the operation class a token grants. Neither class implies the other: an execute token
// cannot manage (pause, destroy, rotate) and a manage token cannot run code or touch files.
type Class string

// Classes.
const (
	Execute Class = "execute"
	Manage  Class = "manage"
)

func (c Class) valid() bool { return c == Execute || c == Manage }

// Claims are what a token asserts. Field order here is the wire order: Verify accepts only the
// exact bytes json.Marshal produces for the parsed claims.
type Claims struct {
	Sandbox    string `json:"sbx"`
	Session    string `json:"ses"`
	Generation uint64 `json:"gen"`
	Class      Class  `json:"op"`
	Expiry     int64  `json:"exp"` // unix seconds; the first second at which the token is invalid
	IssuedAt   int64  `json:"iat,omitempty"`
	KeyID      string `json:"kid"`
}

const (
	// MaxTokenSize bounds a token; Verify refuses longer input before decoding anything.
	MaxTokenSize = 4096
	// MaxExpiry is 9999-12-31T23:59:59Z: beyond it time arithmetic stops being obviously safe.
	MaxExpiry = 253402300799

	// sigPrefix separates token signatures from anything else a key might ever sign.
	sigPrefix = "airlock-token-v1."
	sigB64Len = 86 // raw base64url length of a 64-byte signature
)

// check reports the first thing wrong with c as a complete claim set, or "".
func (c *Claims) check() string {
	switch {
	case c.Sandbox == "":
		return "sandbox (sbx) is empty"
	case !utf8.ValidString(c.Sandbox):
		return "sandbox (sbx) is not valid UTF-8"
	case c.Session == "":
		return "session (ses) is empty"
	case !utf8.ValidString(c.Session):
		return "session (ses) is not valid UTF-8"
	case !c.Class.valid():
		return fmt.Sprintf("class (op) %q is not %q or %q", c.Class, Execute, Manage)
	case c.Expiry <= 0 || c.Expiry > MaxExpiry:
		return fmt.Sprintf("expiry (exp) %d is outside 1..%d", c.Expiry, MaxExpiry)
	case c.IssuedAt < 0 || c.IssuedAt > c.Expiry:
		return fmt.Sprintf("issued-at (iat) %d is outside 0..exp", c.IssuedAt)
	case c.KeyID == "":
		return "key id (kid) is empty"
	}
	return ""
}

// Mint signs c with key and returns "base64url(claimsJSON).base64url(sig)" (raw, unpadded). The
// KeyID field is overwritten with KeyID(key's public key). The signature covers
// "airlock-token-v1." followed by the claims segment exactly as it appears in the token.
func Mint(key ed25519.PrivateKey, c Claims) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("%w: ed25519 private key is %d bytes, want %d", ErrInvalid, len(key), ed25519.PrivateKeySize)
	}
	c.KeyID = KeyID(key.Public().(ed25519.PublicKey))
	if msg := c.check(); msg != "" {
		return "", fmt.Errorf("%w: mint: %s", ErrInvalid, msg)
	}
	js, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("%w: mint: encode claims: %v", ErrInvalid, err)
	}
	payload := b64.EncodeToString(js)
	if n := len(payload) + 1 + sigB64Len; n > MaxTokenSize {
		return "", fmt.Errorf("%w: mint: token would be %d bytes, at most %d allowed", ErrInvalid, n, MaxTokenSize)
	}
	sig := ed25519.Sign(key, []byte(sigPrefix+payload))
	return payload + "." + b64.EncodeToString(sig), nil
}

// Expect is what the verifier requires of a token. Sandbox, Session and Class must be set.
type Expect struct {
	Sandbox    string
	Session    string
	Generation uint64
	Class      Class
	Now        time.Time     // zero means time.Now()
	Leeway     time.Duration // allowed clock skew past exp; must not be negative
}

// Verify checks tok against the ring and want, in this order, stopping at the first failure:
// shape (malformed), signature against every ring key (badSignature), strict claims parsing
// (badClaims), kid equals the verifying key's id (keyMismatch), sandbox, session, generation
// (staleGeneration), expiry, class. Nothing in the claims is read before the signature holds.
// An incomplete want is refused with ErrInvalid before the token is looked at.
func Verify(r *KeyRing, tok string, want Expect) (Claims, error) {
	if err := want.check(); err != nil {
		return Claims{}, err
	}

	// (1) Shape. Length first, so oversized input costs nothing to refuse.
	if len(tok) > MaxTokenSize {
		return Claims{}, reject(ReasonMalformed, fmt.Sprintf("token is %d bytes, at most %d allowed", len(tok), MaxTokenSize))
	}
	if n := strings.Count(tok, "."); n != 1 {
		return Claims{}, reject(ReasonMalformed, fmt.Sprintf("token has %d dots, want exactly 1", n))
	}
	payload, sigText, _ := strings.Cut(tok, ".")
	if payload == "" || sigText == "" {
		return Claims{}, reject(ReasonMalformed, "empty claims or signature part")
	}
	if len(sigText) != sigB64Len {
		return Claims{}, reject(ReasonMalformed, fmt.Sprintf("signature part is %d chars, want %d", len(sigText), sigB64Len))
	}
	claimsJSON, err := decodeCanonical(payload)
	if err != nil {
		return Claims{}, reject(ReasonMalformed, "claims part: "+err.Error())
	}
	sig, err := decodeCanonical(sigText)
	if err != nil {
		return Claims{}, reject(ReasonMalformed, "signature part: "+err.Error())
	}
	if len(sig) != ed25519.SignatureSize {
		return Claims{}, reject(ReasonMalformed, fmt.Sprintf("signature is %d bytes, want %d", len(sig), ed25519.SignatureSize))
	}

	// (2) Signature over the received claims text. The ring is small: try each key rather than
	// trusting the unauthenticated kid to pick one.
	msg := []byte(sigPrefix + payload)
	var signer *ringKey
	keys := r.snapshot()
	for i := range keys {
		if ed25519.Verify(keys[i].pub, msg, sig) {
			signer = &keys[i]
			break
		}
	}
	if signer == nil {
		return Claims{}, reject(ReasonBadSignature, fmt.Sprintf("signature matches none of the %d keys in the ring", len(keys)))
	}

	// (3) Claims, strictly.
	c, detail := parseClaims(claimsJSON)
	if detail != "" {
		return Claims{}, reject(ReasonBadClaims, detail)
	}

	// (4) The claimed key must be the one that signed: a token never names another key.
	if c.KeyID != signer.id {
		return Claims{}, reject(ReasonKeyMismatch, fmt.Sprintf("claims kid %q, signed by key %q", c.KeyID, signer.id))
	}
	// (5)-(7) Scope.
	if c.Sandbox != want.Sandbox {
		return Claims{}, reject(ReasonWrongSandbox, fmt.Sprintf("token is for sandbox %q, want %q", c.Sandbox, want.Sandbox))
	}
	if c.Session != want.Session {
		return Claims{}, reject(ReasonWrongSession, fmt.Sprintf("token is for session %q, want %q", c.Session, want.Session))
	}
	if c.Generation != want.Generation {
		return Claims{}, reject(ReasonStaleGeneration, fmt.Sprintf("token is for generation %d, want %d", c.Generation, want.Generation))
	}
	// (8) Expiry: valid while now < exp + leeway.
	now := want.Now
	if now.IsZero() {
		now = time.Now()
	}
	if deadline := time.Unix(c.Expiry, 0).Add(want.Leeway); !now.Before(deadline) {
		return Claims{}, reject(ReasonExpired, fmt.Sprintf("expired at %s (leeway %s), now %s",
			time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339), want.Leeway, now.UTC().Format(time.RFC3339)))
	}
	// (9) Class: exact match, no hierarchy.
	if c.Class != want.Class {
		return Claims{}, reject(ReasonWrongClass, fmt.Sprintf("token grants %q, want %q", c.Class, want.Class))
	}
	return c, nil
}

// parseClaims decodes signed claims and returns a non-empty detail if they are not a complete,
// canonical claim set. Canonical means byte-equal to json.Marshal of the result, which refuses
// unknown, duplicate, reordered or case-variant keys, whitespace, escapes spelt differently and
// invalid UTF-8, so one claim set has exactly one signed spelling.
func parseClaims(js []byte) (Claims, string) {
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Claims{}, "claims JSON: " + err.Error()
	}
	if _, err := dec.Token(); err != io.EOF {
		return Claims{}, "claims JSON: trailing data after the object"
	}
	canon, err := json.Marshal(c)
	if err != nil || !bytes.Equal(canon, js) {
		return Claims{}, "claims JSON is not in canonical form"
	}
	if msg := c.check(); msg != "" {
		return Claims{}, msg
	}
	return c, ""
}

func (e *Expect) check() error {
	switch {
	case e.Sandbox == "":
		return fmt.Errorf("%w: Expect.Sandbox is empty", ErrInvalid)
	case e.Session == "":
		return fmt.Errorf("%w: Expect.Session is empty", ErrInvalid)
	case !e.Class.valid():
		return fmt.Errorf("%w: Expect.Class %q is not %q or %q", ErrInvalid, e.Class, Execute, Manage)
	case e.Leeway < 0:
		return fmt.Errorf("%w: Expect.Leeway %s is negative", ErrInvalid, e.Leeway)
	}
	return nil
}
