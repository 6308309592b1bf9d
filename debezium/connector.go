package debezium

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Class names a pasted connector config may use.
const (
	routerClass         = "io.debezium.transforms.outbox.EventRouter"
	stringConverter     = "org.apache.kafka.connect.storage.StringConverter"
	jsonConverter       = "org.apache.kafka.connect.json.JsonConverter"
	simpleHeaderConvert = "org.apache.kafka.connect.storage.SimpleHeaderConverter"
)

// connector is what a pasted Kafka Connect or Debezium Server config says.
type connector struct {
	router     map[string]string // router options, prefix removed
	key, value Converter
	prefix     string   // topic.prefix (database.server.name before Debezium 2)
	ignored    []string // keys that change nothing here
	present    bool     // the config names the router (an option or its transform)
}

// readConnector sorts the keys of a config: the router's options (bare, or under
// the transform that names the router), the converters, the topic prefix, and the
// connector's other keys, which are reported as ignored. A transform other than
// the router, or a converter whose bytes cannot be reproduced, is an error.
func readConnector(cfg map[string]string) (*connector, error) {
	c := &connector{router: map[string]string{}, key: ConverterString, value: ConverterString}
	server := false
	norm := make(map[string]string, len(cfg))
	for k, v := range cfg {
		v = strings.TrimSpace(v)
		// Debezium Server: debezium.source.* is the connector, debezium.transforms.*
		// and debezium.format.* are as in Kafka Connect, the rest is the server's.
		if rest, ok := strings.CutPrefix(k, "debezium."); ok {
			server = true
			switch {
			case strings.HasPrefix(rest, "source."):
				norm[strings.TrimPrefix(rest, "source.")] = v
			case strings.HasPrefix(rest, "transforms"), strings.HasPrefix(rest, "format."), strings.HasPrefix(rest, "predicates"):
				norm[rest] = v
			default:
				c.ignored = append(c.ignored, k)
			}
			continue
		}
		if strings.HasPrefix(k, "quarkus.") {
			c.ignored = append(c.ignored, k)
			continue
		}
		norm[k] = v
	}
	// The converters: Kafka Connect's key.converter and value.converter (this
	// router's default is StringConverter), or Debezium Server's format.key and
	// format.value (JSON by default there, with JsonConverter's default: schemas on).
	for _, side := range []struct {
		conv          *Converter
		connect, srvr string
	}{{&c.key, "key.converter", "format.key"}, {&c.value, "value.converter", "format.value"}} {
		k, class := side.connect, stringConverter
		if server {
			k, class = side.srvr, "json"
		}
		if v, ok := norm[k]; ok {
			class = v
		}
		conv, err := converterOf(class, norm[k+".schemas.enable"])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		*side.conv = conv
	}
	routerName := ""
	if t, ok := norm["transforms"]; ok {
		for _, name := range strings.Split(t, ",") {
			name = strings.TrimSpace(name)
			typ := norm["transforms."+name+".type"]
			switch {
			case typ == routerClass:
				routerName = name
			case typ == "":
				return nil, fmt.Errorf("transform %q has no transforms.%s.type", name, name)
			default:
				return nil, fmt.Errorf("transform %q (%s) cannot run here: only the Outbox Event Router (%s) is reproduced", name, typ, routerClass)
			}
		}
		c.present = routerName != ""
	}
	var bad []string
	for k, v := range norm {
		switch {
		case k == "transforms":
		case k == "topic.prefix":
			c.prefix = v
		case k == "database.server.name": // the prefix before Debezium 2
			if _, ok := norm["topic.prefix"]; !ok {
				c.prefix = v
			}
		case strings.HasPrefix(k, "transforms."):
			name, opt, _ := strings.Cut(strings.TrimPrefix(k, "transforms."), ".")
			switch {
			case routerName != "" && name != routerName:
			case opt == "type":
			case opt == "predicate" || opt == "negate":
				c.ignored = append(c.ignored, k) // predicates skip heartbeats, which the relay has none of
			case IsOption(opt):
				c.router[opt] = v
				c.present = true
			default:
				bad = append(bad, k)
			}
		case IsOption(k):
			c.router[k] = v
			c.present = true
		case k == "key.converter", k == "value.converter", k == "format.key", k == "format.value":
		case strings.HasSuffix(k, ".schemas.enable"):
			if err := boolean(v); err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
		case k == "header.converter":
			if v != simpleHeaderConvert {
				return nil, fmt.Errorf("header.converter %s: only %s (the default) is reproduced", v, simpleHeaderConvert)
			}
		case routerLike(k):
			bad = append(bad, k) // a misspelt router option is never taken for a connector key
		default:
			c.ignored = append(c.ignored, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return nil, fmt.Errorf("unknown router option(s): %s", strings.Join(bad, ", "))
	}
	sort.Strings(c.ignored)
	return c, nil
}

// routerLike reports whether key is in the router's option namespaces (and so is a
// misspelt option when it is not one).
func routerLike(key string) bool {
	for _, p := range []string{"route.", "table.field.", "table.fields.", "table.expand.", "table.json.", "table.op.", "tracing."} {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// converterOf maps a converter class (or a Debezium Server format) to the bytes it
// writes.
func converterOf(class, schemas string) (Converter, error) {
	switch class {
	case stringConverter, "simplestring":
		return ConverterString, nil
	case jsonConverter, "json":
		if strings.EqualFold(schemas, "false") {
			return ConverterJSON, nil
		}
		return ConverterJSONSchemas, nil // JsonConverter's default
	}
	return "", fmt.Errorf("converter %s is not reproduced (%s or %s)", class, stringConverter, jsonConverter)
}

// ReadConnectorJSON reads a Kafka Connect REST body, {"name": ..., "config": {...}}
// or the config object alone, into the flat keys New takes.
func ReadConnectorJSON(b []byte) (map[string]string, error) {
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("connector JSON: %w", err)
	}
	if inner, ok := doc["config"].(map[string]any); ok {
		doc = inner
	}
	out := make(map[string]string, len(doc))
	for k, v := range doc {
		switch v := v.(type) {
		case string:
			out[k] = v
		case bool, float64:
			out[k] = fmt.Sprint(v)
		default:
			return nil, fmt.Errorf("connector JSON: %s: want a string, number or boolean", k)
		}
	}
	return out, nil
}
