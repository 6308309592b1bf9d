// Package natsembed runs a NATS server with JetStream inside the process, on loopback
// and a random port, with its store in a folder of the caller's. The demo uses it, and
// tests use it where they need to stop and restart a real server.
package natsembed

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an in-process NATS server.
type Server struct {
	ns   *server.Server
	opts server.Options
}

// startTimeout bounds a server's start: a cluster member on a loaded machine (a CI
// run of every package at once) can take well over ten seconds to be ready.
const startTimeout = time.Minute

// Start starts a server storing JetStream data in storeDir, on a free port.
func Start(storeDir string) (*Server, error) {
	s := &Server{opts: server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  storeDir,
		NoSigs:    true,
		NoLog:     true,
	}}
	if err := s.start(); err != nil {
		return nil, err
	}
	// Restarts keep the port the first start was given.
	s.opts.Port = s.ns.Addr().(*net.TCPAddr).Port
	return s, nil
}

func (s *Server) start() error {
	opts := s.opts
	ns, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(startTimeout) {
		ns.Shutdown()
		return fmt.Errorf("embedded NATS did not start within %v", startTimeout)
	}
	s.ns = ns
	return nil
}

// URL is the client URL.
func (s *Server) URL() string { return s.ns.ClientURL() }

// Stop shuts the server down and waits for it.
func (s *Server) Stop() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// Restart stops the server and starts it again on the same port and store.
func (s *Server) Restart() error {
	s.Stop()
	return s.start()
}

// StartCluster starts a JetStream cluster of len(storeDirs) servers on loopback
// (named n0, n1, ...), each storing in its folder, and returns once every server
// accepts connections. Restart a member with its Restart.
func StartCluster(storeDirs []string) ([]*Server, error) {
	n := len(storeDirs)
	ports := make([]int, 2*n) // client ports, then route ports
	for i := range ports {
		ln, err := new(net.ListenConfig).Listen(context.Background(), "tcp", "127.0.0.1:0") // a free port, at once
		if err != nil {
			return nil, err
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
	}
	routes := ""
	for i := 0; i < n; i++ {
		if i > 0 {
			routes += ","
		}
		routes += fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i])
	}
	servers := make([]*Server, n)
	errs := make(chan error, n)
	for i := range servers {
		servers[i] = &Server{opts: server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   storeDirs[i],
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "outbox", Host: "127.0.0.1", Port: ports[n+i]},
			Routes:     server.RoutesFromStr(routes),
		}}
		go func(s *Server) { errs <- s.start() }(servers[i])
	}
	var first error
	for range servers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		for _, s := range servers {
			if s.ns != nil {
				s.Stop()
			}
		}
		return nil, first
	}
	return servers, nil
}

// Name is the server's name (a cluster member's, as JetStream reports leaders).
func (s *Server) Name() string { return s.opts.ServerName }
