package testutil

import (
	"errors"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// NewNetns makes an anonymous network namespace that lives until the test ends, without
// leaving any goroutine in it.
func NewNetns(tb testing.TB) netns.NsHandle {
	tb.Helper()
	var h netns.NsHandle
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // a thread that cannot go back dies with its goroutine
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err = netns.New()
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		tb.Fatalf("new netns: %v", err)
	}
	tb.Cleanup(func() { h.Close() })
	return h
}
