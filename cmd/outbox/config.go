package main

import (
	"bufio"
	"flag"
	"os"
	"strings"

	"github.com/outboxd/outbox/debezium"
)

// readConfigFile reads a properties-style file: "key=value" or "key: value" lines,
// '#' and '!' comments. Keys are the command's flag names or, for the relay, the
// options of Debezium's Outbox Event Router (also with a Kafka Connect
// "transforms.NAME." prefix), so a connector's router options can be copied as they are.
func readConfigFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageErr("--config: %v", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		i := strings.IndexAny(line, "=:")
		if i <= 0 {
			return nil, usageErr("--config %s:%d: want key=value, got %q", path, n, line)
		}
		out[strings.TrimSpace(line[:i])] = strings.TrimSpace(line[i+1:])
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
	router := map[string]string{}
	for k, v := range values {
		switch {
		case debezium.IsOption(k):
			router[k] = v
		case fs.Lookup(k) != nil:
			if k == "config" {
				return nil, usageErr("--config %s: a config file cannot name another", path)
			}
			if set[k] {
				continue
			}
			if err := fs.Set(k, v); err != nil {
				return nil, usageErr("--config %s: %s=%q: %v", path, k, v, err)
			}
		default:
			return nil, usageErr("--config %s: unknown key %q (not a flag of this command nor a Debezium router option)", path, k)
		}
	}
	return router, nil
}

func envName(flagName string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
