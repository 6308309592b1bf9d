package main

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPgDialSetsTimeouts: the command's PostgreSQL connections carry keepalives and
// TCP_USER_TIMEOUT, so a black-holed server is found by the kernel too.
func TestPgDialSetsTimeouts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := pgDial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var user, alive, idle int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		user, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		if gerr == nil {
			alive, gerr = unix.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
		}
		if gerr == nil {
			idle, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		}
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if user != int(tcpUserTimeout.Milliseconds()) || alive != 1 || idle != int(keepAliveIdle.Seconds()) {
		t.Fatalf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d, TCP_KEEPIDLE %d s; want %d, 1, %d", user, alive, idle,
			tcpUserTimeout.Milliseconds(), int(keepAliveIdle.Seconds()))
	}
}
