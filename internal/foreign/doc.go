// Package foreign reads the relay's output with clients no one here wrote (npm's
// kafkajs, nats.js, amqplib, MQTT.js and ioredis, pinned in node/package-lock.json),
// to check that consumers get
// what the docs promise: ids, keys, headers, payload bytes and order per aggregate,
// on the default settings (kafkajs without codec plugins: the relay's Kafka records
// are uncompressed, as Kafka Connect's are).
package foreign
