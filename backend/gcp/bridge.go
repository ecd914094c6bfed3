package gcp

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// bridgeGrace is how long a closed bridge's launcher process has to end on its own (its stdin
// ended) before it is killed.
const bridgeGrace = 10 * time.Second

// dialBridge opens one connection to the agent inside sandbox name: `sandbox exec NAME --
// AGENT bridge unix:SOCK`, with one end of a socketpair as the launcher's stdin and stdout.
// The launcher forwards only an exec's stdio (gVisor passes no unix socket across its boundary
// and the sandbox has no network), so this is the only way in. The other end is a real unix
// socket, so the agent client's staleness check works on it as on any other.
func (b *Backend) dialBridge(ctx context.Context, name string) (net.Conn, error) {
	argv, err := argvExec(name, true, append(b.agentCmd(), "bridge", "unix:"+agentSocket))
	if err != nil {
		return nil, err
	}
	ours, theirs, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("bridge socketpair: %w", err)
	}
	defer theirs.Close()
	cmd := exec.Command(b.launcher, argv...)
	cmd.Stdin, cmd.Stdout = theirs, theirs
	cmd.Env = b.launcherEnv
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("%w: start the launcher %s: %v", sandbox.ErrUnreachable, b.launcher, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	return &bridgeConn{Conn: c, cmd: cmd, done: done}, nil
}

// bridgeConn is a connection through a launcher process, which Close ends.
type bridgeConn struct {
	net.Conn
	cmd  *exec.Cmd
	done chan struct{}
}

func (c *bridgeConn) Close() error {
	err := c.Conn.Close()
	go func() {
		select {
		case <-c.done:
		case <-time.After(bridgeGrace):
			_ = c.cmd.Process.Kill()
		}
	}()
	return err
}
