package main

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/kafka"
	"github.com/outboxd/outbox/cloudevents"
	"github.com/outboxd/outbox/dashboard"
	"github.com/outboxd/outbox/debezium"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

// tablesPollIntervalDefault is --poll-interval's default with --tables.
const tablesPollIntervalDefault = 30 * time.Second

// relayOptions are the relay command's settings, validated.
type relayOptions struct {
	dsn, leaderDSN, brokerURL, mode string
	configPath                      string
	table                           outboxdriver.Table
	cfg                             *relay.Config
	cdc                             pgcdc.Config
	broker                          brokerOptions
	format                          wireFormat
	leaseTTL                        time.Duration
	httpAddr, uiToken               string
	uiHosts                         []string
	ui, allowNewerSchema            bool
	logger                          *slog.Logger
	// tables, with --tables: the patterns of the tables one process relays, found
	// again every tablesRescan; maxConns caps its database connections (0: the
	// pool's default).
	tables       []outboxdriver.TablePattern
	trustOwners  []string // --trust-owner: besides the current role and its roles
	tablesRescan time.Duration
	maxConns     int
	parkAfter    time.Duration // --tables --mode cdc: pgcdc.SharedConfig.ParkAfter
	maxSpilled   int           // --tables --mode cdc: pgcdc.SharedConfig.MaxSpilled
}

// relayFlags are relay's flags, as declared (relayOptions is what they mean once
// checked together).
type relayFlags struct {
	dsn, tableName *string
	bo             *brokerOptions
	cdcCfg         pgcdc.Config
	uiHosts        listFlag
	leaderDSN      string
	brokerURL      string
	mode           string
	allowNewer     bool
	parkAfter      time.Duration
	maxSpilled     int
	batch          int
	leaderTimeout  time.Duration
	batchBytes     int
	poll           time.Duration
	completion     string
	del            bool
	maxAttempts    int
	retryMin       time.Duration
	retryMax       time.Duration
	straggler      time.Duration
	retention      time.Duration
	flowPast       bool
	topic          string
	format         string
	ceMode         string
	ceSource       string
	leaseTTL       time.Duration
	group          bool
	relayID        string
	partitionLease time.Duration
	httpAddr       string
	ui             bool
	uiToken        string
	configPath     string
	tablesList     string
	tablesRescan   time.Duration
	maxConns       int
	logLevel       string
	logFormat      string
}

// parseRelayFlags reads the flags, the config file and OUTBOX_* variables into
// relayOptions, and refuses a bad one before anything connects.
func parseRelayFlags(args []string, stderr io.Writer) (*relayOptions, error) {
	o := &relayFlags{}
	fs := newFlags("relay", stderr)
	o.register(fs)
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	var routerOpts map[string]string
	if o.configPath != "" {
		var err error
		if routerOpts, err = applyConfigFile(fs, o.configPath); err != nil {
			return nil, err
		}
	}
	if os.Getenv("GOGC") == "" {
		// The relay's live heap is small (~10 MiB) and churns fast (one batch of
		// rows and messages at a time): collecting less often saves about a quarter
		// of its CPU at 200k-event backlogs. 300, not more: at 400 a CDC relay's
		// peak RSS passed 100 MiB for no CPU measurably saved (docs/benchmarks.md).
		debug.SetGCPercent(300)
	}
	scheme, err := brokerScheme(o.brokerURL, *o.bo)
	if err != nil {
		return nil, err
	}
	if o.topic == "" {
		o.topic = defaultTopicTemplate(scheme)
	}
	isPG := strings.HasPrefix(*o.dsn, "postgres://") || strings.HasPrefix(*o.dsn, "postgresql://")
	if err := o.checkModes(fs, scheme, isPG); err != nil {
		return nil, err
	}
	tables, err := o.tablePatterns(fs, isPG)
	if err != nil {
		return nil, err
	}
	logger, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return nil, err
	}
	table, err := parseTable(*o.tableName, string(outboxdriver.PayloadJSON))
	if err != nil {
		return nil, err
	}
	if err := o.checkBounds(fs); err != nil {
		return nil, err
	}
	wire, router, err := o.wireFormat(scheme, table, routerOpts, logger)
	if err != nil {
		return nil, err
	}
	cfg, err := o.relayConfig(logger)
	if err != nil {
		return nil, err
	}
	if tables == nil {
		cfg.Router = router
	}
	if err := cfg.Validate(); err != nil {
		return nil, usageErr("%v", err) // bad flags, before connecting anywhere
	}
	o.cdcCfg.MaxPendingBytes = zeroIsOff(o.cdcCfg.MaxPendingBytes)
	return &relayOptions{dsn: *o.dsn, leaderDSN: o.leaderDSN, brokerURL: o.brokerURL, mode: o.mode, configPath: o.configPath, table: table, cfg: cfg,
		cdc: o.cdcCfg, broker: *o.bo, format: wire, leaseTTL: o.leaseTTL, httpAddr: o.httpAddr, uiToken: o.uiToken,
		ui: o.ui, uiHosts: o.uiHosts, allowNewerSchema: o.allowNewer, logger: logger,
		tables: tables, trustOwners: trustedOwners(fs), tablesRescan: o.tablesRescan, maxConns: o.maxConns, parkAfter: zeroIsOff(o.parkAfter),
		maxSpilled: zeroIsOff(o.maxSpilled)}, nil
}

// checkModes checks the flags that depend on the mode, the database and the broker.
func (o *relayFlags) checkModes(fs *flag.FlagSet, scheme string, isPG bool) error {
	switch {
	case o.mode != "poll" && o.mode != "cdc":
		return usageErr("--mode %q: want poll or cdc", o.mode)
	case o.mode == "cdc" && !isPG:
		return usageErr("--mode cdc needs PostgreSQL (--db postgres://...)")
	case o.leaderDSN != "" && !isPG:
		return usageErr("--leader-db needs PostgreSQL (--db postgres://...)")
	case o.group && (o.mode != "poll" || !isPG):
		return usageErr("--group needs PostgreSQL in poll mode")
	case o.bo.kafkaTransactionalID == "" && flagSet(fs, "kafka-progress-topic"):
		return usageErr("--kafka-progress-topic goes with --kafka-transactional-id")
	case o.bo.kafkaTransactionalID == "":
	case scheme != "kafka" && scheme != "kafkas":
		return usageErr("--kafka-transactional-id goes with a kafka:// broker")
	case o.mode == "cdc" && o.completion != string(outboxdriver.CompleteMark):
		// A row the stream sends again is skipped when it is marked; deleted or
		// archived, it could not be told from a row never published.
		return usageErr("--kafka-transactional-id with --mode cdc needs --completion mark")
	}
	return nil
}

// tablePatterns checks --tables and its companions and returns its patterns (nil
// with --table).
func (o *relayFlags) tablePatterns(fs *flag.FlagSet, isPG bool) ([]outboxdriver.TablePattern, error) {
	if !flagSet(fs, "tables") {
		if flagSet(fs, "max-conns") || flagSet(fs, "tables-rescan") || flagSet(fs, "park-after") || flagSet(fs, "max-spilled") {
			return nil, usageErr("--max-conns, --tables-rescan, --park-after and --max-spilled go with --tables")
		}
		return nil, nil
	}
	switch {
	case flagSet(fs, "table"):
		return nil, usageErr("--table and --tables: give one of them")
	case !isPG:
		return nil, usageErr("relay --tables needs PostgreSQL (--db postgres://...); on MySQL and SQLite, run a relay per table (--table)")
	case flagSet(fs, "max-conns") && o.maxConns < 3:
		return nil, usageErr("--max-conns %d: want at least 3 (the leadership session, the wake-up session and one for claims)", o.maxConns)
	case o.tablesRescan < time.Second:
		return nil, usageErr("--tables-rescan %v: want at least 1s", o.tablesRescan)
	case flagSet(fs, "park-after") && o.mode != "cdc":
		return nil, usageErr("--park-after goes with --mode cdc")
	case flagSet(fs, "max-spilled") && o.mode != "cdc":
		return nil, usageErr("--max-spilled goes with --mode cdc")
	case o.maxSpilled < 0:
		return nil, usageErr("--max-spilled %d: want a count, or 0 for none", o.maxSpilled)
	}
	tables, err := outboxdriver.ParseTablePatterns(o.tablesList)
	if err != nil {
		return nil, usageErr("--tables: %v", err)
	}
	if !flagSet(fs, "poll-interval") {
		// Each table's relay wakes on its writers' notifications (one session
		// listens for all) and when one statement a second finds its table has
		// work; its own poll is only a last backstop, rare so that idle tables
		// cost little.
		o.poll = tablesPollIntervalDefault
	}
	return tables, nil
}

// checkBounds checks the sizes, counts and durations. On the command line 0 turns
// off what can be off (a bound, a timer, cleanup), is refused where nothing can be
// off, and never means a default: a flag's default is the one --help shows
// (docs/layout.md, "Zero on the command line").
func (o *relayFlags) checkBounds(fs *flag.FlagSet) error {
	for _, c := range []struct {
		name string
		n    int
	}{{"batch-size", o.batch}, {"max-pending", o.cdcCfg.MaxPending}} {
		if c.n < 1 {
			return usageErr("--%s %d: want at least 1", c.name, c.n)
		}
	}
	for _, c := range []struct {
		name string
		d    time.Duration
	}{{"leader-timeout", o.leaderTimeout}, {"poll-interval", o.poll}, {"retry-min", o.retryMin}, {"retry-max", o.retryMax},
		{"partition-lease", o.partitionLease}, {"lease-ttl", o.leaseTTL}} {
		if c.d <= 0 {
			return usageErr("--%s %v: want a duration above 0", c.name, c.d)
		}
	}
	switch {
	case o.batchBytes < -1: // -1: no bound, as 0 (the earlier spelling)
		return usageErr("--max-batch-bytes %d: want a size, or 0 for no bound", o.batchBytes)
	case o.cdcCfg.MaxPendingBytes < -1:
		return usageErr("--max-pending-bytes %d: want a size, or 0 for no bound", o.cdcCfg.MaxPendingBytes)
	case o.uiToken != "" && len(o.uiToken) < dashboard.MinTokenLength:
		return usageErr("--ui-token: %d characters, want at least %d (a random one: openssl rand -hex 16)", len(o.uiToken), dashboard.MinTokenLength)
	case o.straggler < 0:
		return usageErr("--straggler-after %v: want a duration, or 0 to wait for every answer", o.straggler)
	case o.retention < 0:
		return usageErr("--retention %v: want a duration, or 0 to keep published rows", o.retention)
	case o.maxAttempts < 1:
		return usageErr("--max-attempts %d: want at least 1 (1: the first refusal moves an event to the dead letters)", o.maxAttempts)
	}
	return o.bo.check(fs)
}

// wireFormat reads --format and its companions, and builds --table's router: built
// here to refuse bad options before connecting; each table of --tables gets its
// own when it is known (buildRelay, tableRelays).
func (o *relayFlags) wireFormat(scheme string, table outboxdriver.Table, routerOpts map[string]string, logger *slog.Logger) (wireFormat, relay.Router, error) {
	switch {
	case o.format != "outbox" && o.format != "cloudevents":
		return wireFormat{}, nil, usageErr("--format %q: want outbox or cloudevents", o.format)
	case o.format == "cloudevents" && len(routerOpts) > 0:
		return wireFormat{}, nil, usageErr("--format cloudevents and the Debezium router options of --config %s: choose one wire format", o.configPath)
	}
	var tmpl *broker.Template
	if o.format == "cloudevents" {
		var err error
		if tmpl, err = broker.ParseTemplate(o.topic); err != nil {
			return wireFormat{}, nil, usageErr("--topic-template: %v", err)
		}
	}
	wire := newWireFormat(o.format, o.ceMode, o.ceSource, scheme, tmpl, routerOpts)
	router, err := wire.router(table, nil)
	if err != nil {
		if len(routerOpts) > 0 {
			return wireFormat{}, nil, usageErr("--config %s: %v", o.configPath, err)
		}
		return wireFormat{}, nil, usageErr("%v", err)
	}
	if d, ok := router.(*debezium.Router); ok && len(d.Ignored()) > 0 {
		logger.Info("relay: connector settings with no effect here", "keys", strings.Join(d.Ignored(), ","))
	}
	return wire, router, nil
}

// relayConfig is the library's configuration the flags make (its router aside).
func (o *relayFlags) relayConfig(logger *slog.Logger) (*relay.Config, error) {
	cfg := &relay.Config{
		BatchSize:           o.batch,
		MaxBatchBytes:       zeroIsOff(o.batchBytes),
		LeaderTimeout:       o.leaderTimeout,
		PollInterval:        o.poll,
		Completion:          outboxdriver.Completion(o.completion),
		MaxAttempts:         o.maxAttempts,
		RetryMin:            o.retryMin,
		RetryMax:            o.retryMax,
		FlowPastDeadLetters: o.flowPast,
		Retention:           zeroIsOff(o.retention),
		StragglerAfter:      zeroIsOff(o.straggler),
		TopicTemplate:       o.topic,
		Logger:              logger,
	}
	if o.group {
		cfg.Group = &relay.GroupConfig{RelayID: o.relayID, LeaseTTL: o.partitionLease}
	}
	if o.del {
		if c := outboxdriver.Completion(o.completion); c != outboxdriver.CompleteMark && c != outboxdriver.CompleteDelete {
			return nil, usageErr("--delete and --completion %s contradict each other", c)
		}
		cfg.Completion = outboxdriver.CompleteDelete
	}
	return cfg, nil
}

// register declares the flags.
func (o *relayFlags) register(fs *flag.FlagSet) {
	o.dsn, o.tableName = dbTableFlags(fs, dbFlagHelp)
	fs.StringVar(&o.leaderDSN, "leader-db", "", "PostgreSQL: a direct URL for the leadership lock, LISTEN and CDC when --db goes through a transaction-pooling proxy (PgBouncer); claims still go through --db")
	fs.StringVar(&o.brokerURL, "broker", "", "broker URL: "+brokerSchemes)
	fs.StringVar(&o.mode, "mode", "poll", "poll (claim rows with FOR UPDATE SKIP LOCKED) or cdc (PostgreSQL: read the events from the WAL by logical replication)")
	fs.BoolVar(&o.allowNewer, "allow-newer-schema", false, "start on a table a newer version migrated (a rollback: migrations only add, so an older relay runs on it; docs/upgrading.md)")
	fs.StringVar(&o.cdcCfg.Slot, "slot", "", "cdc: the replication slot (default outbox_<schema>_<table>; with --tables "+pgcdc.SharedSlotDefault+", one for every table)")
	fs.StringVar(&o.cdcCfg.Publication, "publication", "", "cdc: the publication (default: the slot's name)")
	fs.BoolVar(&o.cdcCfg.RecreateSlot, "recreate-slot", false, "cdc: replace a lost slot and publish every unpublished row still in the table again (docs/cdc.md)")
	fs.IntVar(&o.cdcCfg.MaxPending, "max-pending", pgcdc.MaxPendingDefault, "cdc: most events read from the WAL and not yet acknowledged (bounds memory)")
	fs.IntVar(&o.cdcCfg.MaxPendingBytes, "max-pending-bytes", pgcdc.MaxPendingBytesDefault, "cdc: most payload bytes of those events, past the first 100 (0: no bound)")
	fs.IntVar(&o.maxSpilled, "max-spilled", pgcdc.MaxSpilledDefault, "cdc with --tables: once --max-pending events wait, read on up to this many more rows-mode events without their payloads (their relays read them from the table), so one table's large transaction does not hold back the others' later events (0: none)")
	fs.DurationVar(&o.parkAfter, "park-after", pgcdc.ParkAfterDefault, "cdc with --tables: park a table that holds the shared stream's room this long without getting an event done (its relay cannot lead, its broker refuses), so the others read on; it is read again once caught up (0: never)")
	fs.IntVar(&o.batch, "batch-size", relay.BatchSizeDefault, "most events claimed and published at once")
	fs.DurationVar(&o.leaderTimeout, "leader-timeout", relay.LeaderTimeoutDefault, "how long the database keeps the leadership of an active relay that stopped proving it is alive (paused, cut off); a standby takes over after it")
	fs.IntVar(&o.batchBytes, "max-batch-bytes", relay.BatchBytesDefault, "most payload bytes claimed at once (a larger event still goes, alone; 0: no bound)")
	fs.DurationVar(&o.poll, "poll-interval", relay.PollIntervalDefault, "how often to look for events when no notification arrives")
	fs.StringVar(&o.completion, "completion", string(outboxdriver.CompleteMark), "what becomes of a published row: mark (stamp published_at; cleanup deletes it after --retention), delete, or archive (move it to <table>_published in the same statement; PostgreSQL)")
	fs.BoolVar(&o.del, "delete", false, "same as --completion delete")
	fs.IntVar(&o.maxAttempts, "max-attempts", relay.MaxAttemptsDefault, "refusals before an event moves to the dead letters (a permanent refusal moves it at once)")
	fs.DurationVar(&o.retryMin, "retry-min", relay.RetryMinDefault, "first wait before retrying a refused event (doubling, with jitter)")
	fs.DurationVar(&o.retryMax, "retry-max", relay.RetryMaxDefault, "longest wait between attempts of a refused event")
	fs.DurationVar(&o.straggler, "straggler-after", relay.StragglerAfterDefault, "once a batch's answers stop coming this long while some aggregates' are still out (a slow receiver), write back the rest and let those aggregates wait alone (0: wait for every answer)")
	fs.DurationVar(&o.retention, "retention", relay.RetentionDefault, "delete published rows older than this (0: keep them)")
	fs.BoolVar(&o.flowPast, "flow-past-dead-letters", false, "let later events of a dead letter's aggregate go on (default: they wait for a replay or purge)")
	fs.StringVar(&o.topic, "topic-template", "", "topic template (default outbox.event.${aggregatetype}; outbox/event/${aggregatetype} for MQTT)")
	fs.StringVar(&o.format, "format", "outbox", "wire format: outbox (the event as its payload, with outbox's headers) or cloudevents (CloudEvents 1.0 in the broker's binding; docs/cloudevents.md)")
	fs.StringVar(&o.ceMode, "cloudevents-mode", string(cloudevents.Binary), "with --format cloudevents: binary (attributes as headers, the payload as the body) or structured (the whole event as JSON)")
	fs.StringVar(&o.ceSource, "cloudevents-source", "", "with --format cloudevents: the source attribute (default /outbox/<schema>.<table>)")
	o.bo = brokerFlags(fs)
	fs.StringVar(&o.bo.kafkaTransactionalID, "kafka-transactional-id", "", "Kafka, exactly-once: publish each batch in a Kafka transaction under this transactional.id, one per table (with --tables, a prefix: ID.schema.table; with --group, one per partition: ID.p<N>), with the relay's progress (poll or cdc mode; docs/kafka.md)")
	fs.StringVar(&o.bo.kafkaProgressTopic, "kafka-progress-topic", kafka.ProgressTopicDefault, "with --kafka-transactional-id: the compacted topic of the relay's progress records (created if absent)")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", outboxsqlite.LeaseTTLDefault, "SQLite only: how long leadership lasts unrenewed; a standby takes over this long after the active relay dies")
	fs.BoolVar(&o.group, "group", false, "PostgreSQL, poll mode: run as one of several active relays, each owning some of the table's partitions (every relay of the table needs it)")
	fs.StringVar(&o.relayID, "relay-id", "", "with --group: this relay's name in the group (default host-pid-random)")
	fs.DurationVar(&o.partitionLease, "partition-lease", relay.LeaseTTLDefault, "with --group: how long a partition lease lasts unrenewed (a dead or paused relay's partitions move this long after its last renewal)")
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:9464", "address for /metrics, /healthz, /readyz and the dashboard at /ui/ (empty: none); loopback unless you say otherwise")
	fs.BoolVar(&o.ui, "ui", true, "serve the dashboard at /ui/ on --http")
	fs.Var(&o.uiHosts, "ui-host", "a host name the dashboard answers to besides localhost and IP addresses (repeatable; the name your proxy or browser uses)")
	fs.StringVar(&o.uiToken, "ui-token", "", "dashboard: the admin token that allows replay and purge (empty: read-only); prefer OUTBOX_UI_TOKEN_FILE")
	fs.StringVar(&o.configPath, "config", "", "a YAML (.yaml) or properties file of flag values and Debezium Outbox Event Router options; flags and OUTBOX_* variables win over it")
	fs.StringVar(&o.tablesList, "tables", "", tablesFlagHelp+"; one process relays each, on one pool and one leadership session, with one wake-up session (poll) or one replication slot and publication for all (cdc; --slot default "+pgcdc.SharedSlotDefault+")")
	fs.String("trust-owner", "", trustOwnerHelp)
	fs.DurationVar(&o.tablesRescan, "tables-rescan", 30*time.Second, "with --tables: how often to look for tables created or dropped")
	fs.IntVar(&o.maxConns, "max-conns", 0, "with --tables: the most database connections the relay opens, whatever the number of tables, at least 3 (default: 8, or the URL's pool_max_conns)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
}

// zeroIsOff maps a flag's 0 (off: no bound, keep rows, wait for every answer, never
// park) to the library's "off", a negative value (its zero is the default: a zero
// Config works).
func zeroIsOff[T int | time.Duration](v T) T {
	if v == 0 {
		return -1
	}
	return v
}
