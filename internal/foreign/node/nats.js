// Reads n messages from a JetStream stream with nats.js (an ordered consumer from the
// start) and prints one JSON line per message: the key (Outbox-Key), the headers, the
// payload.
const { connect, StringCodec } = require('nats')

const [server, stream, n] = process.argv.slice(2)
const sc = StringCodec()

async function main () {
  const nc = await connect({ servers: server })
  const js = nc.jetstream()
  const consumer = await js.consumers.get(stream)
  const messages = await consumer.fetch({ max_messages: Number(n), expires: 30000 })
  let seen = 0
  for await (const m of messages) {
    const headers = {}
    for (const [k, v] of m.headers) headers[k] = v.join(',')
    process.stdout.write(JSON.stringify({ key: m.headers.get('Outbox-Key'), headers, value: sc.decode(m.data) }) + '\n')
    if (++seen >= Number(n)) break
  }
  await nc.close()
}

main().catch(e => { console.error(String(e && e.stack || e)); process.exit(1) })
