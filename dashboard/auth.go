package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Sessions: the cookie holds a random nonce, its issue time and a MAC under a key
// drawn at random when the dashboard starts. The key has nothing of the admin token
// in it, so a cookie cannot be used to test token guesses offline; a restart ends
// every session. Signing out revokes the session's nonce (kept until it would have
// expired anyway). Each session's CSRF token is a MAC of its nonce.
const (
	cookieName = "outbox_ui"
	sessionTTL = 12 * time.Hour
	// MinTokenLength is the shortest admin token accepted.
	MinTokenLength = 16
	// loginPenalty is how long a wrong token holds the sign-in door for everyone: at
	// most one guess per penalty, however many are tried at once.
	loginPenalty = 300 * time.Millisecond
)

var errNoSession = errors.New("not signed in")

type auth struct {
	token []byte // SHA-256 of the admin token; nil: read-only, nobody signs in
	key   []byte // the sessions' MAC key, random per process

	door    sync.Mutex // held through a wrong guess's penalty
	mu      sync.Mutex
	revoked map[string]time.Time // signed-out nonces, until their expiry
}

func newAuth(token string) *auth {
	if token == "" {
		return &auth{}
	}
	sum := sha256.Sum256([]byte(token))
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return &auth{token: sum[:], key: key, revoked: map[string]time.Time{}}
}

func (a *auth) enabled() bool { return a.token != nil }

func (a *auth) mac(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, a.key)
	for _, p := range parts {
		m.Write(p)
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// checkToken compares a presented token with the configured one in constant time
// (their SHA-256 sums). Guesses pass one at a time: a wrong one holds the door for
// loginPenalty, so parallel guessing is no faster than serial.
func (a *auth) checkToken(token string) bool {
	if !a.enabled() || token == "" {
		return false
	}
	a.door.Lock()
	defer a.door.Unlock()
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], a.token) == 1 {
		return true
	}
	time.Sleep(loginPenalty)
	return false
}

// newSession returns a cookie value for a new session.
func (a *auth) newSession(now time.Time) string {
	var raw [24]byte
	_, _ = rand.Read(raw[:16])
	binary.BigEndian.PutUint64(raw[16:], uint64(now.Unix()))
	return b64(raw[:]) + "." + b64(a.mac([]byte("session"), raw[:]))
}

// session returns the nonce of a valid session cookie.
func (a *auth) session(r *http.Request, now time.Time) ([]byte, error) {
	if !a.enabled() {
		return nil, errNoSession
	}
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil, errNoSession
	}
	rawText, macText, ok := strings.Cut(c.Value, ".")
	if !ok {
		return nil, errNoSession
	}
	raw, err1 := base64.RawURLEncoding.DecodeString(rawText)
	mac, err2 := base64.RawURLEncoding.DecodeString(macText)
	if err1 != nil || err2 != nil || len(raw) != 24 || !hmac.Equal(mac, a.mac([]byte("session"), raw)) {
		return nil, errNoSession
	}
	issued := time.Unix(int64(binary.BigEndian.Uint64(raw[16:])), 0)
	if now.Sub(issued) > sessionTTL || issued.After(now.Add(time.Minute)) {
		return nil, errNoSession
	}
	a.mu.Lock()
	_, out := a.revoked[string(raw)]
	a.mu.Unlock()
	if out {
		return nil, errNoSession
	}
	return raw, nil
}

// revoke ends a session before its expiry (sign-out).
func (a *auth) revoke(session []byte, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for n, until := range a.revoked {
		if now.After(until) {
			delete(a.revoked, n)
		}
	}
	issued := time.Unix(int64(binary.BigEndian.Uint64(session[16:])), 0)
	a.revoked[string(session)] = issued.Add(sessionTTL)
}

// csrf is the token a session's forms carry.
func (a *auth) csrf(session []byte) string { return b64(a.mac([]byte("csrf"), session)) }

func (a *auth) checkCSRF(session []byte, presented string) bool {
	want := a.csrf(session)
	return subtle.ConstantTimeCompare([]byte(want), []byte(presented)) == 1
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// secureRequest reports whether the browser reached the dashboard over TLS: its own,
// or the TLS proxy's in front of it (X-Forwarded-Proto). The session cookie is then
// Secure. (A forged header only makes the cookie stricter.)
func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}
