package dashboard

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSessions(t *testing.T) {
	t.Parallel()
	a := newAuth("s3cret-admin-token")
	now := time.Now()
	cookie := a.newSession(now)
	with := func(v string) ([]byte, error) {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.Header.Set("Cookie", cookieName+"="+v)
		return a.session(r, now)
	}
	sess, err := with(cookie)
	if err != nil {
		t.Fatalf("a fresh session: %v", err)
	}
	if !a.checkCSRF(sess, a.csrf(sess)) || a.checkCSRF(sess, "") || a.checkCSRF(sess, a.csrf([]byte("other"))) {
		t.Fatal("CSRF check")
	}
	nonce, mac, _ := strings.Cut(cookie, ".")
	for name, v := range map[string]string{
		"tampered mac":    nonce + "." + strings.Repeat("A", len(mac)),
		"no mac":          nonce,
		"garbage":         "%%%",
		"other token":     newAuth("other").newSession(now),
		"expired":         a.newSession(now.Add(-sessionTTL - time.Minute)),
		"from the future": a.newSession(now.Add(time.Hour)),
	} {
		if _, err := with(v); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := newAuth("").session(httptest.NewRequest("GET", "/", nil), now); err == nil {
		t.Error("read-only dashboard: a session without a token")
	}
	if !a.checkToken("s3cret-admin-token") || a.checkToken("s3cre") || a.checkToken("") || newAuth("").checkToken("") {
		t.Error("checkToken")
	}
}

// TestSessionsRound2: a signed-out session's cookie no longer signs in; a cookie of
// another process with the same token does not either (the key is the process's,
// not the token's: a cookie cannot test token guesses offline); parallel wrong
// guesses pass one at a time; the cookie is Secure behind a TLS proxy.
func TestSessionsRound2(t *testing.T) {
	t.Parallel()
	a := newAuth("s3cret-admin-token")
	now := time.Now()
	cookie := a.newSession(now)
	req := func(v string) *http.Request {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.Header.Set("Cookie", cookieName+"="+v)
		return r
	}
	sess, err := a.session(req(cookie), now)
	if err != nil {
		t.Fatal(err)
	}
	a.revoke(sess, now)
	if _, err := a.session(req(cookie), now); err == nil {
		t.Fatal("a signed-out session still signs in")
	}
	if _, err := a.session(req(newAuth("s3cret-admin-token").newSession(now)), now); err == nil {
		t.Fatal("another process's cookie for the same token signs in: the key derives from the token")
	}

	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); a.checkToken("wrong-guess-0000000") }()
	}
	wg.Wait()
	if took := time.Since(start); took < 8*loginPenalty {
		t.Fatalf("8 parallel wrong guesses took %v: they must pass one at a time (%v each)", took, loginPenalty)
	}

	r := httptest.NewRequest("GET", "/ui/", nil)
	if secureRequest(r) {
		t.Fatal("plain HTTP taken for TLS")
	}
	r.Header.Set("X-Forwarded-Proto", "https")
	if !secureRequest(r) {
		t.Fatal("behind a TLS proxy the cookie must be Secure")
	}
}
