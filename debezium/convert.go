package debezium

import (
	"encoding/base64"
	"math"
	"strconv"
	"strings"
)

// A small model of Kafka Connect data, enough to render a record's key and value
// the way a Kafka Connect converter would.

// schema is a Connect schema.
type schema struct {
	typ      string // string, bytes, boolean, int16, int32, int64, float32, float64, struct, array
	optional bool
	name     string
	version  int // 0: none
	fields   []field
	items    *schema
}

type field struct {
	name   string
	schema *schema
}

// structValue is a Connect Struct: one value per schema field (nil is null).
type structValue struct {
	schema *schema
	values []any
}

// Values are nil, string, []byte, bool, int64, float64, *structValue or []any.

var (
	optionalStringSchema = &schema{typ: "string", optional: true}
)

// Converter is the Kafka Connect converter whose bytes the router reproduces.
type Converter string

const (
	// ConverterString is org.apache.kafka.connect.storage.StringConverter: text as
	// its UTF-8 bytes (the default).
	ConverterString Converter = "string"
	// ConverterJSON is org.apache.kafka.connect.json.JsonConverter with
	// schemas.enable=false: the value as JSON (a text column is a JSON string).
	ConverterJSON Converter = "json"
	// ConverterJSONSchemas is JsonConverter with schemas.enable=true (its default):
	// {"schema": ..., "payload": ...}.
	ConverterJSONSchemas Converter = "json-schemas"
)

// convert renders v (with schema s; both nil for a tombstone) as c would. The bool
// is false for a null record value or key.
func (c Converter) convert(s *schema, v any) ([]byte, bool) {
	if s == nil && v == nil {
		return nil, false
	}
	switch c {
	case ConverterJSON:
		return appendJSON(nil, s, v), true
	case ConverterJSONSchemas:
		b := append([]byte(`{"schema":`), appendSchema(nil, s)...)
		b = append(b, `,"payload":`...)
		b = appendJSON(b, s, v)
		return append(b, '}'), true
	}
	switch v := v.(type) {
	case nil:
		return nil, false
	case []byte:
		// StringConverter would print a Java array reference here; the bytes
		// themselves are what ByteArrayConverter users of a bytea payload get.
		return v, true
	}
	return []byte(javaString(v)), true
}

// appendJSON appends v as JsonConverter writes it (Jackson's compact output).
func appendJSON(b []byte, s *schema, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return appendJSONString(b, v)
	case []byte:
		return appendJSONString(b, base64.StdEncoding.EncodeToString(v))
	case bool:
		return strconv.AppendBool(b, v)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case float64:
		return append(b, javaDouble(v)...)
	case *structValue:
		b = append(b, '{')
		for i, f := range v.schema.fields {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, f.name)
			b = append(b, ':')
			b = appendJSON(b, f.schema, v.values[i])
		}
		return append(b, '}')
	case []any:
		var items *schema
		if s != nil {
			items = s.items
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, items, e)
		}
		return append(b, ']')
	}
	panic("debezium: unknown value type")
}

// appendSchema appends s as JsonConverter.asJsonSchema writes it.
func appendSchema(b []byte, s *schema) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	b = append(b, `{"type":`...)
	b = appendJSONString(b, s.typ)
	switch s.typ {
	case "struct":
		b = append(b, `,"fields":[`...)
		for i, f := range s.fields {
			if i > 0 {
				b = append(b, ',')
			}
			fb := appendSchema(nil, f.schema)
			b = append(b, fb[:len(fb)-1]...) // the field's schema, then its name
			b = append(b, `,"field":`...)
			b = appendJSONString(b, f.name)
			b = append(b, '}')
		}
		b = append(b, ']')
	case "array":
		b = append(b, `,"items":`...)
		b = appendSchema(b, s.items)
	}
	b = append(b, `,"optional":`...)
	b = strconv.AppendBool(b, s.optional)
	if s.name != "" {
		b = append(b, `,"name":`...)
		b = appendJSONString(b, s.name)
	}
	if s.version != 0 {
		b = append(b, `,"version":`...)
		b = strconv.AppendInt(b, int64(s.version), 10)
	}
	return append(b, '}')
}

// appendJSONString quotes s as Jackson does: ", \ and control characters escaped,
// everything else (/, non-ASCII, U+2028) as it is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20:
			b = append(b, c)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '\r':
			b = append(b, `\r`...)
		case c == '\t':
			b = append(b, `\t`...)
		case c == '\b':
			b = append(b, `\b`...)
		case c == '\f':
			b = append(b, `\f`...)
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
	}
	return append(b, '"')
}

// javaString is Object.toString of a Connect value: what StringConverter writes.
func javaString(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return v
	case []byte:
		return string(v)
	case bool:
		return strconv.FormatBool(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		return javaDouble(v)
	case *structValue:
		// Struct.toString: the fields that are not null, name=value.
		var b strings.Builder
		b.WriteString("Struct{")
		first := true
		for i, f := range v.schema.fields {
			if v.values[i] == nil {
				continue
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			b.WriteString(f.name + "=" + javaString(v.values[i]))
		}
		b.WriteByte('}')
		return b.String()
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = javaString(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	panic("debezium: unknown value type")
}

// javaDouble is Double.toString: plain decimal with at least one fraction digit for
// 1e-3 <= |d| < 1e7, computerized scientific notation (1.0E7) otherwise.
func javaDouble(d float64) string {
	switch {
	case math.IsNaN(d):
		return "NaN"
	case math.IsInf(d, 1):
		return "Infinity"
	case math.IsInf(d, -1):
		return "-Infinity"
	case d == 0:
		if math.Signbit(d) {
			return "-0.0"
		}
		return "0.0"
	}
	if a := math.Abs(d); a >= 1e-3 && a < 1e7 {
		s := strconv.FormatFloat(d, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	s := strconv.FormatFloat(d, 'e', -1, 64) // 1.2345e+07
	mant, exp, _ := strings.Cut(s, "e")
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	e, _ := strconv.Atoi(exp)
	return mant + "E" + strconv.Itoa(e)
}
