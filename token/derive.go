package token

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
)

// MinMasterSize is the shortest master secret DeriveKey accepts (256 bits).
const MinMasterSize = 32

const (
	deriveSalt       = "airlock-token-v1"
	deriveInfoPrefix = "sandbox:"
)

// DeriveKey derives the per-sandbox signing key: HKDF-SHA256(master, salt="airlock-token-v1",
// info="sandbox:"+sandboxID) gives a 32-byte Ed25519 seed. Deriving per sandbox means a key that
// leaks out of one sandbox's host signs for that sandbox only.
func DeriveKey(master []byte, sandboxID string) (ed25519.PrivateKey, error) {
	if len(master) < MinMasterSize {
		return nil, fmt.Errorf("%w: master secret is %d bytes, need at least %d", ErrInvalid, len(master), MinMasterSize)
	}
	if sandboxID == "" {
		return nil, fmt.Errorf("%w: sandbox id is empty", ErrInvalid)
	}
	seed, err := hkdf.Key(sha256.New, master, []byte(deriveSalt), deriveInfoPrefix+sandboxID, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("%w: derive key: %v", ErrInvalid, err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// PrecomputeEd25519 builds, in the background, what this process's first Ed25519 key or signature needs:
// the curve's base point table (1.4-3 ms here, once per process). A one-shot process that
// will mint tokens (airlock run) calls it first thing, so the build overlaps its other work.
func PrecomputeEd25519() {
	go func() { _ = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)) }()
}

// basePoint is the curve's base point, encoded: a valid public key, in no key ring.
var basePoint = ed25519.PublicKey{0x58, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66,
	0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66,
	0x66, 0x66, 0x66, 0x66, 0x66}

// PrecomputeVerify builds, in the background, the table this process's first Ed25519
// verification needs (~0.15 ms here, once per process; a signer's table is another). An agent
// calls it once it is ready, so the build overlaps the caller's first request instead of
// delaying its answer. The signature checked is all zeros (canonical, never valid).
func PrecomputeVerify() { go precomputeVerify() }

// precomputeVerify is a full verification (a canonical signature of a valid key gets past
// every early refusal to the table) that fails.
func precomputeVerify() bool {
	return ed25519.Verify(basePoint, nil, make([]byte, ed25519.SignatureSize))
}
