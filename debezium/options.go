package debezium

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// option is one of the router's options, with Debezium's default and the values
// Debezium's configuration definition allows.
type option struct {
	def   string
	check func(v string) error
}

var options = map[string]option{
	"route.by.field":                    {"aggregatetype", column},
	"route.topic.regex":                 {"(?<routedByValue>.*)", anything}, // checked with the replacement
	"route.topic.replacement":           {"outbox.event.${routedByValue}", anything},
	"route.tombstone.on.empty.payload":  {"false", boolean},
	"table.field.event.id":              {"id", column},
	"table.field.event.key":             {"aggregateid", anything}, // empty: no key
	"table.field.event.payload":         {"payload", column},
	"table.field.event.type":            {"type", anything}, // accepted, unused (DBZ-2014)
	"table.field.event.timestamp":       {"", anything},
	"table.field.event.schema.version":  {"", anything},
	"table.fields.additional.placement": {"", placementList},
	"table.field.additional.missing":    {"error", oneOf("error", "ignore")},
	// Debezium's own name for it (a boolean: false is ignore).
	"table.fields.additional.error.on.missing": {"true", oneOf("true", "false")},
	"table.expand.json.payload":                {"false", boolean},
	"table.json.payload.null.behavior":         {"ignore", oneOf("ignore", "optional_bytes")},
	"table.json.payload.empty.array.behavior":  {"ignore", oneOf("ignore", "optional_string")},
	"table.op.invalid.behavior":                {"warn", oneOf("warn", "error", "fatal")},
	"tracing.span.context.field":               {"tracingspancontext", column},
	"tracing.operation.name":                   {"debezium-read", anything},
	"tracing.with.context.field.only":          {"false", boolean},
}

// IsOption reports whether key is a router option (also with a Kafka Connect
// "transforms.NAME." or a Debezium Server "debezium.transforms.NAME." prefix).
func IsOption(key string) bool {
	_, ok := options[optionName(key)]
	return ok
}

// optionName removes a "[debezium.]transforms.NAME." prefix.
func optionName(key string) string {
	key = strings.TrimPrefix(key, "debezium.")
	if rest, ok := strings.CutPrefix(key, "transforms."); ok {
		if _, opt, ok := strings.Cut(rest, "."); ok {
			return opt
		}
	}
	return key
}

func anything(string) error { return nil }

func column(v string) error {
	if v == "" {
		return fmt.Errorf("a column name is required")
	}
	return nil
}

// boolean is Kafka's ConfigDef boolean: true or false, any case.
func boolean(v string) error {
	if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
		return fmt.Errorf("want true or false, got %q", v)
	}
	return nil
}

func oneOf(values ...string) func(string) error {
	return func(v string) error {
		for _, ok := range values {
			if strings.EqualFold(v, ok) {
				return nil
			}
		}
		return fmt.Errorf("want one of %s, got %q", strings.Join(values, ", "), v)
	}
}

// placement is one table.fields.additional.placement entry.
type placement struct{ column, where, alias string }

var placementRE = regexp.MustCompile(`^\s*([^\s:,]+)\s*:\s*(header|envelope|partition)\s*(?::\s*([^\s:,]+)\s*)?$`)

// placementList is Debezium's check: a comma list of column:placement[:alias], none
// empty (an empty option value is refused too).
func placementList(v string) error {
	_, err := parsePlacements(v)
	return err
}

func parsePlacements(v string) ([]placement, error) {
	if strings.TrimSpace(v) == "" {
		return nil, fmt.Errorf("want column:header|envelope|partition[:alias], ... (an empty value is refused, as in Debezium)")
	}
	var out []placement
	for _, item := range strings.Split(v, ",") {
		m := placementRE.FindStringSubmatch(lowerPlacement(item))
		if m == nil {
			return nil, fmt.Errorf("entry %q: want column:header|envelope|partition[:alias]", strings.TrimSpace(item))
		}
		p := placement{column: m[1], where: strings.ToLower(m[2]), alias: m[3]}
		if p.alias == "" {
			p.alias = p.column
		}
		out = append(out, p)
	}
	return out, nil
}

// lowerPlacement lowers the placement word of an entry (Debezium parses it in any case).
func lowerPlacement(item string) string {
	parts := strings.Split(item, ":")
	if len(parts) >= 2 {
		parts[1] = strings.ToLower(parts[1])
	}
	return strings.Join(parts, ":")
}

// resolve merges opts over the defaults and checks every value.
func resolve(opts map[string]string) (map[string]string, error) {
	o := make(map[string]string, len(options))
	for k, opt := range options {
		o[k] = opt.def
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := optionName(k)
		opt, ok := options[name]
		if !ok {
			return nil, fmt.Errorf("unknown router option %s", k)
		}
		v := strings.TrimSpace(opts[k])
		if err := opt.check(v); err != nil {
			return nil, fmt.Errorf("router option %s: %w", name, err)
		}
		o[name] = v
	}
	return o, nil
}
