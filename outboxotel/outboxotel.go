// Package outboxotel connects outbox to OpenTelemetry, so one trace crosses the
// writer, the relay and the consumer:
//
//   - TraceContext stores the caller's span context with each event
//     (outbox.Config.TraceContext), in the tracingspancontext column as Debezium does;
//   - PublishTracer opens a producer span per event, child of the writer's span, and
//     puts its traceparent/tracestate in the broker headers (relay.Config.Tracer);
//   - InboxSpan opens a consumer span per message, child of the publish span
//     (inbox.Config.StartSpan).
//
// The core packages do not import OpenTelemetry; only this adapter does.
package outboxotel

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/inbox"
)

const instrumentation = "github.com/outboxd/outbox"

func orDefault(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p == nil {
		return propagation.TraceContext{}
	}
	return p
}

// TraceContext returns the writer hook storing ctx's trace context (W3C Trace Context
// by default) as "traceparent=...\ntracestate=..." text.
func TraceContext(prop propagation.TextMapPropagator) func(ctx context.Context) string {
	prop = orDefault(prop)
	return func(ctx context.Context) string {
		c := propagation.MapCarrier{}
		prop.Inject(ctx, c)
		if len(c) == 0 {
			return ""
		}
		var b strings.Builder
		for _, k := range []string{"traceparent", "tracestate"} {
			if v := c[k]; v != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(k + "=" + v)
			}
		}
		return b.String()
	}
}

// PublishTracer is a relay.PublishTracer. Build it with NewPublishTracer.
type PublishTracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// NewPublishTracer returns a tracer on tp (nil propagator: W3C Trace Context).
func NewPublishTracer(tp trace.TracerProvider, prop propagation.TextMapPropagator) *PublishTracer {
	return &PublishTracer{tracer: tp.Tracer(instrumentation), prop: orDefault(prop)}
}

// StartPublish implements relay.PublishTracer. Messages without a producer trace are
// left alone: the relay does not start traces of its own per event.
func (p *PublishTracer) StartPublish(msgs []broker.Message) func([]broker.Result) {
	spans := make([]trace.Span, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if m.Headers["traceparent"] == "" {
			continue
		}
		h := make(map[string]string, len(m.Headers)+2)
		for k, v := range m.Headers {
			h[k] = v
		}
		parent := p.prop.Extract(context.Background(), propagation.MapCarrier(h))
		ctx, span := p.tracer.Start(parent, "publish "+m.Topic, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.destination.name", m.Topic),
				attribute.String("messaging.message.id", m.ID), attribute.String("outbox.aggregate.id", m.AggregateID)))
		p.prop.Inject(ctx, propagation.MapCarrier(h))
		m.Headers = h
		spans[i] = span
	}
	return func(results []broker.Result) {
		for i, s := range spans {
			if s == nil {
				continue
			}
			if err := results[i].Err; err != nil {
				s.RecordError(err)
				s.SetStatus(codes.Error, err.Error())
			}
			s.End()
		}
	}
}

// InboxSpan returns the inbox hook opening a consumer span per message, continuing the
// trace in its headers.
func InboxSpan(tp trace.TracerProvider, prop propagation.TextMapPropagator) func(context.Context, string, *inbox.Message) (context.Context, func(inbox.Outcome, error)) {
	tracer, prop := tp.Tracer(instrumentation), orDefault(prop)
	return func(ctx context.Context, consumer string, msg *inbox.Message) (context.Context, func(inbox.Outcome, error)) {
		parent := prop.Extract(ctx, propagation.MapCarrier(msg.Headers))
		ctx, span := tracer.Start(parent, "process "+msg.Type, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attribute.String("messaging.consumer.group.name", consumer),
				attribute.String("messaging.message.id", msg.ID), attribute.String("outbox.aggregate.id", msg.AggregateID)))
		return ctx, func(outcome inbox.Outcome, err error) {
			span.SetAttributes(attribute.String("outbox.inbox.outcome", outcome.String()))
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}
	}
}
