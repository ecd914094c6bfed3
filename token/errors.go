package token

import "errors"

// Reason names why Verify rejected a token. The values are stable: they appear in logs and on
// wires that report authentication failures.
type Reason string

// Reasons, in the order Verify checks them.
const (
	ReasonMalformed       Reason = "malformed"
	ReasonBadSignature    Reason = "badSignature"
	ReasonBadClaims       Reason = "badClaims"
	ReasonKeyMismatch     Reason = "keyMismatch"
	ReasonWrongSandbox    Reason = "wrongSandbox"
	ReasonWrongSession    Reason = "wrongSession"
	ReasonStaleGeneration Reason = "staleGeneration"
	ReasonExpired         Reason = "expired"
	ReasonWrongClass      Reason = "wrongClass"
)

// Error is a token rejection. Detail never contains the token or key material: a rejected token
// may be a live credential for another sandbox, and logs travel further than tokens should.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "token: " + string(e.Reason)
	}
	return "token: " + string(e.Reason) + ": " + e.Detail
}

// Is matches any *Error with the same Reason, so errors.Is(err, ErrExpired) ignores Detail.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Reason == e.Reason
}

// Sentinels for errors.Is, one per Reason.
var (
	ErrMalformed       error = &Error{Reason: ReasonMalformed}
	ErrBadSignature    error = &Error{Reason: ReasonBadSignature}
	ErrBadClaims       error = &Error{Reason: ReasonBadClaims}
	ErrKeyMismatch     error = &Error{Reason: ReasonKeyMismatch}
	ErrWrongSandbox    error = &Error{Reason: ReasonWrongSandbox}
	ErrWrongSession    error = &Error{Reason: ReasonWrongSession}
	ErrStaleGeneration error = &Error{Reason: ReasonStaleGeneration}
	ErrExpired         error = &Error{Reason: ReasonExpired}
	ErrWrongClass      error = &Error{Reason: ReasonWrongClass}
)

// ErrInvalid is the caller's mistake, not the token's: bad Mint claims, a short master secret, an
// incomplete Expect, an unparsable key ring. It is deliberately not an *Error so that it can never
// be mistaken for a verdict about a presented token.
var ErrInvalid = errors.New("token: invalid input")

func reject(r Reason, detail string) error { return &Error{Reason: r, Detail: detail} }
