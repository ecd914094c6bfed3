package operator

import (
	"context"
	"errors"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"

	"github.com/airlock-sandbox/airlock/sandbox"
)

type countingReviewer struct {
	fakeReviewer
	authn, authz int
}

func (c *countingReviewer) Authenticate(ctx context.Context, b string) (authnv1.UserInfo, error) {
	c.authn++
	return c.fakeReviewer.Authenticate(ctx, b)
}

func (c *countingReviewer) Authorize(ctx context.Context, u authnv1.UserInfo, ns, name string) error {
	c.authz++
	return c.fakeReviewer.Authorize(ctx, u, ns, name)
}

func TestCachingReviewer(t *testing.T) {
	now := time.Unix(1000, 0)
	next := &countingReviewer{fakeReviewer: fakeReviewer{allowed: map[string]bool{"alice ns/box": true}}}
	c := &CachingReviewer{Next: next, TTL: 10 * time.Second, Now: func() time.Time { return now }}
	ctx := context.Background()

	for range 3 {
		if _, err := c.Authenticate(ctx, "garbage"); !errors.Is(err, sandbox.ErrUnauthenticated) {
			t.Fatal(err)
		}
	}
	if next.authn != 3 {
		t.Errorf("failed authentications reached the API %d times, want 3 (failures are not cached)", next.authn)
	}
	alice, _ := c.Authenticate(ctx, "user:alice")
	c.Authenticate(ctx, "user:alice")
	if next.authn != 4 {
		t.Errorf("a cached token was reviewed again (%d reviews)", next.authn)
	}
	for range 2 {
		if err := c.Authorize(ctx, alice, "ns", "box"); err != nil {
			t.Fatal(err)
		}
		if err := c.Authorize(ctx, alice, "ns", "other"); !errors.Is(err, sandbox.ErrForbidden) {
			t.Fatalf("denied decision: %v", err)
		}
	}
	if next.authz != 3 {
		t.Errorf("authorisations reached the API %d times, want 3 (one allowed cached, denials never)", next.authz)
	}
	// Other groups are another subject.
	withGroup := alice
	withGroup.Groups = []string{"admins"}
	c.Authorize(ctx, withGroup, "ns", "box")
	if next.authz != 4 {
		t.Errorf("a decision was reused for a subject with other groups")
	}
	now = now.Add(11 * time.Second)
	c.Authenticate(ctx, "user:alice")
	c.Authorize(ctx, alice, "ns", "box")
	if next.authn != 5 || next.authz != 5 {
		t.Errorf("expired entries were reused (authn %d authz %d)", next.authn, next.authz)
	}
}
