package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outbox/debezium"
)

// readConfigFile reads a YAML file (.yaml, .yml) or a properties file ("key=value" or
// "key: value" lines, '#' and '!' comments). Keys are the command's flag names or, for
// the relay, the options of Debezium's Outbox Event Router (also with a Kafka Connect
// "transforms.NAME." prefix), so a connector's router options can be copied as they
// are. In YAML, nested maps join their keys with dots. A .json file is a Kafka Connect
// REST body ({"name": ..., "config": {...}}); a whole connector config (properties,
// YAML, JSON, or Debezium Server's application.properties) is taken as it is: the
// router's options and converters are used, the connector's other keys are reported.
func readConfigFile(path string) (map[string]string, error) {
	if strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml") {
		return readYAML(path)
	}
	if strings.HasSuffix(path, ".json") {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, usageErr("--config: %v", err)
		}
		out, err := debezium.ReadConnectorJSON(b)
		if err != nil {
			return nil, usageErr("--config %s: %v", path, err)
		}
		return out, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, usageErr("--config: %v", err)
	}
	defer func() { _ = f.Close() }()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		// As Java properties: the key ends at the first '=', ':' or white space. The
		// line itself is never echoed: its value may be a secret.
		i := strings.IndexAny(line, "=: \t")
		if i <= 0 {
			return nil, usageErr("--config %s:%d: want key=value", path, n)
		}
		out[line[:i]] = strings.TrimLeft(strings.TrimSpace(line[i:]), "=:")
		out[line[:i]] = strings.TrimSpace(out[line[:i]])
	}
	if err := sc.Err(); err != nil {
		return nil, usageErr("--config %s: %v", path, err)
	}
	return out, nil
}

// applyConfigFile sets, from the file, every flag that neither the command line nor
// the environment set, and returns the Debezium router options it holds.
func applyConfigFile(fs *flag.FlagSet, path string) (map[string]string, error) {
	values, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := os.LookupEnv(envName(f.Name)); ok {
			set[f.Name] = true
		}
	})
	connector := map[string]string{}
	var unknown []string
	for k, v := range values {
		switch {
		case debezium.IsOption(k):
			connector[k] = v
		case fs.Lookup(k) != nil:
			if k == "config" {
				return nil, usageErr("--config %s: a config file cannot name another", path)
			}
			if set[k] {
				continue
			}
			if err := fs.Set(k, v); err != nil {
				return nil, usageErr("--config %s: %s: %v", path, k, err)
			}
		case strings.Contains(k, ".") || k == "name" || k == "transforms" || k == "predicates":
			// A Kafka Connect or Debezium Server config around the router's options.
			connector[k] = v
			unknown = append(unknown, k)
		default:
			return nil, usageErr("--config %s: unknown key %q (not a flag of this command nor a Debezium router option)", path, k)
		}
	}
	if len(unknown) > 0 && !debezium.Enabled(connector) {
		sort.Strings(unknown)
		return nil, usageErr("--config %s: unknown keys %s (not flags of this command; a connector config is taken only with the Outbox Event Router in it)", path, strings.Join(unknown, ", "))
	}
	return connector, nil
}

func envName(flagName string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func readYAML(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErr("--config: %v", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, usageErr("--config %s: %v", path, err)
	}
	out := map[string]string{}
	var walk func(prefix string, m map[string]any) error
	walk = func(prefix string, m map[string]any) error {
		for k, v := range m {
			key := prefix + k
			switch v := v.(type) {
			case map[string]any:
				if err := walk(key+".", v); err != nil {
					return err
				}
			case []any, nil:
				return usageErr("--config %s: %s: want a single value", path, key)
			default:
				out[key] = fmt.Sprint(v)
			}
		}
		return nil
	}
	if err := walk("", doc); err != nil {
		return nil, err
	}
	return out, nil
}
