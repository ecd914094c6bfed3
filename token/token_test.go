package token

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the fixed "now" of these tests; tokens expire at t0+1h unless a case says otherwise.
var t0 = time.Unix(1_800_000_000, 0)

func seedKey(b byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

func baseClaims() Claims {
	return Claims{Sandbox: "sbx-a", Session: "ses-1", Generation: 7, Class: Execute, Expiry: t0.Add(time.Hour).Unix(), IssuedAt: t0.Unix()}
}

func baseExpect() Expect {
	return Expect{Sandbox: "sbx-a", Session: "ses-1", Generation: 7, Class: Execute, Now: t0}
}

func mustMint(t testing.TB, k ed25519.PrivateKey, c Claims) string {
	t.Helper()
	tok, err := Mint(k, c)
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	return tok
}

// signRaw signs arbitrary claims bytes the way Mint does, so tests can present validly signed
// claims that Mint itself would never produce.
func signRaw(k ed25519.PrivateKey, claimsJSON []byte) string {
	p := b64.EncodeToString(claimsJSON)
	return p + "." + b64.EncodeToString(ed25519.Sign(k, []byte(sigPrefix+p)))
}

func canonJSON(t testing.TB, c Claims) []byte {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// flipLastBits returns s with its last base64url character replaced by one that differs only in
// the bits the decoder discards, i.e. a non-canonical spelling of the same bytes.
func flipLastBits(s string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, s[len(s)-1])
	return s[:len(s)-1] + string(alphabet[i^1])
}

func reasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

func TestVerifyReasons(t *testing.T) {
	key, other := seedKey(1), seedKey(2)
	ring := NewKeyRing(pubOf(key))
	kid := KeyID(pubOf(key))
	good := mustMint(t, key, baseClaims())
	payload, sig, _ := strings.Cut(good, ".")
	// A non-canonical spelling of the claims needs spare bits in the last base64 character.
	if len(payload)%4 == 0 {
		t.Fatalf("test setup: claims segment length %d leaves no trailing bits; change baseClaims", len(payload))
	}

	withClaims := func(f func(*Claims)) string {
		c := baseClaims()
		f(&c)
		return mustMint(t, key, c)
	}
	// signedJSON signs hand-written claims; %s in s is replaced by the signer's kid.
	signedJSON := func(s string) string { return signRaw(key, []byte(strings.ReplaceAll(s, "%s", kid))) }

	// An otherwise well-formed token just over the size limit (claims padded with a long session).
	bigClaims := baseClaims()
	bigClaims.KeyID = kid
	bigClaims.Session = strings.Repeat("s", MaxTokenSize)
	oversized := signRaw(key, canonJSON(t, bigClaims))

	flippedSig := []byte(sig)
	flippedSig[10] ^= 0x01 // stays in the alphabet ('A'<->'B' style)
	if bytes.IndexByte([]byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"), flippedSig[10]) < 0 {
		t.Fatal("test setup: flipped signature char left the alphabet")
	}

	tests := []struct {
		name   string
		tok    string
		ring   *KeyRing
		noRing bool // verify against a nil *KeyRing
		want   func(*Expect)
		reason Reason
		detail string // substring the Detail must contain, pinning which check fired
	}{
		{name: "valid", tok: good},

		{name: "oversized", tok: oversized, reason: ReasonMalformed, detail: "at most 4096"},
		{name: "no dot", tok: payload + sig, reason: ReasonMalformed, detail: "0 dots"},
		{name: "two dots", tok: payload + "." + sig[:40] + "." + sig[41:], reason: ReasonMalformed, detail: "2 dots"},
		{name: "trailing dot", tok: good + ".", reason: ReasonMalformed, detail: "2 dots"},
		{name: "empty claims", tok: "." + sig, reason: ReasonMalformed, detail: "empty"},
		{name: "empty signature", tok: payload + ".", reason: ReasonMalformed, detail: "empty"},
		{name: "empty token", tok: "", reason: ReasonMalformed, detail: "0 dots"},
		{name: "short signature", tok: payload + "." + sig[:85], reason: ReasonMalformed, detail: "signature part is 85"},
		{name: "padded signature", tok: good + "==", reason: ReasonMalformed, detail: "signature part is 88"},
		{name: "padded claims", tok: payload + "==." + sig, reason: ReasonMalformed, detail: "claims part"},
		{name: "std base64 alphabet", tok: "ab+/." + sig, reason: ReasonMalformed, detail: "not raw base64url"},
		{name: "claims with newline", tok: payload[:8] + "\n" + payload[8:] + "." + sig, reason: ReasonMalformed, detail: "not canonical"},
		{name: "claims non-canonical trailing bits", tok: flipLastBits(payload) + "." + sig, reason: ReasonMalformed, detail: "claims part"},
		{name: "signature non-canonical trailing bits", tok: payload + "." + flipLastBits(sig), reason: ReasonMalformed, detail: "signature part"},

		{name: "flipped signature bit", tok: payload + "." + string(flippedSig), reason: ReasonBadSignature},
		{name: "signed by unknown key", tok: mustMint(t, other, baseClaims()), reason: ReasonBadSignature},
		{name: "claims swapped under signature", tok: strings.SplitN(withClaims(func(c *Claims) { c.Generation = 8 }), ".", 2)[0] + "." + sig, reason: ReasonBadSignature},
		{name: "empty ring", tok: good, ring: NewKeyRing(), reason: ReasonBadSignature, detail: "none of the 0 keys"},
		{name: "nil ring", tok: good, noRing: true, reason: ReasonBadSignature},

		{name: "signed garbage JSON", tok: signedJSON(`not json`), reason: ReasonBadClaims, detail: "claims JSON"},
		{name: "signed JSON array", tok: signedJSON(`[1,2]`), reason: ReasonBadClaims, detail: "claims JSON"},
		{name: "unknown field", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s","adm":true}`), reason: ReasonBadClaims, detail: "unknown field"},
		{name: "duplicate field", tok: signedJSON(`{"sbx":"sbx-b","sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "canonical"},
		{name: "case-variant key", tok: signedJSON(`{"SBX":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "canonical"},
		{name: "whitespace", tok: signedJSON(`{"sbx": "sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "canonical"},
		{name: "trailing value", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}{}`), reason: ReasonBadClaims, detail: "trailing"},
		{name: "negative generation", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":-1,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "claims JSON"},
		{name: "missing sandbox", tok: signedJSON(`{"sbx":"","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "sandbox (sbx) is empty"},
		{name: "missing session", tok: signedJSON(`{"sbx":"sbx-a","ses":"","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "session (ses) is empty"},
		{name: "unknown class", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"root","exp":1800003600,"iat":1800000000,"kid":"%s"}`), reason: ReasonBadClaims, detail: "class (op)"},
		{name: "zero expiry", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":0,"kid":"%s"}`), reason: ReasonBadClaims, detail: "expiry (exp) 0"},
		{name: "iat after exp", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800003601,"kid":"%s"}`), reason: ReasonBadClaims, detail: "issued-at"},
		{name: "missing kid", tok: signedJSON(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":""}`), reason: ReasonBadClaims, detail: "key id (kid) is empty"},

		{name: "kid names another key", tok: signRaw(key, []byte(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"iat":1800000000,"kid":"`+KeyID(pubOf(other))+`"}`)),
			ring: NewKeyRing(pubOf(key), pubOf(other)), reason: ReasonKeyMismatch},

		{name: "wrong sandbox", tok: withClaims(func(c *Claims) { c.Sandbox = "sbx-b" }), reason: ReasonWrongSandbox},
		{name: "sandbox prefix", tok: withClaims(func(c *Claims) { c.Sandbox = "sbx-a2" }), reason: ReasonWrongSandbox},
		{name: "wrong session", tok: withClaims(func(c *Claims) { c.Session = "ses-2" }), reason: ReasonWrongSession},
		{name: "older generation", tok: withClaims(func(c *Claims) { c.Generation = 6 }), reason: ReasonStaleGeneration},
		{name: "newer generation", tok: withClaims(func(c *Claims) { c.Generation = 8 }), reason: ReasonStaleGeneration},
		{name: "expired", tok: withClaims(func(c *Claims) { c.Expiry = t0.Unix() - 1; c.IssuedAt = 0 }), reason: ReasonExpired},
		{name: "wrong class", tok: good, want: func(e *Expect) { e.Class = Manage }, reason: ReasonWrongClass},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ring
			if tc.ring != nil {
				r = tc.ring
			}
			if tc.noRing {
				r = nil
			}
			want := baseExpect()
			if tc.want != nil {
				tc.want(&want)
			}
			c, err := Verify(r, tc.tok, want)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if c.Sandbox != "sbx-a" || c.KeyID != kid || c.Generation != 7 {
					t.Fatalf("claims = %+v", c)
				}
				return
			}
			if got := reasonOf(err); got != tc.reason {
				t.Fatalf("reason = %q (err %v), want %q", got, err, tc.reason)
			}
			if !errors.Is(err, &Error{Reason: tc.reason}) {
				t.Fatalf("errors.Is(%v, %s) = false", err, tc.reason)
			}
			if !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("error %q does not contain %q", err, tc.detail)
			}
			if c != (Claims{}) {
				t.Fatalf("rejected token returned claims %+v", c)
			}
		})
	}
}

// TestVerifyOrder presents tokens that fail several checks at once and requires the earliest
// check in the documented order to be the one reported.
func TestVerifyOrder(t *testing.T) {
	key := seedKey(1)
	ring := NewKeyRing(pubOf(key))
	garbage := []byte("{this is not json")

	t.Run("oversized garbage is malformed before signature", func(t *testing.T) {
		tok := signRaw(key, bytes.Repeat(garbage, 300))
		if got := reasonOf(verifyBase(ring, tok)); got != ReasonMalformed {
			t.Fatalf("reason %q, want malformed", got)
		}
	})
	t.Run("garbage claims with bad signature is badSignature", func(t *testing.T) {
		tok := signRaw(seedKey(9), garbage) // signed, but not by a ring key
		if got := reasonOf(verifyBase(ring, tok)); got != ReasonBadSignature {
			t.Fatalf("reason %q, want badSignature: claims must not be parsed before the signature holds", got)
		}
	})
	t.Run("garbage claims validly signed is badClaims", func(t *testing.T) {
		if got := reasonOf(verifyBase(ring, signRaw(key, garbage))); got != ReasonBadClaims {
			t.Fatalf("reason %q, want badClaims", got)
		}
	})

	// Every scope check failing at once; fix them one by one, front to back.
	c := Claims{Sandbox: "other", Session: "other", Generation: 99, Class: Manage, Expiry: t0.Unix() - 10, KeyID: "not-the-kid"}
	steps := []struct {
		reason Reason
		fix    func(*Claims)
	}{
		{ReasonKeyMismatch, func(c *Claims) { c.KeyID = KeyID(pubOf(key)) }},
		{ReasonWrongSandbox, func(c *Claims) { c.Sandbox = "sbx-a" }},
		{ReasonWrongSession, func(c *Claims) { c.Session = "ses-1" }},
		{ReasonStaleGeneration, func(c *Claims) { c.Generation = 7 }},
		{ReasonExpired, func(c *Claims) { c.Expiry = t0.Unix() + 10 }},
		{ReasonWrongClass, func(c *Claims) { c.Class = Execute }},
		{"", nil},
	}
	for _, s := range steps {
		err := verifyBase(ring, signRaw(key, canonJSON(t, c)))
		if got := reasonOf(err); got != s.reason {
			t.Fatalf("claims %+v: reason %q (err %v), want %q", c, got, err, s.reason)
		}
		if s.fix != nil {
			s.fix(&c)
		}
	}
}

func verifyBase(r *KeyRing, tok string) error {
	_, err := Verify(r, tok, baseExpect())
	return err
}

func TestVerifyRefusesIncompleteExpect(t *testing.T) {
	key := seedKey(1)
	tok := mustMint(t, key, baseClaims())
	for name, f := range map[string]func(*Expect){
		"no sandbox":     func(e *Expect) { e.Sandbox = "" },
		"no session":     func(e *Expect) { e.Session = "" },
		"no class":       func(e *Expect) { e.Class = "" },
		"unknown class":  func(e *Expect) { e.Class = "admin" },
		"negative leway": func(e *Expect) { e.Leeway = -time.Second },
	} {
		t.Run(name, func(t *testing.T) {
			want := baseExpect()
			f(&want)
			_, err := Verify(NewKeyRing(pubOf(key)), tok, want)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			var e *Error
			if errors.As(err, &e) {
				t.Fatalf("caller mistake reported as token rejection %v", e)
			}
		})
	}
}

func TestRotationWithOverlap(t *testing.T) {
	oldKey, newKey := seedKey(1), seedKey(2)
	ring := NewKeyRing(pubOf(oldKey))
	oldTok := mustMint(t, oldKey, baseClaims())
	newTok := mustMint(t, newKey, baseClaims())

	if err := verifyBase(ring, oldTok); err != nil {
		t.Fatalf("old token before rotation: %v", err)
	}
	if err := verifyBase(ring, newTok); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("new token before its key is added: %v, want badSignature", err)
	}
	ring.Add(pubOf(newKey))
	ring.Add(pubOf(newKey)) // idempotent
	if got := len(ring.IDs()); got != 2 {
		t.Fatalf("IDs after adding new key twice = %d, want 2", got)
	}
	for name, tok := range map[string]string{"old": oldTok, "new": newTok} {
		if err := verifyBase(ring, tok); err != nil {
			t.Fatalf("%s token during overlap: %v", name, err)
		}
	}
	ring.Remove(KeyID(pubOf(oldKey)))
	if err := verifyBase(ring, oldTok); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("old token after removal: %v, want badSignature", err)
	}
	if err := verifyBase(ring, newTok); err != nil {
		t.Fatalf("new token after removal: %v", err)
	}
	if ids := ring.IDs(); len(ids) != 1 || ids[0] != KeyID(pubOf(newKey)) {
		t.Fatalf("IDs = %v", ids)
	}
	ring.Remove("no-such-kid")
	if got := len(ring.IDs()); got != 1 {
		t.Fatalf("removing an unknown kid changed the ring: %v", ring.IDs())
	}
}

// hkdfSHA256 is RFC 5869 written out with crypto/hmac, independent of crypto/hkdf, so the test
// pins the salt and info strings other components must use to derive the same keys.
func hkdfSHA256(secret, salt, info []byte, n int) []byte {
	ext := hmac.New(sha256.New, salt)
	ext.Write(secret)
	prk := ext.Sum(nil)
	var out, prev []byte
	for i := byte(1); len(out) < n; i++ {
		m := hmac.New(sha256.New, prk)
		m.Write(prev)
		m.Write(info)
		m.Write([]byte{i})
		prev = m.Sum(nil)
		out = append(out, prev...)
	}
	return out[:n]
}

func TestDeriveKey(t *testing.T) {
	master := bytes.Repeat([]byte{0x42}, 32)
	a1, err := DeriveKey(master, "sbx-a")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := DeriveKey(master, "sbx-a")
	b, _ := DeriveKey(master, "sbx-b")
	otherMaster := bytes.Repeat([]byte{0x43}, 32)
	a3, _ := DeriveKey(otherMaster, "sbx-a")

	if !a1.Equal(a2) {
		t.Fatal("derivation is not deterministic")
	}
	if a1.Equal(b) {
		t.Fatal("sandboxes a and b derived the same key")
	}
	if a1.Equal(a3) {
		t.Fatal("different masters derived the same key")
	}
	wantSeed := hkdfSHA256(master, []byte("airlock-token-v1"), []byte("sandbox:sbx-a"), 32)
	if !bytes.Equal(a1.Seed(), wantSeed) {
		t.Fatalf("seed = %x, want HKDF-SHA256(master, salt=airlock-token-v1, info=sandbox:sbx-a) = %x", a1.Seed(), wantSeed)
	}

	for name, tc := range map[string]struct {
		master []byte
		sbx    string
	}{
		"short master": {master[:31], "sbx-a"},
		"nil master":   {nil, "sbx-a"},
		"empty id":     {master, ""},
	} {
		if _, err := DeriveKey(tc.master, tc.sbx); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestCrossSandboxKeys(t *testing.T) {
	master := bytes.Repeat([]byte{7}, 48)
	ka, _ := DeriveKey(master, "sbx-a")
	kb, _ := DeriveKey(master, "sbx-b")
	tokA := mustMint(t, ka, baseClaims())

	// B's agent holds only B's key: A's token fails on signature, even when B's agent is asked
	// (wrongly) to expect sandbox A.
	ringB := NewKeyRing(pubOf(kb))
	if err := verifyBase(ringB, tokA); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("A's token under B's key: %v, want badSignature", err)
	}
	// A token minted with B's key claiming sandbox A verifies its signature under B's ring but is
	// still for the wrong sandbox when B's agent checks for itself.
	c := baseClaims()
	c.Sandbox = "sbx-a"
	forged := mustMint(t, kb, c)
	want := baseExpect()
	want.Sandbox = "sbx-b"
	if _, err := Verify(ringB, forged, want); !errors.Is(err, ErrWrongSandbox) {
		t.Fatalf("B-signed token for A at B's agent: %v, want wrongSandbox", err)
	}
	if err := verifyBase(NewKeyRing(pubOf(ka)), tokA); err != nil {
		t.Fatalf("A's token under A's key: %v", err)
	}
}

func TestExpiryBoundary(t *testing.T) {
	key := seedKey(1)
	ring := NewKeyRing(pubOf(key))
	exp := t0.Add(time.Hour)
	c := baseClaims()
	c.Expiry = exp.Unix()
	tok := mustMint(t, key, c)

	tests := []struct {
		now     time.Time
		leeway  time.Duration
		expired bool
	}{
		{exp.Add(-time.Nanosecond), 0, false},
		{exp, 0, true},
		{exp.Add(time.Nanosecond), 0, true},
		{exp.Add(5*time.Second - time.Nanosecond), 5 * time.Second, false},
		{exp.Add(5 * time.Second), 5 * time.Second, true},
		{t0, 0, false},
	}
	for _, tc := range tests {
		want := baseExpect()
		want.Now, want.Leeway = tc.now, tc.leeway
		_, err := Verify(ring, tok, want)
		if tc.expired != errors.Is(err, ErrExpired) || (!tc.expired && err != nil) {
			t.Errorf("now=exp%+v leeway=%s: err = %v, want expired=%v", tc.now.Sub(exp), tc.leeway, err, tc.expired)
		}
	}

	// Zero Now means the real clock.
	real := baseClaims()
	real.IssuedAt = 0
	real.Expiry = time.Now().Add(time.Hour).Unix()
	if _, err := Verify(ring, mustMint(t, key, real), Expect{Sandbox: "sbx-a", Session: "ses-1", Generation: 7, Class: Execute}); err != nil {
		t.Fatalf("unexpired token against the real clock: %v", err)
	}
	real.Expiry = time.Now().Add(-time.Minute).Unix()
	if _, err := Verify(ring, mustMint(t, key, real), Expect{Sandbox: "sbx-a", Session: "ses-1", Generation: 7, Class: Execute}); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired token against the real clock: %v", err)
	}
}

func TestClassesDoNotImplyEachOther(t *testing.T) {
	key := seedKey(1)
	ring := NewKeyRing(pubOf(key))
	for _, minted := range []Class{Execute, Manage} {
		c := baseClaims()
		c.Class = minted
		tok := mustMint(t, key, c)
		for _, asked := range []Class{Execute, Manage} {
			want := baseExpect()
			want.Class = asked
			_, err := Verify(ring, tok, want)
			if minted == asked && err != nil {
				t.Errorf("%s token asked for %s: %v", minted, asked, err)
			}
			if minted != asked && !errors.Is(err, ErrWrongClass) {
				t.Errorf("%s token asked for %s: %v, want wrongClass", minted, asked, err)
			}
		}
	}
}

func TestMint(t *testing.T) {
	key := seedKey(1)
	c := baseClaims()
	c.KeyID = "caller-supplied"
	tok := mustMint(t, key, c)
	got, err := Verify(NewKeyRing(pubOf(key)), tok, baseExpect())
	if err != nil {
		t.Fatal(err)
	}
	if got.KeyID != KeyID(pubOf(key)) {
		t.Fatalf("kid = %q, want the key's id %q", got.KeyID, KeyID(pubOf(key)))
	}
	if again := mustMint(t, key, got); again != tok {
		t.Fatal("minting the same claims twice gave different tokens")
	}
	if len(KeyID(pubOf(key))) != 12 {
		t.Fatalf("KeyID length %d, want 12", len(KeyID(pubOf(key))))
	}
	sum := sha256.Sum256(pubOf(key))
	if KeyID(pubOf(key)) != base64.RawURLEncoding.EncodeToString(sum[:9]) {
		t.Fatal("KeyID is not base64url(sha256(pub)[:9])")
	}

	refuse := map[string]func(*Claims){
		"empty sandbox":      func(c *Claims) { c.Sandbox = "" },
		"empty session":      func(c *Claims) { c.Session = "" },
		"unknown class":      func(c *Claims) { c.Class = "admin" },
		"empty class":        func(c *Claims) { c.Class = "" },
		"zero expiry":        func(c *Claims) { c.Expiry, c.IssuedAt = 0, 0 },
		"negative expiry":    func(c *Claims) { c.Expiry, c.IssuedAt = -5, 0 },
		"expiry past 9999":   func(c *Claims) { c.Expiry = MaxExpiry + 1 },
		"iat after exp":      func(c *Claims) { c.IssuedAt = c.Expiry + 1 },
		"negative iat":       func(c *Claims) { c.IssuedAt = -1 },
		"invalid utf-8":      func(c *Claims) { c.Sandbox = "sbx-\xff" },
		"too large to carry": func(c *Claims) { c.Session = strings.Repeat("x", MaxTokenSize) },
	}
	for name, f := range refuse {
		c := baseClaims()
		f(&c)
		if _, err := Mint(key, c); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := Mint(key[:10], baseClaims()); !errors.Is(err, ErrInvalid) {
		t.Errorf("short key: err = %v, want ErrInvalid", err)
	}
}

func TestErrorText(t *testing.T) {
	key := seedKey(1)
	tok := mustMint(t, key, baseClaims())
	payload, sig, _ := strings.Cut(tok, ".")
	want := baseExpect()
	want.Class = Manage
	_, err := Verify(NewKeyRing(pubOf(key)), tok, want)
	if !errors.Is(err, ErrWrongClass) || errors.Is(err, ErrExpired) {
		t.Fatalf("errors.Is mismatch for %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "wrongClass") || !strings.Contains(msg, "manage") {
		t.Fatalf("message %q lacks reason or detail", msg)
	}
	secrets := []string{payload, sig, b64.EncodeToString(key.Seed()), hex.EncodeToString(key.Seed())}
	for _, bad := range []string{tok, payload + "x." + sig, "garbage"} {
		_, err := Verify(NewKeyRing(pubOf(key)), bad, baseExpect())
		for _, s := range secrets {
			if err != nil && strings.Contains(err.Error(), s) {
				t.Fatalf("error %q leaks token or key material", err)
			}
		}
	}
	if (&Error{Reason: ReasonExpired}).Error() != "token: expired" {
		t.Fatal("sentinel text")
	}
}

func TestKeyRingText(t *testing.T) {
	k1, k2 := pubOf(seedKey(1)), pubOf(seedKey(2))
	ring := NewKeyRing(k1, k2)
	text, err := ring.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseKeyRing(text)
	if err != nil {
		t.Fatalf("ParseKeyRing(%q): %v", text, err)
	}
	if fmt.Sprint(parsed.IDs()) != fmt.Sprint(ring.IDs()) {
		t.Fatalf("round trip IDs %v, want %v", parsed.IDs(), ring.IDs())
	}
	if err := verifyBase(parsed, mustMint(t, seedKey(2), baseClaims())); err != nil {
		t.Fatalf("parsed ring does not verify: %v", err)
	}
	if _, err := NewKeyRing().MarshalText(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty ring MarshalText: %v, want ErrInvalid", err)
	}
	commented := "# agent keys\n\n" + string(text)
	if _, err := ParseKeyRing([]byte(commented)); err != nil {
		t.Fatalf("comments and blank lines: %v", err)
	}

	line := func(p ed25519.PublicKey) string { return KeyID(p) + " " + b64.EncodeToString(p) }
	identity := make([]byte, 32)
	identity[0] = 1
	var many strings.Builder
	for i := range MaxRingKeys + 1 {
		many.WriteString(line(pubOf(seedKey(byte(i+10)))) + "\n")
	}
	bad := []struct{ name, in, detail string }{
		{"empty", "", "no keys"},
		{"only comments", "# nothing\n\n", "no keys"},
		{"wrong kid", KeyID(k2) + " " + b64.EncodeToString(k1), "does not match its key"},
		{"no kid", b64.EncodeToString(k1), "want \"kid base64url(pubkey)\""},
		{"empty kid", " " + b64.EncodeToString(k1), "want \"kid base64url(pubkey)\""},
		{"two spaces", KeyID(k1) + "  " + b64.EncodeToString(k1), "want \"kid base64url(pubkey)\""},
		{"extra field", line(k1) + " extra", "want \"kid base64url(pubkey)\""},
		{"padded key", line(k1) + "=", "not raw base64url"},
		{"std alphabet", KeyID(k1) + " " + base64.StdEncoding.EncodeToString(k1), "not raw base64url"},
		{"short key", KeyID(k1[:31]) + " " + b64.EncodeToString(k1[:31]), "31 bytes"},
		{"crlf", line(k1) + "\r\n", "not canonical"},
		{"non-canonical key", KeyID(k1) + " " + flipLastBits(b64.EncodeToString(k1)), "public key"},
		{"duplicate", line(k1) + "\n" + line(k1) + "\n", "duplicate"},
		{"identity key", line(identity), "identity point"},
		{"too many keys", many.String(), "more than 32 keys"},
		{"too large", "#" + strings.Repeat("x", MaxKeyRingBytes) + "\n" + string(text), "bytes, at most"},
	}
	for _, tc := range bad {
		_, err := ParseKeyRing([]byte(tc.in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.detail) {
			t.Errorf("%s: err = %v, want ErrInvalid mentioning %q", tc.name, err, tc.detail)
		}
	}
}

// smallOrder lists encodings of small-order Edwards points (orders 1, 2, 4, 8; and a sign-bit
// variant), as published in libsodium's blocklist.
var smallOrder = []string{
	"0100000000000000000000000000000000000000000000000000000000000000", // identity
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // order 2 (y = -1)
	"0000000000000000000000000000000000000000000000000000000000000000", // order 4
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", // order 8
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", // order 8
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85", // order 8, x negated
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // y = p+1: non-canonical identity
}

func TestWeakKeysRefused(t *testing.T) {
	identity, _ := hex.DecodeString(smallOrder[0])

	// The threat: with the identity as public key, R = identity, S = 0 verifies every message.
	forgedSig := append(bytes.Clone(identity), make([]byte, 32)...)
	if !ed25519.Verify(identity, []byte("any message"), forgedSig) {
		t.Fatal("test premise: stdlib no longer accepts the identity forgery; revisit CheckPublicKey's rationale")
	}
	// ...and through Verify, had such a key reached a ring.
	poisoned := &KeyRing{keys: []ringKey{{id: KeyID(identity), pub: identity}}}
	c := baseClaims()
	c.KeyID = KeyID(identity)
	p := b64.EncodeToString(canonJSON(t, c))
	forgedTok := p + "." + b64.EncodeToString(forgedSig)
	if err := verifyBase(poisoned, forgedTok); err != nil {
		t.Fatalf("test premise: forged token under identity key: %v", err)
	}

	for _, h := range smallOrder {
		pub, _ := hex.DecodeString(h)
		if err := CheckPublicKey(pub); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckPublicKey(%s) = %v, want ErrInvalid", h[:8], err)
		}
		if _, err := ParseKeyRing([]byte(KeyID(pub) + " " + b64.EncodeToString(pub))); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseKeyRing accepted small-order key %s", h[:8])
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Add accepted small-order key %s", h[:8])
				}
			}()
			NewKeyRing().Add(pub)
		}()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("NewKeyRing accepted a 31-byte key")
			}
		}()
		NewKeyRing(make([]byte, 31))
	}()

	// Every encoding with y >= p (y = p+k, k = 0..18, so up to 2^255-1; either sign) is
	// non-canonical; some are not small-order, so only the canonical check stops them.
	for k := range 19 {
		for _, sign := range []byte{0, 0x80} {
			enc := bytes.Repeat([]byte{0xff}, 32)
			enc[0] = byte(0xed + k) // p = 2^255-19 is ed ff .. ff 7f little-endian
			enc[31] = 0x7f | sign
			if err := CheckPublicKey(enc); !errors.Is(err, ErrInvalid) {
				t.Errorf("non-canonical y = p+%d (sign %x) accepted", k, sign)
			}
		}
	}

	// Real keys pass: the RFC 8032 test 1 key and a spread of generated ones.
	rfc, _ := hex.DecodeString("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
	if err := CheckPublicKey(rfc); err != nil {
		t.Fatalf("RFC 8032 key refused: %v", err)
	}
	for i := range 200 {
		if err := CheckPublicKey(pubOf(seedKey(byte(i)))); err != nil {
			t.Fatalf("generated key %d refused: %v", i, err)
		}
	}
}

func TestKeyRingConcurrent(t *testing.T) {
	keys := []ed25519.PrivateKey{seedKey(1), seedKey(2), seedKey(3)}
	ring := NewKeyRing(pubOf(keys[0]))
	tok := mustMint(t, keys[0], baseClaims())
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				k := pubOf(keys[1+(g+i)%2])
				ring.Add(k)
				if err := verifyBase(ring, tok); err != nil {
					t.Errorf("key 0 never leaves the ring, yet: %v", err)
					return
				}
				_ = ring.IDs()
				ring.Remove(KeyID(k))
			}
		})
	}
	wg.Wait()
	if ids := ring.IDs(); len(ids) != 1 || ids[0] != KeyID(pubOf(keys[0])) {
		t.Fatalf("ring after churn = %v", ids)
	}
}

func FuzzVerify(f *testing.F) {
	keys := []ed25519.PrivateKey{seedKey(1), seedKey(2)}
	ring := NewKeyRing(pubOf(keys[0]), pubOf(keys[1]))
	byID := map[string]ed25519.PrivateKey{KeyID(pubOf(keys[0])): keys[0], KeyID(pubOf(keys[1])): keys[1]}
	want := baseExpect()

	c := baseClaims()
	f.Add(mustMint(f, keys[0], c), []byte(nil))
	f.Add(mustMint(f, keys[1], c), []byte(nil))
	c.Generation = 8
	f.Add(mustMint(f, keys[0], c), canonJSON(f, c))
	f.Add("", []byte(`{"sbx":"sbx-a","ses":"ses-1","gen":7,"op":"execute","exp":1800003600,"kid":"x"}`))
	f.Add("a.b", []byte("garbage"))

	check := func(t *testing.T, tok string) {
		got, err := Verify(ring, tok, want)
		if err != nil {
			if reasonOf(err) == "" {
				t.Fatalf("rejection is not a *token.Error: %v", err)
			}
			return
		}
		// Anything accepted must be exactly what Mint produces for its claims with its key.
		k, ok := byID[got.KeyID]
		if !ok {
			t.Fatalf("accepted token with kid %q not in the ring", got.KeyID)
		}
		again, err := Mint(k, got)
		if err != nil {
			t.Fatalf("accepted claims that Mint refuses: %+v: %v", got, err)
		}
		if again != tok {
			t.Fatalf("accepted token is not the minted spelling of its claims:\n got %q\nmint %q", tok, again)
		}
	}
	f.Fuzz(func(t *testing.T, tok string, claimsJSON []byte) {
		check(t, tok)
		// Validly signed arbitrary claims get past the signature, so the parser is fuzzed too.
		check(t, signRaw(keys[0], claimsJSON))
	})
}

func FuzzParseKeyRing(f *testing.F) {
	text, _ := NewKeyRing(pubOf(seedKey(1)), pubOf(seedKey(2))).MarshalText()
	f.Add(text)
	f.Add([]byte("# c\n\n" + string(text)))
	f.Add([]byte("x y\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseKeyRing(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error is not ErrInvalid: %v", err)
			}
			return
		}
		out, err := r.MarshalText()
		if err != nil {
			t.Fatalf("parsed ring does not marshal: %v", err)
		}
		r2, err := ParseKeyRing(out)
		if err != nil {
			t.Fatalf("marshalled ring does not parse: %v", err)
		}
		out2, _ := r2.MarshalText()
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip unstable:\n%q\n%q", out, out2)
		}
		for _, id := range r.IDs() {
			if !strings.Contains(string(b), id+" ") {
				t.Fatalf("parsed kid %q that the input does not contain", id)
			}
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("ring=%d", n), func(b *testing.B) {
			ring := NewKeyRing()
			byID := map[string]ed25519.PrivateKey{}
			for i := range n {
				k := seedKey(byte(10 + i))
				ring.Add(pubOf(k))
				byID[KeyID(pubOf(k))] = k
			}
			// Keys are tried in id order; sign with the last so ring=3 pays for two misses.
			ids := ring.IDs()
			tok := mustMint(b, byID[ids[len(ids)-1]], baseClaims())
			want := baseExpect()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Verify(ring, tok, want); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMint(b *testing.B) {
	key := seedKey(1)
	c := baseClaims()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Mint(key, c); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPrecomputeVerify: the verification that builds the table uses a valid public key (else
// ed25519.Verify refuses before the table) and accepts nothing.
func TestPrecomputeVerify(t *testing.T) {
	if err := CheckPublicKey(basePoint); err != nil {
		t.Fatalf("the base point is not a usable public key: %v", err)
	}
	if precomputeVerify() {
		t.Fatal("the all-zero signature verified")
	}
}
