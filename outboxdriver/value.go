package outboxdriver

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// ParseValue turns a column's text output (nil: NULL) into its Value; typ is the
// type's name as pg_typeof gives it. Text PostgreSQL prints with DateStyle ISO.
func ParseValue(typ string, text *string) Value {
	v := Value{Type: typ}
	if text == nil {
		return v
	}
	t := *text
	v.V = t
	switch typ {
	case "smallint", "integer", "bigint":
		if n, err := strconv.ParseInt(t, 10, 64); err == nil {
			v.V = n
		}
	case "real", "double precision":
		if f, err := strconv.ParseFloat(t, 64); err == nil {
			v.V = f
		}
	case "boolean":
		v.V = t == "t" || t == "true" // bool::text is true/false, the output function t/f
	case "timestamp without time zone":
		if ts, err := time.Parse("2006-01-02 15:04:05.999999", t); err == nil {
			v.V = ts
		}
	case "timestamp with time zone":
		for _, layout := range []string{"2006-01-02 15:04:05.999999-07", "2006-01-02 15:04:05.999999-07:00", "2006-01-02 15:04:05.999999-07:00:00"} {
			if ts, err := time.Parse(layout, t); err == nil {
				v.V = ts.UTC()
				break
			}
		}
	case "date":
		if ts, err := time.Parse("2006-01-02", t); err == nil {
			v.V = ts
		}
	case "bytea":
		if b, err := hex.DecodeString(strings.TrimPrefix(t, `\x`)); err == nil {
			v.V = b
		}
	}
	return v
}
