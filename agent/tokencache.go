//go:build linux

package agent

import (
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/token"
)

// verified remembers tokens that passed token.Verify, so a client that sends the same token on
// every call pays the Ed25519 verification once, not per request (about a fifth of an exec
// handler's CPU). Sound because everything Verify checks is fixed for a given token string and
// this agent — signature, key ring (built once from the config, never changed), claims, sandbox,
// session, generation — except the time, which a hit checks again. Only tokens that verified
// are remembered, so the map grows only with valid tokens, and it is bounded anyway.
type verified struct {
	mu sync.Mutex
	m  map[verifiedKey]int64 // token and class -> its expiry (Unix seconds)
}

type verifiedKey struct {
	tok   string
	class token.Class
}

// maxVerified bounds the cache; when it is full it starts over (clients hold a few tokens).
const maxVerified = 64

// ok reports whether tok was verified for class before and has not expired at now.
func (v *verified) ok(tok string, class token.Class, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	exp, hit := v.m[verifiedKey{tok, class}]
	if !hit {
		return false
	}
	// Verify's own test with no leeway: valid while now < exp.
	if !now.Before(time.Unix(exp, 0)) {
		delete(v.m, verifiedKey{tok, class})
		return false
	}
	return true
}

// add records a token that token.Verify accepted for class with claims c.
func (v *verified) add(tok string, class token.Class, c token.Claims) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= maxVerified {
		v.m = make(map[verifiedKey]int64, maxVerified)
	}
	v.m[verifiedKey{tok, class}] = c.Expiry
}
