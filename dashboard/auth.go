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
	"time"
)

// Sessions are stateless: the cookie holds a random nonce, its issue time and a MAC
// under a key derived from the admin token, so they survive a restart and a new
// token ends them all. Each session's CSRF token is a MAC of its nonce.
const (
	cookieName = "outbox_ui"
	sessionTTL = 12 * time.Hour
)

var errNoSession = errors.New("not signed in")

type auth struct {
	key []byte // nil: read-only, nobody signs in
}

func newAuth(token string) *auth {
	if token == "" {
		return &auth{}
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("outbox dashboard session key"))
	return &auth{key: m.Sum(nil)}
}

func (a *auth) enabled() bool { return a.key != nil }

func (a *auth) mac(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, a.key)
	for _, p := range parts {
		m.Write(p)
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// checkToken compares a presented token with the configured one in constant time
// (through the derived key: equal keys, equal tokens).
func (a *auth) checkToken(token string) bool {
	if !a.enabled() || token == "" {
		return false
	}
	return hmac.Equal(newAuth(token).key, a.key)
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
	return raw, nil
}

// csrf is the token a session's forms carry.
func (a *auth) csrf(session []byte) string { return b64(a.mac([]byte("csrf"), session)) }

func (a *auth) checkCSRF(session []byte, presented string) bool {
	want := a.csrf(session)
	return subtle.ConstantTimeCompare([]byte(want), []byte(presented)) == 1
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
