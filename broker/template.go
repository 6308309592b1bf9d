package broker

import (
	"fmt"
	"strings"
)

// TopicTemplateDefault is Debezium's Outbox Event Router default.
const TopicTemplateDefault = "outbox.event.${aggregatetype}"

// Template makes a topic from an event's fields. Placeholders:
//
//	${aggregatetype}  the aggregate type (also ${routedByValue}, Debezium's name)
//	${type}           the event type
//
// Case is kept as written, as Debezium does since DBZ-1648.
type Template struct {
	parts []part
}

type part struct {
	lit   string
	field string // "" for a literal
}

// TopicFields are the values a template can use.
type TopicFields struct {
	AggregateType string
	Type          string
}

// ParseTemplate parses a topic template.
func ParseTemplate(s string) (*Template, error) {
	t := &Template{}
	rest := s
	for rest != "" {
		i := strings.Index(rest, "${")
		if i < 0 {
			t.parts = append(t.parts, part{lit: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, part{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("topic template %q: unclosed ${", s)
		}
		name := rest[i+2 : i+j]
		switch strings.ToLower(name) {
		case "aggregatetype", "routedbyvalue":
			t.parts = append(t.parts, part{field: "aggregatetype"})
		case "type":
			t.parts = append(t.parts, part{field: "type"})
		default:
			return nil, fmt.Errorf("topic template %q: unknown placeholder ${%s} (want ${aggregatetype} or ${type})", s, name)
		}
		rest = rest[i+j+1:]
	}
	if len(t.parts) == 0 {
		return nil, fmt.Errorf("topic template is empty")
	}
	return t, nil
}

// Execute renders the topic; escape (may be nil) is applied to every field value.
func (t *Template) Execute(f TopicFields, escape func(string) string) string {
	var b strings.Builder
	for _, p := range t.parts {
		var v string
		switch p.field {
		case "":
			b.WriteString(p.lit)
			continue
		case "aggregatetype":
			v = f.AggregateType
		case "type":
			v = f.Type
		}
		if escape != nil {
			v = escape(v)
		}
		b.WriteString(v)
	}
	return b.String()
}
