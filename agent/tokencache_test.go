package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/token"
)

func TestVerifiedCache(t *testing.T) {
	exp := time.Unix(2_000_000_000, 0)
	var v verified
	v.add("tok", token.Execute, token.Claims{Expiry: exp.Unix()})
	tests := []struct {
		name  string
		tok   string
		class token.Class
		now   time.Time
		want  bool
	}{
		{"same token and class, before expiry", "tok", token.Execute, exp.Add(-time.Second), true},
		{"other class", "tok", token.Manage, exp.Add(-time.Second), false},
		{"other token", "tok2", token.Execute, exp.Add(-time.Second), false},
		{"token that is a prefix", "to", token.Execute, exp.Add(-time.Second), false},
		{"at expiry (Verify: valid while now < exp)", "tok", token.Execute, exp, false},
		{"after expiry the entry is gone", "tok", token.Execute, exp.Add(-time.Second), false},
	}
	for _, tc := range tests {
		if got := v.ok(tc.tok, tc.class, tc.now); got != tc.want {
			t.Errorf("%s: ok = %v, want %v", tc.name, got, tc.want)
		}
	}
	for i := range maxVerified + 10 {
		v.add(fmt.Sprint("t", i), token.Execute, token.Claims{Expiry: exp.Unix()})
		if len(v.m) > maxVerified {
			t.Fatalf("%d entries, bound %d", len(v.m), maxVerified)
		}
	}
}
