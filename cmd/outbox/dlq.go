package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outbox/internal/safetext"
	"github.com/outboxd/outbox/outboxdriver"
)

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stderr, `Usage: outbox dlq SUBCOMMAND [flags] [ID...]

  list     dead letters, oldest first (filters: --aggregate-type, --aggregate-id, --type, --older-than)
  show     one dead letter: its event, headers, payload and why it died
  edit     change a dead letter's payload or headers before replaying it
  replay   put dead letters back in the outbox, in their original order
  purge    delete dead letters for good

`+"`outbox help dlq SUBCOMMAND`"+` lists a subcommand's flags.
`)
		return flag.ErrHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usageErr("want a subcommand: outbox dlq list|show|edit|replay|purge [flags] [ID...]")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list", "show", "edit", "replay", "purge":
	default:
		return usageErr("unknown subcommand %q (want list, show, edit, replay or purge)", sub)
	}
	fs := newFlags("dlq "+sub, stderr)
	dsn, tableName := dbTableFlags(fs, dbFlagHelp)
	// Each subcommand lists only its own flags (`outbox dlq edit --help`).
	var f outboxdriver.DeadFilter
	var all, asJSON, fullPayload bool
	var payload, payloadFile string
	var setHeaders, dropHeaders listFlag
	var tablesList string
	switch sub {
	case "list", "replay", "purge":
		fs.StringVar(&f.AggregateType, "aggregate-type", "", "only dead letters of this aggregate type")
		fs.StringVar(&f.AggregateID, "aggregate-id", "", "only dead letters of this aggregate id")
		fs.StringVar(&f.Type, "type", "", "only dead letters of this event type")
		fs.DurationVar(&f.OlderThan, "older-than", 0, "only dead letters dead for at least this long")
	}
	switch sub {
	case "list":
		fs.BoolVar(&asJSON, "json", false, "print JSON (each payload's first 4 KiB)")
		fs.IntVar(&f.Limit, "limit", 100, "at most this many (per table with --tables)")
		fs.StringVar(&tablesList, "tables", "", tablesFlagHelp+"; lists every table's dead letters, with a TABLE column")
		fs.String("trust-owner", "", trustOwnerHelp)
	case "replay", "purge":
		fs.BoolVar(&all, "all", false, "every dead letter the filters match, even with no filter")
	case "show":
		fs.BoolVar(&fullPayload, "full-payload", false, "the whole payload (default: its first 64 KiB, and its size)")
	case "edit":
		fs.StringVar(&payload, "payload", "", "the new payload")
		fs.StringVar(&payloadFile, "payload-file", "", "a file holding the new payload")
		fs.Var(&setHeaders, "header", "set a header, name=value (repeatable)")
		fs.Var(&dropHeaders, "drop-header", "remove a header (repeatable)")
	}
	ids, err := parseWithIDs(fs, args)
	if err != nil {
		return err
	}
	f.IDs = ids
	filtered := len(ids) > 0 || f.AggregateType != "" || f.AggregateID != "" || f.Type != "" || f.OlderThan > 0
	switch {
	case (sub == "show" || sub == "edit") && len(ids) != 1:
		return usageErr("%s takes exactly one dead letter id", sub)
	case sub == "edit" && payload == "" && payloadFile == "" && len(setHeaders)+len(dropHeaders) == 0:
		return usageErr("edit needs --payload, --payload-file, --header or --drop-header")
	case payload != "" && payloadFile != "":
		return usageErr("give --payload or --payload-file, not both")
	case (sub == "replay" || sub == "purge") && !filtered && !all:
		return usageErr("%s needs ids, a filter (--aggregate-type, --aggregate-id, --type, --older-than) or --all", sub)
	case sub == "list" && f.Limit <= 0:
		return usageErr("--limit must be positive")
	}
	// Payloads as previews: one huge payload must not be read whole a hundred times.
	switch {
	case sub == "list" && asJSON:
		f.PayloadMax = listPayloadPreview
	case sub == "list":
		f.PayloadMax = 1 // the table shows no payload
	case sub == "show" && !fullPayload:
		f.PayloadMax = showPayloadPreview
	}
	if flagSet(fs, "tables") {
		many, err := openTables(ctx, fs, *dsn, tablesList)
		if err != nil {
			return err
		}
		defer many.close()
		return listDeadTables(ctx, many, &f, asJSON, stdout)
	}
	db, table, err := openTable(ctx, *dsn, *tableName)
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
		return printDead([]tableDead{{table, dead}}, false, asJSON, stdout)
	case "show":
		dead, err := db.store.ListDead(ctx, &f)
		if err != nil {
			return err
		}
		if len(dead) == 0 {
			return fmt.Errorf("no dead letter with id %s", termSafe(ids[0]))
		}
		return printJSON(stdout, toDeadJSON(&dead[0]))
	case "edit":
		return editDead(ctx, db.store, ids[0], payload, payloadFile, setHeaders, dropHeaders, stdout)
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

// tableDead is one table's dead letters.
type tableDead struct {
	table outboxdriver.Table
	dead  []outboxdriver.DeadLetter
}

// listDeadTables is `dlq list --tables`: every matching table's dead letters.
func listDeadTables(ctx context.Context, many *manyTables, f *outboxdriver.DeadFilter, asJSON bool, stdout io.Writer) error {
	tables, err := many.find(ctx, false)
	if err != nil {
		return err
	}
	var all []tableDead
	for _, t := range tables {
		store, _, err := many.driver(t)
		if err != nil {
			return err
		}
		dead, err := store.ListDead(ctx, f)
		if err != nil {
			return fmt.Errorf("dead letters of %s: %w", t, err)
		}
		all = append(all, tableDead{t, dead})
	}
	return printDead(all, true, asJSON, stdout)
}

// printDead prints dead letters as a table or JSON; withTable names each one's table.
func printDead(all []tableDead, withTable, asJSON bool, stdout io.Writer) error {
	if asJSON {
		out := []deadJSON{}
		for _, td := range all {
			for i := range td.dead {
				j := toDeadJSON(&td.dead[i])
				if withTable {
					j.Table = td.table.String()
				}
				out = append(out, j)
			}
		}
		return printJSON(stdout, out)
	}
	n := 0
	for _, td := range all {
		n += len(td.dead)
	}
	if n == 0 {
		fmt.Fprintln(stdout, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	head := "ID\tAGGREGATE\tTYPE\tATTEMPTS\tDEAD SINCE\tHOLDS KEY\tERROR"
	if withTable {
		head = "TABLE\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, td := range all {
		for _, d := range td.dead {
			if withTable {
				fmt.Fprintf(tw, "%s\t", td.table)
			}
			// Each cell bounded: one long aggregate id must not pad every row.
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%s\t%v\t%s\n", safetext.Cell(d.ID, 40), safetext.Cell(d.AggregateType, 40), safetext.Cell(d.AggregateID, 40),
				safetext.Cell(d.Type, 40), d.Attempts, d.DeadAt.UTC().Format(time.RFC3339), d.HoldsKey, termSafe(shorten(d.Error, 80)))
		}
	}
	return tw.Flush()
}

type deadJSON struct {
	// Table is the dead letter's outbox table (dlq list --tables only).
	Table         string          `json:"table,omitempty"`
	ID            string          `json:"id"`
	AggregateType string          `json:"aggregatetype"`
	AggregateID   string          `json:"aggregateid"`
	Type          string          `json:"type"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	// PayloadSize is the whole payload's size when the output holds a preview of it.
	PayloadSize  int               `json:"payload_size,omitempty"`
	PayloadText  string            `json:"payload_text,omitempty"`
	PayloadBytes []byte            `json:"payload_base64,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	Attempts     int               `json:"attempts"`
	Error        string            `json:"error"`
	CreatedAt    time.Time         `json:"created_at"`
	DeadAt       time.Time         `json:"dead_at"`
	HoldsKey     bool              `json:"holds_key"`
}

func toDeadJSON(d *outboxdriver.DeadLetter) deadJSON {
	j := deadJSON{ID: d.ID, AggregateType: d.AggregateType, AggregateID: d.AggregateID, Type: d.Type, Headers: d.Headers,
		Attempts: d.Attempts, Error: d.Error, CreatedAt: d.CreatedAt, DeadAt: d.DeadAt, HoldsKey: d.HoldsKey, PayloadSize: d.PayloadSize}
	switch {
	case d.PayloadSize == 0 && json.Valid(d.Payload):
		j.Payload = d.Payload
	case utf8.Valid(d.Payload):
		j.PayloadText = string(d.Payload)
	default:
		j.PayloadBytes = d.Payload
	}
	return j
}

// Payload previews: what dlq list --json and dlq show print of each payload.
const (
	listPayloadPreview = 4 << 10
	showPayloadPreview = 64 << 10
)

// printJSON prints v as indented JSON, with the runes a terminal would act on
// escaped (safetext.JSON): the same values, read safely.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(safetext.JSON(b), '\n'))
	return err
}

func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// editDead fixes a dead letter's payload or headers before its replay: headers are
// changed one by one (--header sets, --drop-header removes), the others kept.
func editDead(ctx context.Context, admin outboxdriver.Admin, id, payload, payloadFile string, set, drop []string, stdout io.Writer) error {
	var e outboxdriver.DeadEdit
	switch {
	case payloadFile != "":
		b, err := os.ReadFile(payloadFile)
		if err != nil {
			return usageErr("--payload-file: %v", err)
		}
		e.Payload = b
	case payload != "":
		e.Payload = []byte(payload)
	}
	if len(set)+len(drop) > 0 {
		dead, err := admin.ListDead(ctx, &outboxdriver.DeadFilter{IDs: []string{id}})
		if err != nil {
			return err
		}
		if len(dead) == 0 {
			return fmt.Errorf("no dead letter with id %s", termSafe(id))
		}
		e.Headers = map[string]string{}
		for k, v := range dead[0].Headers {
			e.Headers[k] = v
		}
		for _, kv := range set {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageErr("--header %q: want name=value", kv)
			}
			e.Headers[k] = v
		}
		for _, k := range drop {
			delete(e.Headers, k)
		}
	}
	if err := admin.EditDead(ctx, id, &e); err != nil {
		if errors.Is(err, outboxdriver.ErrEventNotFound) {
			return fmt.Errorf("no dead letter with id %s", termSafe(id))
		}
		return err
	}
	fmt.Fprintf(stdout, "edited dead letter %s; `outbox dlq replay %s` sends it again\n", termSafe(id), termSafe(id))
	return nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// parseWithIDs parses a command's flags and OUTBOX_* variables, with event ids
// before or after the flags, and returns the ids.
func parseWithIDs(fs *flag.FlagSet, args []string) ([]string, error) {
	var ids []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		ids, args = append(ids, args[0]), args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	ids = append(ids, fs.Args()...)
	return ids, applyEnv(fs)
}
