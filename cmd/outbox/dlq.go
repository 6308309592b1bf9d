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
	sub, args, err := dlqSubcommand(args, stderr)
	if err != nil {
		return err
	}
	o := &dlqOptions{sub: sub}
	fs := newFlags("dlq "+sub, stderr)
	o.register(fs)
	ids, err := parseWithIDs(fs, args)
	if err != nil {
		return err
	}
	if err := o.validate(ids); err != nil {
		return err
	}
	if flagSet(fs, "tables") {
		many, err := openTables(ctx, fs, *o.dsn, o.tables)
		if err != nil {
			return err
		}
		defer many.close()
		return listDeadTables(ctx, many, &o.filter, o.asJSON, stdout)
	}
	db, table, err := openTable(ctx, *o.dsn, *o.table)
	if err != nil {
		return err
	}
	defer db.close()
	return o.run(ctx, db.store, table, stdout)
}

// dlqSubcommand splits off the subcommand, or answers --help with the list of them.
func dlqSubcommand(args []string, stderr io.Writer) (sub string, rest []string, err error) {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stderr, `Usage: outbox dlq SUBCOMMAND [flags] [ID...]

  list     dead letters, oldest first (filters: --aggregate-type, --aggregate-id, --type, --older-than)
  show     one dead letter: its event, headers, payload and why it died
  edit     change a dead letter's payload or headers before replaying it
  replay   put dead letters back in the outbox, in their original order
  purge    delete dead letters for good

`+"`outbox help dlq SUBCOMMAND`"+` lists a subcommand's flags.
`)
		return "", nil, flag.ErrHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", nil, usageErr("want a subcommand: outbox dlq list|show|edit|replay|purge [flags] [ID...]")
	}
	switch args[0] {
	case "list", "show", "edit", "replay", "purge":
		return args[0], args[1:], nil
	}
	return "", nil, usageErr("unknown subcommand %q (want list, show, edit, replay or purge)", args[0])
}

// dlqOptions are a dlq subcommand's flags.
type dlqOptions struct {
	sub                      string
	dsn, table               *string
	filter                   outboxdriver.DeadFilter
	all, asJSON, fullPayload bool
	payload, payloadFile     string
	setHeaders, dropHeaders  listFlag
	tables                   string
}

// register declares the subcommand's flags: each lists only its own
// (`outbox dlq edit --help`).
func (o *dlqOptions) register(fs *flag.FlagSet) {
	o.dsn, o.table = dbTableFlags(fs, dbFlagHelp)
	f := &o.filter
	switch o.sub {
	case "list", "replay", "purge":
		fs.StringVar(&f.AggregateType, "aggregate-type", "", "only dead letters of this aggregate type")
		fs.StringVar(&f.AggregateID, "aggregate-id", "", "only dead letters of this aggregate id")
		fs.StringVar(&f.Type, "type", "", "only dead letters of this event type")
		fs.DurationVar(&f.OlderThan, "older-than", 0, "only dead letters dead for at least this long")
	}
	switch o.sub {
	case "list":
		fs.BoolVar(&o.asJSON, "json", false, "print JSON (each payload's first 4 KiB)")
		fs.IntVar(&f.Limit, "limit", 100, "at most this many (per table with --tables)")
		fs.StringVar(&o.tables, "tables", "", tablesFlagHelp+"; lists every table's dead letters, with a TABLE column")
		fs.String("trust-owner", "", trustOwnerHelp)
	case "replay", "purge":
		fs.BoolVar(&o.all, "all", false, "every dead letter the filters match, even with no filter")
	case "show":
		fs.BoolVar(&o.fullPayload, "full-payload", false, "the whole payload (default: its first 64 KiB, and its size)")
	case "edit":
		fs.StringVar(&o.payload, "payload", "", "the new payload")
		fs.StringVar(&o.payloadFile, "payload-file", "", "a file holding the new payload")
		fs.Var(&o.setHeaders, "header", "set a header, name=value (repeatable)")
		fs.Var(&o.dropHeaders, "drop-header", "remove a header (repeatable)")
	}
}

// validate checks the flags and ids together, and sets how much of each payload to read.
func (o *dlqOptions) validate(ids []string) error {
	f := &o.filter
	f.IDs = ids
	filtered := len(ids) > 0 || f.AggregateType != "" || f.AggregateID != "" || f.Type != "" || f.OlderThan > 0
	switch {
	case (o.sub == "show" || o.sub == "edit") && len(ids) != 1:
		return usageErr("%s takes exactly one dead letter id", o.sub)
	case o.sub == "edit" && o.payload == "" && o.payloadFile == "" && len(o.setHeaders)+len(o.dropHeaders) == 0:
		return usageErr("edit needs --payload, --payload-file, --header or --drop-header")
	case o.payload != "" && o.payloadFile != "":
		return usageErr("give --payload or --payload-file, not both")
	case (o.sub == "replay" || o.sub == "purge") && !filtered && !o.all:
		return usageErr("%s needs ids, a filter (--aggregate-type, --aggregate-id, --type, --older-than) or --all", o.sub)
	case o.sub == "list" && f.Limit <= 0:
		return usageErr("--limit must be positive")
	}
	// Payloads as previews: one huge payload must not be read whole a hundred times.
	switch {
	case o.sub == "list" && o.asJSON:
		f.PayloadMax = listPayloadPreview
	case o.sub == "list":
		f.PayloadMax = 1 // the table shows no payload
	case o.sub == "show" && !o.fullPayload:
		f.PayloadMax = showPayloadPreview
	}
	return nil
}

// run runs the subcommand on one table's store.
func (o *dlqOptions) run(ctx context.Context, store outboxdriver.Store, table outboxdriver.Table, stdout io.Writer) error {
	switch o.sub {
	case "list":
		dead, err := store.ListDead(ctx, &o.filter)
		if err != nil {
			return err
		}
		return printDead([]tableDead{{table, dead}}, false, o.asJSON, stdout)
	case "show":
		dead, err := store.ListDead(ctx, &o.filter)
		if err != nil {
			return err
		}
		if len(dead) == 0 {
			return fmt.Errorf("no dead letter with id %s", termSafe(o.filter.IDs[0]))
		}
		return printJSON(stdout, toDeadJSON(&dead[0]))
	case "edit":
		return editDead(ctx, store, o.filter.IDs[0], o.payload, o.payloadFile, o.setHeaders, o.dropHeaders, stdout)
	case "replay":
		n, err := store.ReplayDead(ctx, &o.filter)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "replayed %d dead letter(s): back in the outbox in their original order; their aggregates are released\n", n)
	case "purge":
		n, err := store.PurgeDead(ctx, &o.filter)
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
