// A Node.js service writing outbox events by plain SQL with the pg package: only the
// five Debezium columns, in the same transaction as its own writes. `outbox relay`
// publishes them like events of the Go writer.
//
//   node producer.js postgres://postgres@127.0.0.1:5432/test public.outbox 20
'use strict';
const crypto = require('crypto');
const { Client } = require('pg');

async function main() {
  const [dsn, table, n] = process.argv.slice(2);
  const [schema, name] = table.split('.');
  const quoted = `"${schema.replace(/"/g, '""')}"."${name.replace(/"/g, '""')}"`;
  const client = new Client({ connectionString: dsn });
  await client.connect();
  try {
    for (let i = 0; i < Number(n); i++) {
      await client.query('BEGIN');
      // ... the service's own writes go here, in the same transaction ...
      await client.query(
        `INSERT INTO ${quoted} (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`,
        [crypto.randomUUID(), 'order', `node-${i % 3}`, 'OrderPlaced', JSON.stringify({ producer: 'node', n: i })],
      );
      await client.query('COMMIT');
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error('producer:', err.message);
  process.exit(1);
});
