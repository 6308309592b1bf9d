package dashboard

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outbox/internal/human"
	"github.com/outboxd/outbox/internal/safetext"
	"github.com/outboxd/outbox/outboxdriver"
)

// page is what the layout renders around a page's content.
type page struct {
	Title, Nav, Prefix  string
	Home                string // the overview of every table, when there are many
	Table, Mode, Broker string
	Admin, CanSignIn    bool
	CSRF                string
	Flash, Error        string
	Data                any
	Refresh             int // seconds: the page reloads itself (a replay running)
}

var funcs = template.FuncMap{
	"pathEscape": url.PathEscape,
	"stamp":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 UTC") },
	"since":      func(t time.Time) string { return human.Age(time.Since(t)) },
	// shown renders an event's field for people (safetext: no bidirectional
	// override or control character acts on the page); short also cuts it.
	"shown": safetext.Display,
	"short": func(s string, n int) string {
		return safetext.Cell(strings.Join(strings.Fields(s), " "), n)
	},
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "relays", "dead", "event", "login", "message", "replay", "tables"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// base fills the layout's fields for r.
func (d *Dashboard) base(r *http.Request, title, nav string) *page {
	p := &page{Title: title, Nav: nav, Prefix: d.cfg.Prefix, Table: d.cfg.Table, Mode: d.cfg.Mode, Broker: d.cfg.Broker,
		CanSignIn: d.auth.enabled()}
	if d.shared.home {
		p.Home = d.shared.root
	}
	if sess, err := d.auth.session(r, d.now()); err == nil {
		p.Admin, p.CSRF = true, d.auth.csrf(sess)
	}
	return p
}

// render writes a page, or only its live part when the script asks (?partial=1).
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	tmpl := "layout"
	if r.URL.Query().Get("partial") == "1" && (name == "overview" || name == "relays" || name == "tables") {
		tmpl = "live"
	}
	var buf bytes.Buffer
	if err := d.pages[name].ExecuteTemplate(&buf, tmpl, p); err != nil {
		d.log.Error("dashboard: render", "page", name, "err", err)
		http.Error(w, "render error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (d *Dashboard) message(w http.ResponseWriter, r *http.Request, status int, title, text string) {
	p := d.base(r, title, "")
	p.Data = text
	d.render(w, r, status, "message", p)
}

func (d *Dashboard) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 10*time.Second)
}

// ---- overview ----

type chart struct {
	Title  string
	SVG    template.HTML
	Legend []series // named when a chart has more than one line
}

type overviewData struct {
	StatusErr                            string
	Backlog, BacklogNote, Oldest         string
	Failing, Dead, Held                  int64
	Rate, Published, PublishedBy         string
	P50, P99                             string
	Role, ActiveRelay                    string
	BrokerState, BrokerClass, BrokerNote string
	Charts                               []chart
	FlowNote                             string
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := d.ctx(r)
	defer cancel()
	st, err := d.status.Status(ctx)
	v := overviewData{Backlog: "?", Oldest: "?", Rate: "–", Published: "–", P50: "–", P99: "–"}
	if err != nil {
		v.StatusErr = err.Error()
	} else {
		v.Backlog, v.Oldest = formatCount(float64(st.Unpublished)), human.Age(st.OldestAge)
		v.BacklogNote = "events waiting"
		v.Failing, v.Dead, v.Held = st.Failing, st.Dead, st.HeldKeys
		if len(st.Slots) > 0 {
			var lag int64
			for _, s := range st.Slots {
				lag += s.LagBytes
			}
			v.BacklogNote = "rows before the slot; slot lag " + human.Bytes(lag)
		}
		v.ActiveRelay = "no relay holds the table"
		switch {
		case st.ActiveRelay != "" && !st.ActiveSince.IsZero():
			v.ActiveRelay = "active: " + st.ActiveRelay + ", for " + human.Age(time.Since(st.ActiveSince))
		case st.ActiveRelay != "":
			v.ActiveRelay = "active: " + st.ActiveRelay
		case len(st.Relays) > 0:
			v.ActiveRelay = fmt.Sprintf("%d relays in the group", len(st.Relays))
		}
	}
	v.Role, v.BrokerState, v.BrokerClass = "–", "unknown", "unknown"
	v.BrokerNote = "no relay in this process"
	if d.cfg.Relay != nil {
		rs := d.cfg.Relay.Stats()
		v.Role = "standby"
		if rs.Leader {
			v.Role = "active"
		}
		v.Published, v.PublishedBy = formatCount(float64(rs.Published)), "by this relay since it started"
		if rs.BrokerDownSince.IsZero() {
			v.BrokerState, v.BrokerClass, v.BrokerNote = "ok", "ok", "publishing"
		} else {
			v.BrokerState, v.BrokerClass = "down", "bad"
			v.BrokerNote = "unavailable for " + human.Age(time.Since(rs.BrokerDownSince))
		}
	}
	ss := d.hist.snapshot()
	now := d.now()
	rate, p50, p99 := flowSeries(ss)
	if n := len(rate); n > 0 {
		v.Rate = formatCount(rate[n-1].v)
		if d.cfg.Relay == nil {
			last := ss[len(ss)-1].flow
			if last != nil {
				v.Published, v.PublishedBy = formatCount(last.published), "by the relays named, since they started"
			}
		}
	}
	if q, ok := recentQuantiles(ss, time.Minute); ok {
		v.P50, v.P99 = formatSeconds(q[0]), formatSeconds(q[1])
	}
	var backlog, oldest []point
	for _, s := range ss {
		if s.status != nil {
			backlog = append(backlog, point{s.at, float64(s.status.Unpublished)})
			oldest = append(oldest, point{s.at, s.status.OldestAge.Seconds()})
		}
	}
	if d.flow.enabled() {
		v.Charts = append(v.Charts,
			chart{Title: "Events published per second", SVG: chartSVG("events per second", formatCount, 5, HistoryDefault, now, series{"events/s", "a", rate})},
			latencyChart(now, p50, p99))
	} else {
		v.FlowNote = "Events/s and latency come from the relays' metrics: the relay's own dashboard (--http) shows them, or start `outbox ui` with --metrics http://RELAY:9464/metrics."
	}
	v.Charts = append(v.Charts,
		chart{Title: "Backlog (events waiting)", SVG: chartSVG("backlog", formatCount, 5, HistoryDefault, now, series{"backlog", "a", backlog})},
		chart{Title: "Age of the oldest waiting event", SVG: chartSVG("oldest waiting event age", formatSeconds, 0, HistoryDefault, now, series{"age", "b", oldest})})
	p := d.base(r, "Overview", "overview")
	p.Data = v
	d.render(w, r, http.StatusOK, "overview", p)
}

func latencyChart(now time.Time, p50, p99 []point) chart {
	ss := []series{{"p50", "a", p50}, {"p99", "b", p99}}
	return chart{"Commit → broker latency", chartSVG("commit to broker latency", formatSeconds, 0, HistoryDefault, now, ss...), ss}
}

// recentQuantiles returns p50 and p99 of the events acknowledged over the last
// window of samples.
func recentQuantiles(ss []sample, window time.Duration) ([2]float64, bool) {
	var last, first *sample
	for i := len(ss) - 1; i >= 0; i-- {
		if ss[i].flow == nil {
			continue
		}
		if last == nil {
			last = &ss[i]
		}
		if last.at.Sub(ss[i].at) > window {
			break
		}
		first = &ss[i]
	}
	if last == nil || first == last {
		return [2]float64{}, false
	}
	delta := subBuckets(last.flow.buckets, first.flow.buckets)
	p50, ok1 := quantile(0.5, delta)
	p99, ok2 := quantile(0.99, delta)
	return [2]float64{p50, p99}, ok1 && ok2
}

// ---- relays ----

type relayRow struct {
	ID, Info, Heartbeat, Ranges, Lease string
	Count                              int
	Backlog                            int64
	Stale                              bool
}

type partitionCell struct {
	N       int
	Backlog int64
	Waiting bool
}

type slotRow struct {
	Name, State, Lag, Retained, Safe, Backfilled, Class string
}

type relaysData struct {
	StatusErr, Active, ActiveSince string
	Relays                         []relayRow
	Partitions                     []partitionCell
	Slots                          []slotRow
}

func (d *Dashboard) relays(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := d.ctx(r)
	defer cancel()
	var v relaysData
	st, err := d.status.Status(ctx)
	if err != nil {
		v.StatusErr = err.Error()
		st = &outboxdriver.Status{}
	}
	v.Active = st.ActiveRelay
	if !st.ActiveSince.IsZero() {
		v.ActiveSince = st.ActiveSince.UTC().Format(time.RFC3339)
	}
	for _, rs := range st.Relays {
		row := relayRow{ID: rs.ID, Info: rs.Info, Heartbeat: human.Age(rs.HeartbeatAge), Count: len(rs.Partitions),
			Ranges: human.Ranges(rs.Partitions), Lease: human.Age(rs.OldestLease), Stale: rs.HeartbeatAge > 30*time.Second}
		for _, p := range rs.Partitions {
			if p < len(st.PartitionBacklog) {
				row.Backlog += st.PartitionBacklog[p]
			}
		}
		v.Relays = append(v.Relays, row)
	}
	for i, n := range st.PartitionBacklog {
		v.Partitions = append(v.Partitions, partitionCell{N: i, Backlog: n, Waiting: n > 0})
	}
	for _, s := range st.Slots {
		row := slotRow{Name: s.Name, State: s.WALStatus, Lag: human.Bytes(s.LagBytes), Retained: human.Bytes(s.RetainedBytes),
			Safe: "unlimited (max_slot_wal_keep_size unset)", Backfilled: "no"}
		switch {
		case !s.Exists || s.WALStatus == "lost":
			row.State, row.Class = "LOST: recover with `outbox relay --mode cdc --recreate-slot`", "bad"
		case s.Active:
			row.State += ", streaming"
		default:
			row.State += ", no relay streaming"
		}
		if s.SafeBytes >= 0 {
			row.Safe = human.Bytes(s.SafeBytes)
		}
		if s.Backfilled {
			row.Backfilled = "yes"
		}
		v.Slots = append(v.Slots, row)
	}
	p := d.base(r, "Relays", "relays")
	p.Data = v
	d.render(w, r, http.StatusOK, "relays", p)
}

// ---- dead letters ----

// listLimit is how many dead letters a page lists.
const listLimit = 200

type deadData struct {
	Filter   outboxdriver.DeadFilter
	Older    string
	Filtered bool
	Dead     []outboxdriver.DeadLetter
	More     bool
}

// deadFilter reads a filter from a query or form; a bad "older" is the caller's
// error to show.
func deadFilter(form url.Values) (outboxdriver.DeadFilter, string, error) {
	f := outboxdriver.DeadFilter{
		AggregateType: form.Get("aggregatetype"),
		AggregateID:   form.Get("aggregateid"),
		Type:          form.Get("type"),
	}
	older := strings.TrimSpace(form.Get("older"))
	if older != "" {
		dur, err := time.ParseDuration(older)
		if err != nil || dur < 0 {
			return f, older, fmt.Errorf("dead for at least %q: want a duration such as 30m or 2h", older)
		}
		f.OlderThan = dur
	}
	return f, older, nil
}

func filtered(f *outboxdriver.DeadFilter) bool {
	return f.AggregateType != "" || f.AggregateID != "" || f.Type != "" || f.OlderThan > 0
}

func (d *Dashboard) dead(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := d.ctx(r)
	defer cancel()
	p := d.base(r, "Dead letters", "dead")
	q := r.URL.Query()
	f, older, err := deadFilter(q)
	v := deadData{Filter: f, Older: older, Filtered: filtered(&f)}
	status := http.StatusOK
	if err != nil {
		p.Error, status = err.Error(), http.StatusBadRequest
	} else {
		f.Limit, f.PayloadMax = listLimit+1, 1 // the list shows no payload
		dead, err := d.cfg.Admin.ListDead(ctx, &f)
		if err != nil {
			p.Error, status = "listing dead letters: "+err.Error(), http.StatusInternalServerError
		}
		if len(dead) > listLimit {
			dead, v.More = dead[:listLimit], true
		}
		v.Dead = dead
	}
	if n, err := strconv.Atoi(q.Get("n")); err == nil {
		switch q.Get("done") {
		case "replay":
			p.Flash = fmt.Sprintf("Replayed %d dead letter(s): back in the outbox in their original order; their aggregates are released.", n)
		case "purge":
			p.Flash = fmt.Sprintf("Purged %d dead letter(s); their aggregates are released.", n)
		}
	}
	p.Data = v
	d.render(w, r, status, "dead", p)
}

// deadAction replays or purges dead letters: the selected ones, or every one the
// filter matches. Only for a signed-in admin, with the session's CSRF token.
func (d *Dashboard) deadAction(w http.ResponseWriter, r *http.Request) {
	if !d.adminForm(w, r, 1<<20) {
		return
	}
	do := r.PostForm.Get("do")
	verb, scope, _ := strings.Cut(do, "-")
	if (verb != "replay" && verb != "purge") || (scope != "selected" && scope != "matching") {
		d.message(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("Unknown action %q.", do))
		return
	}
	f, older, err := deadFilter(r.PostForm)
	if err != nil {
		d.message(w, r, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	if scope == "selected" {
		f = outboxdriver.DeadFilter{IDs: r.PostForm["id"]}
		if len(f.IDs) == 0 {
			d.message(w, r, http.StatusBadRequest, "Nothing selected", "Select the dead letters to "+verb+" first.")
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	var n int
	if verb == "replay" {
		n, err = d.cfg.Admin.ReplayDead(ctx, &f)
	} else {
		n, err = d.cfg.Admin.PurgeDead(ctx, &f)
	}
	if err != nil {
		d.message(w, r, http.StatusInternalServerError, "Failed", verb+": "+err.Error())
		return
	}
	done := map[string]string{"replay": "replayed", "purge": "purged"}[verb]
	d.log.Info("dashboard: dead letters "+done, "count", n, "ids", auditIDs(f.IDs), "aggregatetype", f.AggregateType,
		"aggregateid", f.AggregateID, "type", f.Type, "older_than", f.OlderThan, "remote", r.RemoteAddr)
	back := url.Values{"done": {verb}, "n": {strconv.Itoa(n)}}
	if scope == "matching" {
		for _, k := range []string{"aggregatetype", "aggregateid", "type"} {
			if v := r.PostForm.Get(k); v != "" {
				back.Set(k, v)
			}
		}
		if older != "" {
			back.Set("older", older)
		}
	}
	http.Redirect(w, r, d.cfg.Prefix+"/dead?"+back.Encode(), http.StatusSeeOther)
}

// adminForm reads r's form (at most maxBytes) and reports whether it comes from a
// signed-in admin with the session's CSRF token; if not, it says why.
func (d *Dashboard) adminForm(w http.ResponseWriter, r *http.Request, maxBytes int64) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBytes)
	if err := r.ParseForm(); err != nil {
		d.message(w, r, http.StatusBadRequest, "Bad request", "The form could not be read: "+err.Error())
		return false
	}
	return d.allowed(w, r)
}

// allowed reports whether the parsed form r comes from a signed-in admin with the
// session's CSRF token; if not, it says why.
func (d *Dashboard) allowed(w http.ResponseWriter, r *http.Request) bool {
	sess, err := d.auth.session(r, d.now())
	if err != nil {
		text := "This dashboard is read-only: start the relay (or `outbox ui`) with --ui-token to allow replay, edit and purge."
		if d.auth.enabled() {
			text = "Replay, edit and purge need the admin token: sign in first."
		}
		d.message(w, r, http.StatusForbidden, "Refused", text)
		return false
	}
	if !d.auth.checkCSRF(sess, r.PostForm.Get("csrf")) {
		d.message(w, r, http.StatusForbidden, "Refused", "The form's CSRF token is missing or stale: reload the page and try again.")
		return false
	}
	return true
}

// ---- one event ----

type header struct{ K, V string }

type eventData struct {
	outboxdriver.EventInfo
	StateText, PayloadText, PayloadKind, CDCNote string
	Waiting, Published, Dead, AvailableAtSet     bool
	Headers                                      []header
	// PayloadCut: the page shows the payload's first PayloadPreview bytes; the whole
	// one is a download (eventPayload).
	PayloadCut  bool
	PayloadSize int
	// Edit is a dead letter's fix-before-replay form (admins only).
	Edit *editForm
}

// editForm is the dead-letter edit form: the payload as text (when it is text and
// whole on the page) and the headers as a JSON object.
type editForm struct {
	PayloadEditable bool
	Payload         string
	Headers         string
}

// PayloadPreview is the most of a payload an event page shows: a huge payload must
// not be rendered (indented, escaped, copied) into every page view.
const PayloadPreview = 64 << 10

func (d *Dashboard) findEvent(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	if id == "" {
		d.message(w, r, http.StatusBadRequest, "Find an event", "Give an event id.")
		return
	}
	http.Redirect(w, r, d.cfg.Prefix+"/events/"+url.PathEscape(id), http.StatusSeeOther)
}

func (d *Dashboard) event(w http.ResponseWriter, r *http.Request) {
	p := d.base(r, "", "")
	switch r.URL.Query().Get("done") {
	case "edited":
		p.Flash = "Saved. Replay it to send the fixed event."
	case "replayed":
		p.Flash = "Saved and replayed: the event is back in the outbox, in its aggregate's order."
	}
	d.eventPage(w, r, p, http.StatusOK, nil)
}

// eventPage renders an event's story on p; edit, when not nil, is a submitted edit
// form to show again (with p.Error saying what was wrong with it).
func (d *Dashboard) eventPage(w http.ResponseWriter, r *http.Request, p *page, status int, edit *editForm) {
	ctx, cancel := d.ctx(r)
	defer cancel()
	id := r.PathValue("id")
	e, err := d.readEvent(ctx, id)
	if errors.Is(err, outboxdriver.ErrEventNotFound) {
		d.message(w, r, http.StatusNotFound, "No such event",
			fmt.Sprintf("No table holds an event with id %q: never written, rolled back, cleaned up after publication, or purged.", id))
		return
	}
	if err != nil {
		d.message(w, r, http.StatusInternalServerError, "Failed", "Reading the event: "+err.Error())
		return
	}
	v := eventData{EventInfo: *e, Waiting: e.State == outboxdriver.EventWaiting, Published: e.State == outboxdriver.EventPublished,
		Dead: e.State == outboxdriver.EventDead, AvailableAtSet: !e.AvailableAt.IsZero()}
	switch e.State {
	case outboxdriver.EventWaiting:
		v.StateText = "Waiting to be published"
		if e.Attempts > 0 {
			v.StateText = "Waiting for a retry"
		}
	case outboxdriver.EventPublished:
		v.StateText = "Published"
	case outboxdriver.EventDead:
		v.StateText = "Dead letter"
	}
	if v.Waiting && (d.cfg.Mode == "cdc" || d.cdcTable(ctx)) {
		v.CDCNote = "A CDC relay reads events from the WAL and marks a row published a moment after the broker acknowledged it. Its slot's lag (Relays) says what it has yet to send."
	}
	if v.Dead && p.Admin {
		v.Edit = edit
		if v.Edit == nil {
			v.Edit = newEditForm(e)
		}
	}
	v.PayloadSize = len(e.Payload)
	if len(e.Payload) > PayloadPreview {
		v.PayloadCut = true
		e.Payload = e.Payload[:PayloadPreview:PayloadPreview]
	}
	v.PayloadText, v.PayloadKind = payloadText(e)
	if v.PayloadCut {
		v.PayloadKind = fmt.Sprintf("the first %d of %d bytes", PayloadPreview, v.PayloadSize)
	}
	for k, val := range e.Headers {
		v.Headers = append(v.Headers, header{k, val})
	}
	sort.Slice(v.Headers, func(i, j int) bool { return v.Headers[i].K < v.Headers[j].K })
	p.Title = "Event " + e.ID
	p.Data = v
	d.render(w, r, status, "event", p)
}

func newEditForm(e *outboxdriver.EventInfo) *editForm {
	f := &editForm{Headers: "{}"}
	if len(e.Headers) > 0 {
		b, _ := json.MarshalIndent(e.Headers, "", "  ")
		f.Headers = string(b)
	}
	if !e.PayloadNull && len(e.Payload) <= PayloadPreview && utf8.Valid(e.Payload) {
		f.PayloadEditable, f.Payload = true, string(e.Payload)
	}
	return f
}

// editDead fixes a dead letter's payload or headers (an admin's form on the event
// page), and replays it when asked. A refused edit shows the form again as
// submitted, with the reason: nothing typed is lost.
func (d *Dashboard) editDead(w http.ResponseWriter, r *http.Request) {
	if !d.adminForm(w, r, 2*PayloadPreview+1<<20) {
		return
	}
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	cur, err := d.readEvent(ctx, id)
	if err == nil && cur.State != outboxdriver.EventDead {
		err = outboxdriver.ErrEventNotFound
	}
	if errors.Is(err, outboxdriver.ErrEventNotFound) {
		d.message(w, r, http.StatusNotFound, "No such dead letter", fmt.Sprintf("No dead letter has id %q: replayed or purged meanwhile?", id))
		return
	}
	if err != nil {
		d.message(w, r, http.StatusInternalServerError, "Failed", "Reading the dead letter: "+err.Error())
		return
	}
	was := newEditForm(cur)
	// Browsers send a textarea's line breaks as CRLF: the payload keeps LF.
	got := &editForm{PayloadEditable: was.PayloadEditable, Headers: r.PostForm.Get("headers"),
		Payload: strings.ReplaceAll(r.PostForm.Get("payload"), "\r\n", "\n")}
	refuse := func(status int, why string) {
		p := d.base(r, "", "")
		p.Error = why
		d.eventPage(w, r, p, status, got)
	}
	var edit outboxdriver.DeadEdit
	if was.PayloadEditable && got.Payload != strings.ReplaceAll(was.Payload, "\r\n", "\n") {
		edit.Payload = []byte(got.Payload)
	}
	if strings.TrimSpace(got.Headers) != strings.TrimSpace(was.Headers) {
		if err := json.Unmarshal([]byte(got.Headers), &edit.Headers); err != nil || edit.Headers == nil {
			refuse(http.StatusBadRequest, `The headers must be a JSON object of strings, such as {"name": "value"}: nothing was saved.`)
			return
		}
	}
	replay := r.PostForm.Get("do") == "save-replay"
	if edit.Payload == nil && edit.Headers == nil && !replay {
		refuse(http.StatusBadRequest, "Nothing changed: nothing was saved.")
		return
	}
	if edit.Payload != nil || edit.Headers != nil {
		if err := d.cfg.Admin.EditDead(ctx, id, &edit); err != nil {
			refuse(http.StatusBadRequest, "The dead letter was not changed: "+err.Error())
			return
		}
	}
	done := "edited"
	if replay {
		if _, err := d.cfg.Admin.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: []string{id}}); err != nil {
			d.message(w, r, http.StatusInternalServerError, "Failed", "Saved, but the replay failed: "+err.Error())
			return
		}
		done = "replayed"
	}
	d.log.Info("dashboard: dead letter edited", "id", id, "payload", edit.Payload != nil, "headers", edit.Headers != nil,
		"replayed", replay, "remote", r.RemoteAddr)
	http.Redirect(w, r, d.cfg.Prefix+"/events/"+url.PathEscape(id)+"?done="+done, http.StatusSeeOther)
}

// readEvent reads an event whole, among at most eventReadsMax at once (shared.reads):
// a request that cannot get its turn before its deadline fails.
func (d *Dashboard) readEvent(ctx context.Context, id string) (*outboxdriver.EventInfo, error) {
	select {
	case d.shared.reads <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("too many events are being read at once: %w", ctx.Err())
	}
	defer func() { <-d.shared.reads }()
	return d.cfg.Admin.Event(ctx, id)
}

// eventPayload sends an event's whole payload, as a download (never rendered).
func (d *Dashboard) eventPayload(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := d.ctx(r)
	defer cancel()
	e, err := d.readEvent(ctx, r.PathValue("id"))
	if errors.Is(err, outboxdriver.ErrEventNotFound) {
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, "reading the event failed", http.StatusInternalServerError)
		d.log.Warn("dashboard: reading an event's payload", "err", err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store") // a payload is the business's data: no cache keeps it
	w.Header().Set("Content-Disposition", `attachment; filename="`+url.PathEscape(e.ID)+`.payload"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(e.Payload)))
	_, _ = w.Write(e.Payload)
}

// cdcTable says whether a CDC relay has a slot on the table.
func (d *Dashboard) cdcTable(ctx context.Context) bool {
	st, err := d.status.Status(ctx)
	return err == nil && len(st.Slots) > 0
}

// payloadText shows a payload as indented JSON, text, or hex for bytes.
func payloadText(e *outboxdriver.EventInfo) (string, string) {
	switch {
	case e.PayloadNull:
		return "null", "(NULL: a tombstone)"
	case json.Valid(e.Payload):
		var buf bytes.Buffer
		if json.Indent(&buf, e.Payload, "", "  ") == nil {
			return buf.String(), "JSON"
		}
		return string(e.Payload), "JSON"
	case utf8.Valid(e.Payload):
		return string(e.Payload), "text"
	default:
		return fmt.Sprintf("% x", e.Payload), fmt.Sprintf("%d bytes, hex", len(e.Payload))
	}
}

// ---- sign in ----

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	p := d.base(r, "Sign in", "")
	p.Data = d.auth.enabled()
	d.render(w, r, http.StatusOK, "login", p)
}

func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	_ = r.ParseForm()
	if !d.auth.checkToken(r.PostForm.Get("token")) {
		d.log.Warn("dashboard: sign-in refused", "remote", r.RemoteAddr) // checkToken made it wait
		p := d.base(r, "Sign in", "")
		p.Data, p.Error = d.auth.enabled(), "That is not the admin token."
		if !d.auth.enabled() {
			p.Error = "This dashboard is read-only: no admin token is configured."
		}
		d.render(w, r, http.StatusForbidden, "login", p)
		return
	}
	d.log.Info("dashboard: signed in", "remote", r.RemoteAddr)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: d.auth.newSession(d.now()), Path: d.shared.root,
		MaxAge: int(sessionTTL.Seconds()), HttpOnly: true, Secure: secureRequest(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, cmp.Or(d.afterLogin, d.cfg.Prefix+"/dead"), http.StatusSeeOther)
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if session, err := d.auth.session(r, d.now()); err == nil {
		d.auth.revoke(session, d.now()) // the cookie, if kept, no longer signs in
		d.log.Info("dashboard: signed out", "remote", r.RemoteAddr)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: d.shared.root, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, d.cfg.Prefix+"/", http.StatusSeeOther)
}

// auditIDs is the ids an action named, for the audit line: at most 50, then a count.
func auditIDs(ids []string) string {
	if len(ids) <= 50 {
		return strings.Join(ids, ",")
	}
	return strings.Join(ids[:50], ",") + fmt.Sprintf(",... (%d in all)", len(ids))
}
