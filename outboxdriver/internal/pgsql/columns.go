package pgsql

import (
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// extraClaims caches the claim statements that also read extra columns, one per
// column list.
type extraClaims struct {
	mu sync.Mutex
	m  map[string]string
}

// claimWith is the claim statement reading cols too, each as its type's name and its
// text (the text format is fixed by DateStyle=ISO in the claim's transaction).
func (s *Statements) claimWith(cols []string) string {
	if len(cols) == 0 {
		return s.claim
	}
	key := strings.Join(cols, "\x00")
	s.extras.mu.Lock()
	defer s.extras.mu.Unlock()
	if st, ok := s.extras.m[key]; ok {
		return st
	}
	var b strings.Builder
	for _, c := range cols {
		q := "o." + pgx.Identifier{c}.Sanitize()
		b.WriteString(", pg_typeof(" + q + ")::text, " + q + "::text")
	}
	st := strings.Replace(s.claim, "\nFROM ", b.String()+"\nFROM ", 1)
	if s.extras.m == nil {
		s.extras.m = map[string]string{}
	}
	s.extras.m[key] = st
	return st
}

// prefixed qualifies each name of a comma list: prefixed("o.", "a, b") is "o.a, o.b".
func prefixed(prefix, list string) string {
	return prefix + strings.ReplaceAll(list, ", ", ", "+prefix)
}
