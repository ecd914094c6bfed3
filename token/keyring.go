package token

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
)

// Limits on the key ring text: the ring is tried key by key for every token, so its size bounds
// the work an unauthenticated caller can cause.
const (
	MaxRingKeys     = 32
	MaxKeyRingBytes = 64 << 10
)

// b64 is raw (unpadded) base64url that also refuses non-zero trailing bits; callers still compare
// a re-encoding because the decoder skips CR and LF.
var b64 = base64.RawURLEncoding.Strict()

// KeyID is a stable short id for a public key: base64url(sha256(pub)[:9]), 12 characters.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

type ringKey struct {
	id  string
	pub ed25519.PublicKey
}

// KeyRing holds the public keys an agent accepts. It is safe for concurrent use. Rotation is
// Add(new), hand out tokens from the new key, then Remove(old id) once old tokens have expired.
type KeyRing struct {
	mu sync.RWMutex
	// keys is copy-on-write and sorted by id, so Verify reads a snapshot without holding the lock
	// across signature checks.
	keys []ringKey
}

// NewKeyRing returns a ring holding pubs. It panics like Add on an unusable key.
func NewKeyRing(pubs ...ed25519.PublicKey) *KeyRing {
	r := &KeyRing{}
	for _, p := range pubs {
		r.Add(p)
	}
	return r
}

// Add inserts pub; adding a key already present is a no-op. Add panics if pub is not 32 bytes or
// is a weak (small-order or non-canonically encoded) point: such a key would either crash
// ed25519.Verify or accept forged signatures for every message, and Add has no error to return.
// Use ParseKeyRing or CheckPublicKey for keys that come from outside the program.
func (r *KeyRing) Add(pub ed25519.PublicKey) {
	if err := CheckPublicKey(pub); err != nil {
		panic(err.Error())
	}
	k := ringKey{id: KeyID(pub), pub: bytes.Clone(pub)}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, found := slices.BinarySearchFunc(r.keys, k.id, func(e ringKey, id string) int { return strings.Compare(e.id, id) })
	if found {
		return
	}
	r.keys = slices.Insert(slices.Clone(r.keys), i, k)
}

// Remove drops the key with id kid; an unknown id is a no-op.
func (r *KeyRing) Remove(kid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = slices.DeleteFunc(slices.Clone(r.keys), func(e ringKey) bool { return e.id == kid })
}

// IDs returns the key ids in the ring, sorted.
func (r *KeyRing) IDs() []string {
	ids := []string{}
	for _, k := range r.snapshot() {
		ids = append(ids, k.id)
	}
	return ids
}

func (r *KeyRing) snapshot() []ringKey {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.keys
}

// MarshalText writes one "kid base64url(pub)\n" line per key, sorted by kid. An empty ring is
// refused: handed to an agent it would reject every call, which is never what was meant.
func (r *KeyRing) MarshalText() ([]byte, error) {
	keys := r.snapshot()
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: key ring is empty", ErrInvalid)
	}
	var b bytes.Buffer
	for _, k := range keys {
		b.WriteString(k.id)
		b.WriteByte(' ')
		b.WriteString(b64.EncodeToString(k.pub))
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// ParseKeyRing reads the MarshalText form. Blank lines and lines starting with '#' are skipped.
// Every other line must be exactly "kid pub" with a single space, pub canonical raw base64url of
// 32 bytes, kid equal to KeyID(pub) (so a corrupted or mismatched line is caught here, not at the
// first failed call). Duplicates, weak keys, an empty ring and more than MaxRingKeys are refused.
func ParseKeyRing(b []byte) (*KeyRing, error) {
	if len(b) > MaxKeyRingBytes {
		return nil, fmt.Errorf("%w: key ring is %d bytes, at most %d allowed", ErrInvalid, len(b), MaxKeyRingBytes)
	}
	r := &KeyRing{}
	seen := map[string]bool{}
	for n, line := range strings.Split(string(b), "\n") {
		lineNo := n + 1
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kid, enc, ok := strings.Cut(line, " ")
		if !ok || kid == "" || enc == "" || strings.Contains(enc, " ") {
			return nil, fmt.Errorf("%w: key ring line %d: want \"kid base64url(pubkey)\"", ErrInvalid, lineNo)
		}
		pub, err := decodeCanonical(enc)
		if err != nil {
			return nil, fmt.Errorf("%w: key ring line %d: public key: %v", ErrInvalid, lineNo, err)
		}
		if err := CheckPublicKey(pub); err != nil {
			return nil, fmt.Errorf("%w: key ring line %d: %v", ErrInvalid, lineNo, err)
		}
		if want := KeyID(pub); kid != want {
			return nil, fmt.Errorf("%w: key ring line %d: kid %q does not match its key (its id is %q)", ErrInvalid, lineNo, kid, want)
		}
		if seen[kid] {
			return nil, fmt.Errorf("%w: key ring line %d: duplicate kid %q", ErrInvalid, lineNo, kid)
		}
		if len(seen) == MaxRingKeys {
			return nil, fmt.Errorf("%w: key ring has more than %d keys", ErrInvalid, MaxRingKeys)
		}
		seen[kid] = true
		r.Add(pub)
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("%w: key ring has no keys", ErrInvalid)
	}
	return r, nil
}

// decodeCanonical decodes raw base64url and refuses any text that is not exactly what encoding
// the result produces (padding, CR/LF, non-zero trailing bits): one value, one spelling.
func decodeCanonical(s string) ([]byte, error) {
	b, err := b64.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not raw base64url (%d chars)", len(s))
	}
	if b64.EncodeToString(b) != s {
		return nil, fmt.Errorf("not canonical raw base64url (%d chars)", len(s))
	}
	return b, nil
}

var (
	fieldP = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	bigOne = big.NewInt(1)
	// x25519SK is built at first use: NewPrivateKey computes a public key (a scalar
	// multiplication), which every start of a process linking token would pay at init.
	x25519SK = sync.OnceValue(func() *ecdh.PrivateKey {
		// Any scalar works: X25519 clamps it to a multiple of the cofactor, so a low-order input
		// always yields the all-zero output that crypto/ecdh refuses.
		k, err := ecdh.X25519().NewPrivateKey(make([]byte, 32))
		if err != nil {
			panic(err)
		}
		return k
	})
)

// CheckPublicKey refuses a public key that is the wrong size, encodes y non-canonically, or is a
// small-order point. ed25519.Verify (cofactorless) accepts, for a small-order public key A,
// signatures that need no private key at all (for the identity: R = identity, S = 0 verifies every
// message), so one such key in a ring would let anyone mint tokens. Order is checked by mapping
// the point to its Montgomery u and letting crypto/ecdh reject the low-order result.
func CheckPublicKey(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: ed25519 public key is %d bytes, want %d", ErrInvalid, len(pub), ed25519.PublicKeySize)
	}
	be := make([]byte, 32)
	for i := range 32 {
		be[i] = pub[31-i]
	}
	be[0] &= 0x7f // drop the sign of x
	y := new(big.Int).SetBytes(be)
	if y.Cmp(fieldP) >= 0 {
		return fmt.Errorf("%w: ed25519 public key %s: non-canonical encoding", ErrInvalid, KeyID(pub))
	}
	den := new(big.Int).Sub(bigOne, y)
	den.Mod(den, fieldP)
	if den.Sign() == 0 {
		return fmt.Errorf("%w: ed25519 public key %s: identity point", ErrInvalid, KeyID(pub))
	}
	u := new(big.Int).Add(bigOne, y)
	u.Mul(u, den.ModInverse(den, fieldP))
	u.Mod(u, fieldP)
	ub := u.FillBytes(make([]byte, 32))
	slices.Reverse(ub)
	mp, err := ecdh.X25519().NewPublicKey(ub)
	if err == nil {
		_, err = x25519SK().ECDH(mp)
	}
	if err != nil {
		return fmt.Errorf("%w: ed25519 public key %s: small-order point", ErrInvalid, KeyID(pub))
	}
	return nil
}
