package outboxdriver

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// TablePattern names one table ("tenant_7.outbox") or many ("tenant_*.outbox",
// "*.outbox"): `*` in the schema or the table part stands for any run of identifier
// characters. A part without `*` is a plain identifier, validated as Table's are.
type TablePattern struct {
	Schema, Name string
}

// patternPartRE is an identifier in which `*` may stand for any run of characters.
var patternPartRE = regexp.MustCompile(`^[A-Za-z_*][A-Za-z0-9_*]{0,62}$`)

// ParseTablePattern reads [schema.]name, where either part may hold `*`; the schema
// defaults to DefaultSchema.
func ParseTablePattern(s string) (TablePattern, error) {
	p := TablePattern{Schema: DefaultSchema, Name: s}
	if schema, name, ok := strings.Cut(s, "."); ok {
		p.Schema, p.Name = schema, name
	}
	for _, part := range []struct{ what, v string }{{"schema", p.Schema}, {"table", p.Name}} {
		if !patternPartRE.MatchString(part.v) {
			return TablePattern{}, fmt.Errorf("%w: %s pattern %q in %q: want an identifier, with * for any characters", ErrInvalidIdentifier, part.what, part.v, s)
		}
	}
	return p, nil
}

// ParseTablePatterns reads a comma-separated list of patterns (spaces around the
// commas allowed). An empty list, or an empty item, is an error.
func ParseTablePatterns(list string) ([]TablePattern, error) {
	var out []TablePattern
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("%w: empty table in %q (want [schema.]name patterns separated by commas)", ErrInvalidIdentifier, list)
		}
		p, err := ParseTablePattern(item)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Literal reports whether the pattern names one table (it holds no `*`).
func (p TablePattern) Literal() bool {
	return !strings.Contains(p.Schema, "*") && !strings.Contains(p.Name, "*")
}

// Table is the table a literal pattern names.
func (p TablePattern) Table() Table { return Table{Schema: p.Schema, Name: p.Name}.WithDefaults() }

// Match reports whether t's schema and name match the pattern.
func (p TablePattern) Match(t Table) bool {
	// The parts hold only identifier characters and `*`, so path.Match's other
	// metacharacters (?, [, \) never occur and `*` never meets a separator.
	s, _ := path.Match(p.Schema, t.Schema)
	n, _ := path.Match(p.Name, t.Name)
	return s && n
}

// String returns the pattern as written: schema.name.
func (p TablePattern) String() string { return p.Schema + "." + p.Name }

// MatchAny reports whether any of patterns matches t.
func MatchAny(patterns []TablePattern, t Table) bool {
	for _, p := range patterns {
		if p.Match(t) {
			return true
		}
	}
	return false
}
