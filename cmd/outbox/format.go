package main

import (
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// wireFormat is how events go on the wire, as --format, the CloudEvents flags and
// --config's Debezium router options say: outbox's own format (no router), CloudEvents
// or Debezium's router. A table's router is built from it by router, the one place
// the CLI builds routers.
type wireFormat struct {
	cloudEvents bool
	ce          cloudevents.Config // Mode, Binding, Source and Topic; Table is set per table
	debezium    map[string]string  // the router's options; nil: not Debezium's router
}

// newWireFormat reads --format and its companions. topic is the parsed
// --topic-template, which CloudEvents routes with.
func newWireFormat(format, ceMode, ceSource, scheme string, topic *broker.Template, debeziumOpts map[string]string) wireFormat {
	return wireFormat{
		cloudEvents: format == "cloudevents",
		ce:          cloudevents.Config{Mode: cloudevents.Mode(ceMode), Binding: cloudEventsBinding(scheme), Source: ceSource, Topic: topic},
		debezium:    debeziumOpts,
	}
}

// router builds table's router: nil for outbox's own format. cols are the table's
// columns, which make Debezium's converters' schemas exact (nil: the outbox's own).
func (f wireFormat) router(table outboxdriver.Table, cols []debezium.Column) (relay.Router, error) {
	switch {
	case len(f.debezium) > 0:
		return debezium.New(&debezium.Config{Options: f.debezium, Table: table, TableColumns: cols})
	case f.cloudEvents:
		c := f.ce
		c.Table = table
		return cloudevents.New(&c)
	}
	return nil, nil
}
