package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outbox/outboxdriver"
)

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usageErr("want a subcommand: outbox dlq list|show|replay|purge [flags] [ID...]")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list", "show", "replay", "purge":
	default:
		return usageErr("unknown subcommand %q (want list, show, replay or purge)", sub)
	}
	fs := newFlags("dlq "+sub, stderr)
	dsn := fs.String("db", "", dbFlagHelp)
	tableName := fs.String("table", outboxdriver.DefaultSchema+"."+outboxdriver.DefaultTable, "outbox table, [schema.]name")
	var f outboxdriver.DeadFilter
	fs.StringVar(&f.AggregateType, "aggregate-type", "", "only dead letters of this aggregate type")
	fs.StringVar(&f.AggregateID, "aggregate-id", "", "only dead letters of this aggregate id")
	fs.StringVar(&f.Type, "type", "", "only dead letters of this event type")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only dead letters dead for at least this long")
	all := fs.Bool("all", false, "replay or purge: every dead letter the filters match, even with no filter")
	asJSON := fs.Bool("json", false, "list: print JSON")
	fs.IntVar(&f.Limit, "limit", 0, "at most this many (list defaults to 100)")
	// IDs may come before or after the flags.
	var ids []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		ids, args = append(ids, args[0]), args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ids = append(ids, fs.Args()...)
	if err := applyEnv(fs); err != nil {
		return err
	}
	f.IDs = ids
	filtered := len(ids) > 0 || f.AggregateType != "" || f.AggregateID != "" || f.Type != "" || f.OlderThan > 0
	switch {
	case sub == "show" && len(ids) != 1:
		return usageErr("show takes exactly one dead letter id")
	case (sub == "replay" || sub == "purge") && !filtered && !*all:
		return usageErr("%s needs ids, a filter (--aggregate-type, --aggregate-id, --type, --older-than) or --all", sub)
	}
	if sub == "list" && f.Limit == 0 {
		f.Limit = 100
	}
	db, _, err := openTable(ctx, *dsn, *tableName)
	if err != nil {
		return err
	}
	defer db.close()

	switch sub {
	case "list":
		dead, err := db.store.ListDead(ctx, &f)
		if err != nil {
			return err
		}
		if *asJSON {
			out := make([]deadJSON, len(dead))
			for i := range dead {
				out[i] = toDeadJSON(&dead[i])
			}
			return printJSON(stdout, out)
		}
		if len(dead) == 0 {
			fmt.Fprintln(stdout, "no dead letters")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tAGGREGATE\tTYPE\tATTEMPTS\tDEAD SINCE\tHOLDS KEY\tERROR")
		for _, d := range dead {
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%s\t%v\t%s\n", termSafe(d.ID), termSafe(d.AggregateType), termSafe(d.AggregateID),
				termSafe(d.Type), d.Attempts, d.DeadAt.UTC().Format(time.RFC3339), d.HoldsKey, termSafe(shorten(d.Error, 80)))
		}
		return tw.Flush()
	case "show":
		dead, err := db.store.ListDead(ctx, &f)
		if err != nil {
			return err
		}
		if len(dead) == 0 {
			return fmt.Errorf("no dead letter with id %s", termSafe(ids[0]))
		}
		return printJSON(stdout, toDeadJSON(&dead[0]))
	case "replay":
		n, err := db.store.ReplayDead(ctx, &f)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "replayed %d dead letter(s): back in the outbox in their original order; their aggregates are released\n", n)
	case "purge":
		n, err := db.store.PurgeDead(ctx, &f)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "purged %d dead letter(s); their aggregates are released\n", n)
	}
	return nil
}

type deadJSON struct {
	ID            string            `json:"id"`
	AggregateType string            `json:"aggregatetype"`
	AggregateID   string            `json:"aggregateid"`
	Type          string            `json:"type"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadText   string            `json:"payload_text,omitempty"`
	PayloadBytes  []byte            `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Attempts      int               `json:"attempts"`
	Error         string            `json:"error"`
	CreatedAt     time.Time         `json:"created_at"`
	DeadAt        time.Time         `json:"dead_at"`
	HoldsKey      bool              `json:"holds_key"`
}

func toDeadJSON(d *outboxdriver.DeadLetter) deadJSON {
	j := deadJSON{ID: d.ID, AggregateType: d.AggregateType, AggregateID: d.AggregateID, Type: d.Type, Headers: d.Headers,
		Attempts: d.Attempts, Error: d.Error, CreatedAt: d.CreatedAt, DeadAt: d.DeadAt, HoldsKey: d.HoldsKey}
	switch {
	case json.Valid(d.Payload):
		j.Payload = d.Payload
	case utf8.Valid(d.Payload):
		j.PayloadText = string(d.Payload)
	default:
		j.PayloadBytes = d.Payload
	}
	return j
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
