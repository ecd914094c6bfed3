package operator

import (
	"context"
	"crypto/sha256"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
)

// CachingReviewer remembers successful reviews for TTL, taking the API server's two round trips
// off the claim path. Failures are never cached. The cost is that a revoked token or a
// removed RoleBinding keeps working for up to TTL (the API server's own webhook caches keep
// allowed decisions for minutes); docs/kubernetes.md says so.
type CachingReviewer struct {
	Next Reviewer
	TTL  time.Duration
	Now  func() time.Time

	mu    sync.Mutex
	users map[[32]byte]cachedUser
	allow map[string]time.Time
}

type cachedUser struct {
	u   authnv1.UserInfo
	exp time.Time
}

// maxCached bounds each map; when full it is emptied (simple, and a full cache means load, not
// a steady state worth optimising).
const maxCached = 4096

func (c *CachingReviewer) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Authenticate implements Reviewer.
func (c *CachingReviewer) Authenticate(ctx context.Context, bearer string) (authnv1.UserInfo, error) {
	key := sha256.Sum256([]byte(bearer))
	now := c.now()
	c.mu.Lock()
	if e, ok := c.users[key]; ok && now.Before(e.exp) {
		c.mu.Unlock()
		return e.u, nil
	}
	c.mu.Unlock()
	u, err := c.Next.Authenticate(ctx, bearer)
	if err != nil {
		return u, err
	}
	c.mu.Lock()
	if c.users == nil || len(c.users) >= maxCached {
		c.users = map[[32]byte]cachedUser{}
	}
	c.users[key] = cachedUser{u: u, exp: now.Add(c.TTL)}
	c.mu.Unlock()
	return u, nil
}

// Authorize implements Reviewer.
func (c *CachingReviewer) Authorize(ctx context.Context, u authnv1.UserInfo, namespace, name string) error {
	// Everything the decision depends on is in the key: user, uid, groups, and the object.
	extra := make([]string, 0, len(u.Extra))
	for k, v := range u.Extra {
		extra = append(extra, k+"="+strings.Join(v, ","))
	}
	slices.Sort(extra)
	key := strings.Join([]string{u.Username, u.UID, strings.Join(u.Groups, ","), strings.Join(extra, ";"), namespace, name}, "\x00")
	now := c.now()
	c.mu.Lock()
	if exp, ok := c.allow[key]; ok && now.Before(exp) {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if err := c.Next.Authorize(ctx, u, namespace, name); err != nil {
		return err
	}
	c.mu.Lock()
	if c.allow == nil || len(c.allow) >= maxCached {
		c.allow = map[string]time.Time{}
	}
	c.allow[key] = now.Add(c.TTL)
	c.mu.Unlock()
	return nil
}
