package pgcdc

import (
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/outboxdriver"
)

// outboxColumns are the outbox table's own columns the decoder does not read into a
// Row field; every other column of the table is a custom one (a Debezium table's)
// and arrives in Row.Columns.
var outboxColumns = map[string]bool{"published_at": true, "attempts": true, "last_error": true, "partition": true}

// typeNames are the types a custom column's value is decoded from, by OID, named as
// pg_typeof names them (so a value reads the same in poll and CDC mode).
var typeNames = map[uint32]string{
	16: "boolean", 17: "bytea", 19: "name", 20: "bigint", 21: "smallint", 23: "integer", 25: "text",
	114: "json", 700: "real", 701: "double precision", 1042: "character", 1043: "character varying",
	1082: "date", 1114: "timestamp without time zone", 1184: "timestamp with time zone", 2950: "uuid", 3802: "jsonb",
}

// customValue decodes a custom column's value (binary, or text for a type sent as
// text). A type outside typeNames keeps its OID in the type name and its text or
// bytes as they came.
func customValue(oid uint32, binaryFmt bool, v []byte, null bool) outboxdriver.Value {
	name, known := typeNames[oid]
	if !known {
		name = "oid " + strconv.FormatUint(uint64(oid), 10)
	}
	if null {
		return outboxdriver.Value{Type: name}
	}
	if !binaryFmt {
		s := string(v)
		return outboxdriver.ParseValue(name, &s)
	}
	val := outboxdriver.Value{Type: name, V: append([]byte(nil), v...)}
	switch {
	case oid == 16 && len(v) == 1:
		val.V = v[0] != 0
	case oid == 21 && len(v) == 2:
		val.V = int64(int16(binary.BigEndian.Uint16(v)))
	case oid == 23 && len(v) == 4:
		val.V = int64(int32(binary.BigEndian.Uint32(v)))
	case oid == 20 && len(v) == 8:
		val.V = int64(binary.BigEndian.Uint64(v))
	case oid == 700 && len(v) == 4:
		val.V = float64(math.Float32frombits(binary.BigEndian.Uint32(v)))
	case oid == 701 && len(v) == 8:
		val.V = math.Float64frombits(binary.BigEndian.Uint64(v))
	case oid == 25 || oid == 19 || oid == 114 || oid == 1042 || oid == 1043:
		val.V = string(v)
	case oid == oidJSONB && len(v) > 0 && v[0] == 1:
		val.V = string(v[1:])
	case oid == oidUUID && len(v) == 16:
		u, _ := uuid.FromBytes(v)
		val.V = u.String()
	case (oid == oidTimestamp || oid == oidTimestamptz) && len(v) == 8:
		val.V = pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(v))) * time.Microsecond)
	case oid == 1082 && len(v) == 4:
		val.V = pgEpoch.AddDate(0, 0, int(int32(binary.BigEndian.Uint32(v))))
	case oid == oidBytea:
	default:
		if known {
			val.V = nil // a known type of an unexpected size: malformed, read as NULL
		}
	}
	return val
}
