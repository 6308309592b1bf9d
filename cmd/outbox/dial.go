package main

import (
	"context"
	"net"
	"syscall"
	"time"
)

// The client side of every PostgreSQL connection the command opens: a server or
// network that vanishes without a reset (a black hole) is noticed by the kernel,
// not only by each call's deadline. Keepalives find an idle connection dead after
// about idle + count·interval; tcpUserTimeout ends one whose sent bytes stay
// unacknowledged that long, which a slow server never causes (the kernel
// acknowledges, whatever the server makes of the bytes). The replication
// connection of CDC mode copies the pool's dialer, so it has them too.
const (
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = time.Second
	keepAliveCount    = 3
	tcpUserTimeout    = 10 * time.Second
)

// pgDial dials with the keepalives and the user timeout above.
func pgDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount},
		Control: func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil
			}
			var serr error
			if err := c.Control(func(fd uintptr) { serr = setUserTimeout(fd, tcpUserTimeout) }); err != nil {
				return err
			}
			return serr
		},
	}
	return d.DialContext(ctx, network, addr)
}
