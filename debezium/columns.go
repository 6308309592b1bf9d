package debezium

import (
	"fmt"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// schemaFor is the Connect schema Debezium's PostgreSQL connector gives a column of
// type typ (as pg_typeof or format_type without a modifier names it), with its
// default settings (time.precision.mode=adaptive).
func schemaFor(typ string, optional bool) (*schema, error) {
	s := &schema{optional: optional}
	switch typ {
	case "smallint":
		s.typ = "int16"
	case "integer":
		s.typ = "int32"
	case "bigint":
		s.typ = "int64"
	case "boolean":
		s.typ = "boolean"
	case "real":
		s.typ = "float32"
	case "double precision":
		s.typ = "float64"
	case "text", "character varying", "character", "name":
		s.typ = "string"
	case "uuid":
		s.typ, s.name, s.version = "string", "io.debezium.data.Uuid", 1
	case "json", "jsonb":
		s.typ, s.name, s.version = "string", "io.debezium.data.Json", 1
	case "bytea":
		s.typ = "bytes"
	case "timestamp without time zone":
		// adaptive: a timestamp(6) column is MicroTimestamp, microseconds since the epoch.
		s.typ, s.name, s.version = "int64", "io.debezium.time.MicroTimestamp", 1
	case "timestamp with time zone":
		s.typ, s.name, s.version = "string", "io.debezium.time.ZonedTimestamp", 1
	case "date":
		s.typ, s.name, s.version = "int32", "io.debezium.time.Date", 1
	default:
		return nil, fmt.Errorf("type %s is not reproduced (integers, booleans, floating point, text, uuid, json, bytea, timestamps and dates are)", typ)
	}
	return s, nil
}

// connectValue maps a custom column's value to its Connect schema and value.
func connectValue(v outboxdriver.Value, optional bool) (*schema, any, error) {
	s, err := schemaFor(v.Type, optional)
	if err != nil {
		return nil, nil, err
	}
	out := v.V
	if t, ok := v.V.(time.Time); ok {
		switch s.name {
		case "io.debezium.time.MicroTimestamp":
			out = t.UnixMicro()
		case "io.debezium.time.ZonedTimestamp":
			out = zonedTimestamp(t)
		case "io.debezium.time.Date":
			out = int64(t.Unix() / 86400)
		}
	}
	if out != nil && !fits(s.typ, out) {
		return nil, nil, fmt.Errorf("type %s: a value outside its range (%v)", v.Type, v.V)
	}
	return s, out, nil
}

// fits reports whether a decoded value has the Go type the schema calls for.
func fits(typ string, v any) bool {
	switch v.(type) {
	case int64:
		return typ == "int16" || typ == "int32" || typ == "int64"
	case float64:
		return typ == "float32" || typ == "float64"
	case bool:
		return typ == "boolean"
	case string:
		return typ == "string"
	case []byte:
		return typ == "bytes"
	}
	return false
}

// zonedTimestamp is Debezium's ZonedTimestamp text: ISO-8601 in UTC with a Z
// (DateTimeFormatter.ISO_OFFSET_DATE_TIME: the fraction without trailing zeros).
func zonedTimestamp(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.999999999") + "Z"
}
