//go:build !unix

package client

import "net"

// stillIdle reports that a kept connection is not reused: without a peek that does not wait
// (MSG_DONTWAIT is a unix flag), a connection the agent closed would be found out only by a
// failed request, so each request dials its own.
func stillIdle(net.Conn) bool { return false }
