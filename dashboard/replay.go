package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/internal/human"
	"github.com/outboxd/outbox/replay"
)

// replayForm is the start form, as typed (shown again when refused).
type replayForm struct {
	Name, Since, Until, AggregateType, AggregateID, Type, Topic, Rate string
	ByCreation                                                        bool
}

type replayData struct {
	Available   bool
	Unavailable string
	State       replay.State
	ETA         string
	Form        replayForm
}

func (d *Dashboard) replayData(form replayForm) replayData {
	v := replayData{Available: d.cfg.Replays != nil, Form: form,
		Unavailable: "This dashboard has no broker to replay to: use the dashboard of a relay (outbox relay --http) or the command `outbox replay`."}
	if form.Name == "" {
		v.Form.Name = "default"
	}
	if d.cfg.Replays != nil {
		v.State = d.cfg.Replays.State()
		if eta := v.State.Progress.ETA(); v.State.Running && eta > 0 {
			v.ETA = human.Age(eta)
		}
	}
	return v
}

func (d *Dashboard) replayPage(w http.ResponseWriter, r *http.Request) {
	p := d.base(r, "Replay", "replay")
	v := d.replayData(replayForm{})
	if v.State.Running {
		p.Refresh = 2
	}
	switch r.URL.Query().Get("done") {
	case "start":
		p.Flash = "Replay started."
	case "stop":
		p.Flash = "Replay stopped; start it again under the same name to continue."
	}
	p.Data = v
	d.render(w, r, http.StatusOK, "replay", p)
}

// replayStart starts a replay from the form (admins only); a refused form is shown
// again as typed, with the reason.
func (d *Dashboard) replayStart(w http.ResponseWriter, r *http.Request) {
	if !d.adminForm(w, r, 64<<10) {
		return
	}
	f := r.PostForm
	form := replayForm{Name: strings.TrimSpace(f.Get("name")), Since: f.Get("since"), Until: f.Get("until"), AggregateType: f.Get("aggregatetype"),
		AggregateID: f.Get("aggregateid"), Type: f.Get("type"), Topic: f.Get("topic"), Rate: f.Get("rate"), ByCreation: f.Get("bycreation") != ""}
	refuse := func(status int, why string) {
		p := d.base(r, "Replay", "replay")
		p.Error, p.Data = why, d.replayData(form)
		d.render(w, r, status, "replay", p)
	}
	if d.cfg.Replays == nil {
		refuse(http.StatusConflict, "This dashboard has no broker to replay to.")
		return
	}
	cfg, err := replayConfig(&form, time.Now())
	if err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	cfg.Logger = d.log
	if err := d.cfg.Replays.Start(cfg); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, replay.ErrRunning) {
			status = http.StatusConflict
		}
		refuse(status, "Not started: "+err.Error())
		return
	}
	d.log.Info("dashboard: replay started", "name", cfg.Name, "selection", cfg.Filter.String(), "remote", r.RemoteAddr)
	http.Redirect(w, r, d.cfg.Prefix+"/replay?"+url.Values{"done": {"start"}}.Encode(), http.StatusSeeOther)
}

func (d *Dashboard) replayStop(w http.ResponseWriter, r *http.Request) {
	if !d.adminForm(w, r, 64<<10) {
		return
	}
	if d.cfg.Replays != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		d.cfg.Replays.Stop(ctx)
		d.log.Info("dashboard: replay stopped", "name", d.cfg.Replays.State().Name, "remote", r.RemoteAddr)
	}
	http.Redirect(w, r, d.cfg.Prefix+"/replay?"+url.Values{"done": {"stop"}}.Encode(), http.StatusSeeOther)
}

// replayConfig reads the form as `outbox replay` reads its flags.
func replayConfig(f *replayForm, now time.Time) (*replay.Config, error) {
	c := &replay.Config{Name: f.Name, Filter: replay.Filter{AggregateType: f.AggregateType, AggregateID: f.AggregateID, Type: f.Type, ByCreation: f.ByCreation}}
	if c.Name == "" {
		return nil, errors.New("Give the replay a name: its checkpoint and its lock.")
	}
	var err error
	if c.Filter.Since, err = replay.ParseWhen(f.Since, now); err != nil {
		return nil, fmt.Errorf("Published since: %w", err)
	}
	if c.Filter.Until, err = replay.ParseWhen(f.Until, now); err != nil {
		return nil, fmt.Errorf("Published until: %w", err)
	}
	if f.Rate != "" {
		if c.Rate, err = strconv.ParseFloat(f.Rate, 64); err != nil || c.Rate < 0 {
			return nil, fmt.Errorf("Events/s %q: want a number of events per second", f.Rate)
		}
	}
	if f.Topic != "" {
		if c.Topic, err = broker.ParseTemplate(f.Topic); err != nil {
			return nil, fmt.Errorf("Topic template: %w", err)
		}
	}
	return c, nil
}
