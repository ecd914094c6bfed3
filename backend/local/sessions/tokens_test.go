package sessions

import (
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/token"
)

// TestTokens: within one second the memo hands out exactly what minting again would
// give (same claims, deterministic signature); a new second gets a token of its own, valid for
// TokenLifetime from then.
func TestTokens(t *testing.T) {
	key, err := token.DeriveKey(make([]byte, 32), "s-0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	rec := RecordCore{ID: "s-0123456789abcdef", SandboxID: "box", Generation: 3}
	ring := token.NewKeyRing(key.Public().(ed25519.PublicKey))
	base := time.Unix(1_800_000_000, 0)
	clock := base
	next := Tokens(key, rec, func() time.Time { return clock })
	fresh := func(at time.Time) string {
		return Tokens(key, rec, func() time.Time { return at })()
	}
	tests := []struct {
		name string
		at   time.Time
		same bool // the previous step's token again
	}{
		{"first", base, false},
		{"same second", base.Add(999 * time.Millisecond), true},
		{"next second", base.Add(time.Second), false},
		{"later still", base.Add(45 * time.Second), false},
	}
	prev := ""
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock = tt.at
			got := next()
			if got != fresh(tt.at) {
				t.Fatalf("memo gave a token minting now would not")
			}
			if (got == prev) != tt.same {
				t.Fatalf("same as the previous token: %v, want %v", got == prev, tt.same)
			}
			prev = got
			c, err := token.Verify(ring, got, token.Expect{Sandbox: "box", Session: rec.ID, Generation: 3, Class: token.Execute, Now: tt.at})
			if err != nil {
				t.Fatal(err)
			}
			if c.Expiry != tt.at.Add(TokenLifetime).Unix() {
				t.Fatalf("expiry %d, want %d", c.Expiry, tt.at.Add(TokenLifetime).Unix())
			}
		})
	}
}

// TestClaimTokens: an entry's own token is what the claimer sends (no key derived, nothing
// signed); an entry without one gets tokens minted with the session's key.
func TestClaimTokens(t *testing.T) {
	master := make([]byte, 32)
	rec := &Record{RecordCore: RecordCore{ID: "s-0123456789abcdef", SandboxID: "box", Generation: 2}}
	key, err := token.DeriveKey(master, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	ring := token.NewKeyRing(key.Public().(ed25519.PublicKey))
	want := token.Expect{Sandbox: "box", Session: rec.ID, Generation: 2, Class: token.Execute}

	got, err := claimTokens(Entry{Session: rec.ID, Token: "the filler's"}, nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	if tok := got(); tok != "the filler's" {
		t.Fatalf("with the entry's token the claimer sends %q", tok)
	}
	got, err = claimTokens(Entry{Session: rec.ID}, master, rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := token.Verify(ring, got(), want); err != nil {
		t.Fatalf("minted without the entry's token: %v", err)
	}
}
