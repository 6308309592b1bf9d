package dashboard

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestSessions(t *testing.T) {
	a := newAuth("s3cret")
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
	if !a.checkToken("s3cret") || a.checkToken("s3cre") || a.checkToken("") || newAuth("").checkToken("") {
		t.Error("checkToken")
	}
}
