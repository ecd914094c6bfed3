//go:build linux

package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
)

// nsRunner creates sockets inside one network namespace. A socket keeps the namespace it was
// created in, so only creation needs the thread switch; I/O then runs on any thread.
type nsRunner struct {
	ns netns.NsHandle // < 0: the caller's own namespace, no switching
}

// do runs fn on a fresh locked OS thread inside r.ns. The thread is discarded, not returned
// to the scheduler, if it cannot be switched back: a goroutine must never run in a namespace
// it did not ask for.
func (r nsRunner) do(fn func() error) error {
	if r.ns < 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(r.ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns: %w", err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func (r nsRunner) dial(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := r.do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func (r nsRunner) listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := r.do(func() error {
		var err error
		l, err = (&net.ListenConfig{}).Listen(ctx, network, addr)
		return err
	})
	return l, err
}

func (r nsRunner) listenPacket(ctx context.Context, network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := r.do(func() error {
		var err error
		l, err = (&net.ListenConfig{}).ListenPacket(ctx, network, addr)
		return err
	})
	return l, err
}

// writeSysctl writes a /proc/sys/net value as seen from inside r.ns (the net sysctls are
// per namespace, resolved from the writing thread).
func (r nsRunner) writeSysctl(path, value string) error {
	return r.do(func() error {
		return os.WriteFile(path, []byte(value), 0o644)
	})
}
