// Binds an exclusive queue to a topic exchange for a routing-key pattern, says
// "ready", then prints n messages as JSON lines: the key (outbox-key header), the
// headers (message_id as id, type as eventType), the body.
const amqp = require('amqplib')

const [url, exchange, pattern, n] = process.argv.slice(2)

async function main () {
  const conn = await amqp.connect(url)
  const ch = await conn.createChannel()
  const q = await ch.assertQueue('', { exclusive: true })
  await ch.bindQueue(q.queue, exchange, pattern)
  process.stderr.write('ready\n')
  let seen = 0
  await new Promise(resolve => {
    ch.consume(q.queue, m => {
      const headers = {}
      for (const [k, v] of Object.entries(m.properties.headers || {})) headers[k] = String(v)
      headers.id = headers.id || m.properties.messageId
      headers.eventType = headers.eventType || m.properties.type
      process.stdout.write(JSON.stringify({ key: headers['outbox-key'], headers, value: m.content.toString() }) + '\n')
      ch.ack(m)
      if (++seen >= Number(n)) resolve()
    })
  })
  await conn.close()
}

main().catch(e => { console.error(String(e && e.stack || e)); process.exit(1) })
