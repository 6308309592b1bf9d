package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outbox/broker"
)

func TestPlaintextWarnings(t *testing.T) {
	for _, tc := range []struct {
		db, broker string
		warnings   int
	}{
		{"postgres://u@127.0.0.1/db", "nats://127.0.0.1:4222", 0},
		{"postgres://u@localhost/db", "nats://localhost:4222", 0},
		{"postgres://u@db.internal/db", "nats://nats.internal:4222", 2},
		{"postgres://u@db.internal/db?sslmode=require", "tls://nats.internal:4222", 1},
		{"postgres://u@db.internal/db?sslmode=verify-full", "kafkas://k1:9092", 0},
		{"postgres://u@db.internal/db?sslmode=verify-full", "kafka://k1:9092?tls=true", 0},
		{"mysql://u@db.internal/db", "amqp://u:p@mq.internal/", 2},
		{"sqlite:///var/lib/outbox.db", "https://hooks.example/x", 0},
	} {
		if got := plaintextWarnings(tc.db, tc.broker); len(got) != tc.warnings {
			t.Errorf("%s, %s: %d warnings %q, want %d", tc.db, tc.broker, len(got), got, tc.warnings)
		}
	}
}

// TestUITokenWarning: an admin token on a listener that is not loopback is
// announced (it and the session cookie would travel in clear).
func TestUITokenWarning(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		warn        bool
	}{
		{"127.0.0.1:9464", "t", false},
		{"localhost:9464", "t", false},
		{"[::1]:9464", "t", false},
		{":9464", "t", true},
		{"0.0.0.0:9464", "t", true},
		{"10.0.0.5:9464", "t", true},
		{"0.0.0.0:9464", "", false},
	} {
		if got := uiTokenWarning(tc.addr, tc.token) != ""; got != tc.warn {
			t.Errorf("%s (token %q): warning %v, want %v", tc.addr, tc.token, got, tc.warn)
		}
	}
}

// TestWebhookTLSOptions: --webhook-ca trusts a private CA (without it the endpoint is
// not trusted), and --webhook-cert/--webhook-key present a client certificate to an
// endpoint that requires one (mutual TLS).
func TestWebhookTLSOptions(t *testing.T) {
	dir := t.TempDir()
	clientCert, clientKey, clientPool := selfSigned(t, dir, "client")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientPool}
	srv.StartTLS()
	defer srv.Close()
	caFile := filepath.Join(dir, "server-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	msg := []broker.Message{{ID: "a", Topic: "t", Key: "k", Payload: []byte("{}")}}
	publish := func(o brokerOptions) error {
		o.webhookSecret = "whsec_c2VjcmV0"
		p, err := openWebhook(context.Background(), srv.URL, o)
		if err != nil {
			return err
		}
		defer p.Close()
		return p.Publish(context.Background(), msg)[0].Err
	}
	if err := publish(brokerOptions{}); err == nil {
		t.Fatal("an endpoint signed by an unknown CA was trusted")
	}
	if err := publish(brokerOptions{webhookCA: caFile}); err == nil {
		t.Fatal("an endpoint requiring a client certificate took a request without one")
	}
	if err := publish(brokerOptions{webhookCA: caFile, webhookCert: clientCert, webhookKey: clientKey}); err != nil {
		t.Fatalf("with the CA and a client certificate: %v", err)
	}
	if _, err := openWebhook(context.Background(), srv.URL, brokerOptions{webhookSecret: "s", webhookCA: clientKey}); err == nil || !strings.Contains(err.Error(), "--webhook-ca") {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
}

// selfSigned writes a self-signed certificate and key for name and returns their files
// and a pool trusting it.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}
