package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/kafka"
)

// Publish to Kafka (here kfake, franz-go's in-process Kafka, which speaks the real
// protocol) and read the record back: the aggregate id is the key, so an aggregate's
// events share a partition and keep their order, and the event id travels in the id
// header (as Debezium's router sends it) for the consumer's inbox.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "outbox.event.order"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pub, err := kafka.Dial(ctx, "kafka://"+cluster.ListenAddrs()[0], nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	res := pub.Publish(ctx, []broker.Message{{
		ID: "0192f0c4-0000-7000-8000-000000000001", Topic: "outbox.event.order", Key: "42",
		EventType: "OrderPlaced", AggregateType: "order", AggregateID: "42", Payload: []byte(`{"total":990}`),
	}})
	if res[0].Err != nil {
		panic(res[0].Err)
	}

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("outbox.event.order"))
	if err != nil {
		panic(err)
	}
	defer consumer.Close()
	fetches := consumer.PollRecords(ctx, 1)
	fetches.EachRecord(func(r *kgo.Record) {
		fmt.Printf("key %s, %s\n", r.Key, r.Value)
		for _, h := range r.Headers {
			if h.Key == broker.HeaderID {
				fmt.Println(h.Key, string(h.Value))
			}
		}
	})
	// Output:
	// key 42, {"total":990}
	// id 0192f0c4-0000-7000-8000-000000000001
}
