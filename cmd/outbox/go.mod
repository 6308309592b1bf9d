module github.com/outboxd/outbox/cmd/outbox

go 1.26.0

toolchain go1.26.8

require (
	github.com/outboxd/outbox v0.1.0
	github.com/outboxd/outbox/broker/amqp v0.1.0
	github.com/outboxd/outbox/broker/kafka v0.1.0
	github.com/outboxd/outbox/broker/mqtt v0.1.0
	github.com/outboxd/outbox/broker/nats v0.1.0
	github.com/outboxd/outbox/broker/pubsub v0.1.0
	github.com/outboxd/outbox/broker/redis v0.1.0
	github.com/outboxd/outbox/broker/sqs v0.1.0
	github.com/outboxd/outbox/broker/stdout v0.1.0
	github.com/outboxd/outbox/broker/webhook v0.1.0
	github.com/outboxd/outbox/dashboard v0.1.0
	github.com/outboxd/outbox/debezium v0.1.0
	github.com/outboxd/outbox/inbox v0.1.0
	github.com/outboxd/outbox/inbox/natsinbox v0.1.0
	github.com/outboxd/outbox/internal/natsembed v0.1.0
	github.com/outboxd/outbox/outboxdriver/outboxmysql v0.1.0
	github.com/outboxd/outbox/outboxdriver/outboxsqlite v0.1.0
	github.com/outboxd/outbox/outboxotel v0.1.0
	github.com/outboxd/outbox/pgcdc v0.1.0
	github.com/outboxd/outbox/relay v0.1.0
	github.com/outboxd/outbox/relay/relayprom v0.1.0 // indirect
	github.com/outboxd/outbox/replay v0.1.0
	github.com/outboxd/outbox/supervisor v0.1.0
)

require (
	cloud.google.com/go/pubsub/v2 v2.9.0
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/service/sqs v1.53.0
	github.com/cloudevents/sdk-go/v2 v2.16.2
	github.com/eclipse/paho.golang v0.23.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	github.com/prometheus/client_golang v1.25.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.49.0
	google.golang.org/api v0.304.0
	google.golang.org/grpc v1.84.0
)

require (
	cloud.google.com/go v0.123.0 // indirect
	cloud.google.com/go/auth v0.24.1-0.20261001053825-dbc26066f70a // indirect
	cloud.google.com/go/auth/oauth2adapt v0.3.0 // indirect
	cloud.google.com/go/compute/metadata v0.10.0 // indirect
	cloud.google.com/go/iam v1.14.0 // indirect
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/antithesishq/antithesis-sdk-go v0.8.0-default-no-op // indirect
	github.com/aws/aws-sdk-go-v2/config v1.33.18 // indirect
	github.com/aws/aws-sdk-go-v2/credentials v1.21.0 // indirect
	github.com/aws/aws-sdk-go-v2/feature/ec2/imds v1.20.9 // indirect
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/v4a v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.25 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/presigned-url v1.14.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/signin v1.13.1 // indirect
	github.com/aws/aws-sdk-go-v2/service/sso v1.39.5 // indirect
	github.com/aws/aws-sdk-go-v2/service/ssooidc v1.44.5 // indirect
	github.com/aws/aws-sdk-go-v2/service/sts v1.52.0 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/google/s2a-go v0.1.11 // indirect
	github.com/googleapis/enterprise-certificate-proxy v0.3.23 // indirect
	github.com/googleapis/gax-go/v2 v2.27.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/jwt/v2 v2.8.2 // indirect
	github.com/nats-io/nats-server/v2 v2.15.2 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	go.opencensus.io v0.24.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc v0.70.0 // indirect
	go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.70.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.opentelemetry.io/proto/otlp v1.11.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/oauth2 v0.37.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto v0.0.0-20261012220534-4341edf3f941 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261012220534-4341edf3f941 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261012220534-4341edf3f941 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

// The project's own modules, from this checkout (a release replaces nothing:
// these lines are ignored where this module is a dependency).
replace (
	github.com/outboxd/outbox => ../..
	github.com/outboxd/outbox/broker/amqp => ../../broker/amqp
	github.com/outboxd/outbox/broker/brokertest => ../../broker/brokertest
	github.com/outboxd/outbox/broker/kafka => ../../broker/kafka
	github.com/outboxd/outbox/broker/mqtt => ../../broker/mqtt
	github.com/outboxd/outbox/broker/nats => ../../broker/nats
	github.com/outboxd/outbox/broker/pubsub => ../../broker/pubsub
	github.com/outboxd/outbox/broker/redis => ../../broker/redis
	github.com/outboxd/outbox/broker/sqs => ../../broker/sqs
	github.com/outboxd/outbox/broker/stdout => ../../broker/stdout
	github.com/outboxd/outbox/broker/webhook => ../../broker/webhook
	github.com/outboxd/outbox/dashboard => ../../dashboard
	github.com/outboxd/outbox/debezium => ../../debezium
	github.com/outboxd/outbox/inbox => ../../inbox
	github.com/outboxd/outbox/inbox/kafkainbox => ../../inbox/kafkainbox
	github.com/outboxd/outbox/inbox/natsinbox => ../../inbox/natsinbox
	github.com/outboxd/outbox/internal/natsembed => ../../internal/natsembed
	github.com/outboxd/outbox/outboxdriver/outboxmysql => ../../outboxdriver/outboxmysql
	github.com/outboxd/outbox/outboxdriver/outboxsqlite => ../../outboxdriver/outboxsqlite
	github.com/outboxd/outbox/outboxotel => ../../outboxotel
	github.com/outboxd/outbox/pgcdc => ../../pgcdc
	github.com/outboxd/outbox/relay => ../../relay
	github.com/outboxd/outbox/relay/relayprom => ../../relay/relayprom
	github.com/outboxd/outbox/replay => ../../replay
	github.com/outboxd/outbox/supervisor => ../../supervisor
)
