package debezium

import (
	"fmt"
	"regexp"
	"strings"
)

// compileJava compiles a java.util.regex pattern with Go's regexp, refusing what Java
// refuses and what Go would read differently, so a route.topic.regex copied from a
// connector routes exactly as it did there or stops the relay at start.
func compileJava(pattern string) (*regexp.Regexp, error) {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case c == '\\':
			if i+1 >= len(pattern) {
				return nil, fmt.Errorf("%q: unexpected end after \\", pattern)
			}
			e := pattern[i+1]
			switch {
			case e >= '1' && e <= '9' && !inClass, e == 'k':
				return nil, fmt.Errorf("%q: back references are not supported", pattern)
			case strings.IndexByte("hHvVRXGZecu0", e) >= 0:
				return nil, fmt.Errorf(`%q: \%c is read differently by Java and Go (or not at all)`, pattern, e)
			case e == 'p' || e == 'P':
				return nil, fmt.Errorf(`%q: \%c{...} classes are named differently in Java and Go`, pattern, e)
			}
			b.WriteString(pattern[i : i+2])
			i++
			continue
		case inClass:
			switch {
			case c == ']':
				inClass = false
			case c == '[':
				return nil, fmt.Errorf("%q: a [ inside a character class (Java reads a nested class, Go a literal)", pattern)
			case c == '&' && i+1 < len(pattern) && pattern[i+1] == '&':
				return nil, fmt.Errorf("%q: && in a character class (Java intersects, Go reads a literal)", pattern)
			}
		case c == '[':
			inClass = true
			b.WriteByte(c)
			// A ] right after [ or [^ is a literal in Go and an empty class (an error)
			// in Java.
			if strings.HasPrefix(pattern[i+1:], "]") || strings.HasPrefix(pattern[i+1:], "^]") {
				return nil, fmt.Errorf("%q: an empty character class", pattern)
			}
			continue
		case c == '(' && strings.HasPrefix(pattern[i:], "(?"):
			rest := pattern[i+2:]
			switch {
			case strings.HasPrefix(rest, "<=") || strings.HasPrefix(rest, "<!") || strings.HasPrefix(rest, "=") || strings.HasPrefix(rest, "!"):
				return nil, fmt.Errorf("%q: lookaround is not supported", pattern)
			case strings.HasPrefix(rest, ">"):
				return nil, fmt.Errorf("%q: atomic groups are not supported", pattern)
			case strings.HasPrefix(rest, "<"):
				end := strings.IndexByte(rest, '>')
				if end < 0 {
					return nil, fmt.Errorf("%q: named group is missing its closing >", pattern)
				}
				name := rest[1:end]
				if !javaGroupName.MatchString(name) {
					return nil, fmt.Errorf("%q: group name %q (Java wants a letter, then letters and digits)", pattern, name)
				}
				b.WriteString("(?P<" + name + ">")
				i += 2 + end
				continue
			case strings.HasPrefix(rest, ":"):
			default:
				// Inline flags: i, s and m mean the same in both; Java's u, d, x and U do
				// not exist in Go or mean something else there (U: ungreedy).
				for j := 0; j < len(rest) && rest[j] != ')' && rest[j] != ':'; j++ {
					if strings.IndexByte("ism-", rest[j]) < 0 {
						return nil, fmt.Errorf("%q: inline flag %q is not supported (only i, s and m)", pattern, rest[j])
					}
				}
			}
		case c == '{':
			m := quantifier.FindString(pattern[i:])
			if m == "" {
				return nil, fmt.Errorf("%q: illegal repetition at %q (Java refuses a { that is no quantifier; escape it)", pattern, pattern[i:])
			}
			if i == 0 {
				return nil, fmt.Errorf("%q: dangling quantifier", pattern)
			}
			b.WriteString(m)
			i += len(m) - 1
			if err := checkQuantified(pattern, i); err != nil {
				return nil, err
			}
			continue
		case c == '*' || c == '+' || c == '?':
			if err := checkQuantified(pattern, i); err != nil {
				return nil, err
			}
		}
		b.WriteByte(c)
	}
	if inClass {
		return nil, fmt.Errorf("%q: unclosed character class", pattern)
	}
	re, err := regexp.Compile(b.String())
	if err != nil {
		return nil, fmt.Errorf("%q: %w", pattern, err)
	}
	return re, nil
}

var (
	javaGroupName = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9]*$`)
	quantifier    = regexp.MustCompile(`^\{[0-9]+(,[0-9]*)?\}`)
)

// checkQuantified refuses a possessive quantifier (x*+), which Go lacks, after the
// quantifier ending at i. Lazy (x*?) is the same in both.
func checkQuantified(pattern string, i int) error {
	if pattern[i] != '?' && i+1 < len(pattern) && pattern[i+1] == '+' {
		return fmt.Errorf("%q: possessive quantifiers are not supported", pattern)
	}
	return nil
}

// replacement is a parsed java.util.regex.Matcher replacement: literal text, $n and
// ${name} group references, \x escapes.
type replacement []replacementPart

type replacementPart struct {
	literal string
	group   int // -1: literal
}

// parseReplacement parses a Java replacement against re's groups, with Java's rules:
// $ then a group number (as many digits as still name a group) or ${name}; \ escapes
// the next character; anything else is literal.
func parseReplacement(s string, re *regexp.Regexp) (replacement, error) {
	var out replacement
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			out = append(out, replacementPart{literal: lit.String(), group: -1})
			lit.Reset()
		}
	}
	n := re.NumSubexp()
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			if i+1 >= len(s) {
				return nil, fmt.Errorf("%q: character to be escaped is missing", s)
			}
			lit.WriteByte(s[i+1])
			i++
		case '$':
			if i+1 >= len(s) {
				return nil, fmt.Errorf("%q: illegal group reference: group index is missing", s)
			}
			if s[i+1] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return nil, fmt.Errorf("%q: named capturing group is missing trailing '}'", s)
				}
				name := s[i+2 : i+end]
				g := re.SubexpIndex(name)
				if g < 0 || !javaGroupName.MatchString(name) {
					return nil, fmt.Errorf("%q: no group with name {%s}", s, name)
				}
				flush()
				out = append(out, replacementPart{group: g})
				i += end
				continue
			}
			if s[i+1] < '0' || s[i+1] > '9' {
				return nil, fmt.Errorf("%q: illegal group reference", s)
			}
			g := int(s[i+1] - '0')
			if g > n {
				return nil, fmt.Errorf("%q: no group %d", s, g)
			}
			i++
			for i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				next := g*10 + int(s[i+1]-'0')
				if next > n {
					break
				}
				g = next
				i++
			}
			flush()
			out = append(out, replacementPart{group: g})
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return out, nil
}

// regexRouter is Kafka's RegexRouter, which the Outbox Event Router hands topic
// naming to.
type regexRouter struct {
	find, whole *regexp.Regexp
	repl        replacement
}

func newRegexRouter(pattern, repl string) (*regexRouter, error) {
	find, err := compileJava(pattern)
	if err != nil {
		return nil, fmt.Errorf("route.topic.regex: %w", err)
	}
	r := &regexRouter{find: find, whole: regexp.MustCompile(`^(?:` + find.String() + `)$`)}
	if r.repl, err = parseReplacement(repl, find); err != nil {
		return nil, fmt.Errorf("route.topic.replacement: %w", err)
	}
	return r, nil
}

// topic is RegexRouter's rule: when the pattern matches the whole value
// (Matcher.matches), the value's first match is replaced (Matcher.replaceFirst);
// otherwise the value itself is the topic.
func (r *regexRouter) topic(value string) string {
	if !r.whole.MatchString(value) {
		return value
	}
	m := r.find.FindStringSubmatchIndex(value)
	var b strings.Builder
	b.WriteString(value[:m[0]])
	for _, p := range r.repl {
		if p.group < 0 {
			b.WriteString(p.literal)
		} else if m[2*p.group] >= 0 {
			b.WriteString(value[m[2*p.group]:m[2*p.group+1]])
		}
	}
	b.WriteString(value[m[1]:])
	return b.String()
}
