package debezium

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Expansion (table.expand.json.payload): the payload text parsed as Jackson reads
// it, a Connect schema inferred from it as the router does, and the value built on
// that schema. Any failure leaves the payload a string, as the router does (it logs
// a warning there; Route reports it as ok=false here).

type jsonNode struct {
	kind   byte // o object, a array, s string, n number, b bool, z null
	str    string
	num    json.Number
	b      bool
	keys   []string
	fields map[string]*jsonNode
	items  []*jsonNode
}

// numberType is Jackson's node class for a number: int32 and int64 for integers that
// fit, float64 for the rest (doubles; big integers are refused).
func (n *jsonNode) numberType() (string, error) {
	s := string(n.num)
	if !strings.ContainsAny(s, ".eE") {
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return "", fmt.Errorf("integer %s does not fit 64 bits", s)
		}
		if i >= math.MinInt32 && i <= math.MaxInt32 {
			return "int32", nil
		}
		return "int64", nil
	}
	return "float64", nil
}

func parseJSON(text string) (*jsonNode, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	// Like Jackson's readTree, the first value is the document: what follows it is
	// not read (FAIL_ON_TRAILING_TOKENS is off by default).
	return readNode(dec)
}

func readNode(dec *json.Decoder) (*jsonNode, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		if t == '{' {
			n := &jsonNode{kind: 'o', fields: map[string]*jsonNode{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				v, err := readNode(dec)
				if err != nil {
					return nil, err
				}
				// A repeated key keeps its first place and its last value (Jackson's
				// ObjectNode).
				if _, dup := n.fields[k]; !dup {
					n.keys = append(n.keys, k)
				}
				n.fields[k] = v
			}
			_, err := dec.Token()
			return n, err
		}
		n := &jsonNode{kind: 'a'}
		for dec.More() {
			v, err := readNode(dec)
			if err != nil {
				return nil, err
			}
			n.items = append(n.items, v)
		}
		_, err := dec.Token()
		return n, err
	case string:
		return &jsonNode{kind: 's', str: t}, nil
	case json.Number:
		return &jsonNode{kind: 'n', num: t}, nil
	case bool:
		return &jsonNode{kind: 'b', b: t}, nil
	}
	return &jsonNode{kind: 'z'}, nil
}

// expander holds the two expansion behaviours.
type expander struct {
	keepNulls       bool // table.json.payload.null.behavior=optional_bytes
	keepEmptyArrays bool // table.json.payload.empty.array.behavior=optional_string
}

// expand returns the payload's schema and value, or an error (the payload then
// stays a string). Only text starting with { or [ is parsed; an array at the top
// has no fields, so it becomes an empty struct, as in the router.
func (x expander) expand(text string) (*schema, any, error) {
	if !strings.HasPrefix(text, "{") && !strings.HasPrefix(text, "[") {
		return nil, nil, errors.New("the payload does not start with { or [")
	}
	doc, err := parseJSON(text)
	if err != nil {
		return nil, nil, err
	}
	s := &schema{typ: "struct", optional: true}
	if doc.kind == 'o' {
		if err := x.addFields(s, doc); err != nil {
			return nil, nil, err
		}
	}
	v, err := x.value(s, doc)
	return s, v, err
}

// addFields adds the fields of object n that s does not have yet.
func (x expander) addFields(s *schema, n *jsonNode) error {
	for _, k := range n.keys {
		if s.field(k) != nil {
			continue
		}
		fs, err := x.schemaOf(n.fields[k])
		if err != nil {
			return fmt.Errorf("field %q: %w", k, err)
		}
		if fs != nil {
			s.fields = append(s.fields, field{k, fs})
		}
	}
	return nil
}

func (s *schema) field(name string) *field {
	for i := range s.fields {
		if s.fields[i].name == name {
			return &s.fields[i]
		}
	}
	return nil
}

// schemaOf infers a value's schema; nil drops the field (a null, or an empty array,
// under the ignore behaviours).
func (x expander) schemaOf(n *jsonNode) (*schema, error) {
	switch n.kind {
	case 's':
		return optionalStringSchema, nil
	case 'b':
		return &schema{typ: "boolean", optional: true}, nil
	case 'n':
		t, err := n.numberType()
		if err != nil {
			return nil, err
		}
		return &schema{typ: t, optional: true}, nil
	case 'o':
		s := &schema{typ: "struct", optional: true}
		return s, x.addFields(s, n)
	case 'z':
		if x.keepNulls {
			return &schema{typ: "bytes", optional: true}, nil
		}
		return nil, nil
	}
	// An array: its members' schema, from the first member that is not null; for
	// objects, the union of every member's fields.
	var sample *jsonNode
	for _, e := range n.items {
		if e.kind == 'z' {
			continue
		}
		if sample == nil {
			sample = e
		} else if e.kind != sample.kind {
			return nil, errors.New("not a homogenous array")
		}
	}
	if sample == nil {
		if len(n.items) == 0 && !x.keepEmptyArrays {
			return nil, nil
		}
		if len(n.items) > 0 && !x.keepNulls {
			return nil, errors.New("an array of nulls has no member schema")
		}
		items := optionalStringSchema
		if len(n.items) > 0 {
			items = &schema{typ: "bytes", optional: true}
		}
		return &schema{typ: "array", optional: true, items: items}, nil
	}
	if sample.kind == 'o' {
		items := &schema{typ: "struct", optional: true}
		for _, e := range n.items {
			if e.kind == 'o' {
				if err := x.addFields(items, e); err != nil {
					return nil, err
				}
			}
		}
		return &schema{typ: "array", optional: true, items: items}, nil
	}
	items, err := x.schemaOf(sample)
	if err != nil || items == nil {
		return nil, errors.New("an array member has no schema")
	}
	return &schema{typ: "array", optional: true, items: items}, nil
}

// value builds n's value on schema s; a member that does not fit s fails.
func (x expander) value(s *schema, n *jsonNode) (any, error) {
	if n == nil || n.kind == 'z' {
		return nil, nil
	}
	switch s.typ {
	case "struct":
		v := &structValue{schema: s, values: make([]any, len(s.fields))}
		if n.kind != 'o' {
			if n.kind == 'a' && len(s.fields) == 0 {
				return v, nil // the top-level array
			}
			return nil, fmt.Errorf("a %c where an object was inferred", n.kind)
		}
		for i, f := range s.fields {
			fv, err := x.value(f.schema, n.fields[f.name])
			if err != nil {
				return nil, fmt.Errorf("field %q: %w", f.name, err)
			}
			v.values[i] = fv
		}
		return v, nil
	case "array":
		if n.kind != 'a' {
			return nil, errors.New("a non-array where an array was inferred")
		}
		out := make([]any, len(n.items))
		for i, e := range n.items {
			ev, err := x.value(s.items, e)
			if err != nil {
				return nil, err
			}
			out[i] = ev
		}
		return out, nil
	case "string":
		if n.kind != 's' {
			return nil, errors.New("a non-string where a string was inferred")
		}
		return n.str, nil
	case "boolean":
		if n.kind != 'b' {
			return nil, errors.New("a non-boolean where a boolean was inferred")
		}
		return n.b, nil
	case "int32", "int64":
		if t, err := n.numberType(); n.kind != 'n' || err != nil || t != s.typ {
			return nil, fmt.Errorf("%s where %s was inferred", n.num, s.typ)
		}
		i, _ := strconv.ParseInt(string(n.num), 10, 64)
		return i, nil
	case "float64":
		if t, _ := n.numberType(); n.kind != 'n' || t != "float64" {
			return nil, fmt.Errorf("%s where a double was inferred", n.num)
		}
		f, err := strconv.ParseFloat(string(n.num), 64)
		return f, err
	case "bytes":
		return nil, errors.New("a value where only nulls were seen")
	}
	return nil, fmt.Errorf("unexpected schema %s", s.typ)
}
