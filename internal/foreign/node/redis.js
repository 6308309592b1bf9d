// Reads n entries of a Redis stream with ioredis (XRANGE from the start) and prints
// one JSON line per entry: the key field, the headers (the headers field's JSON, and
// id, type), the payload field.
const Redis = require('ioredis')

const [url, stream, n] = process.argv.slice(2)

async function main () {
  const r = new Redis(url)
  const deadline = Date.now() + 30000
  let entries = []
  while (entries.length < Number(n) && Date.now() < deadline) {
    entries = await r.xrange(stream, '-', '+')
    if (entries.length < Number(n)) await new Promise(resolve => setTimeout(resolve, 50))
  }
  for (const [, fields] of entries) {
    const f = {}
    for (let i = 0; i < fields.length; i += 2) f[fields[i]] = fields[i + 1]
    const headers = JSON.parse(f.headers || '{}')
    headers.id = f.id
    headers.eventType = headers.eventType || f.type
    process.stdout.write(JSON.stringify({ key: f.key, headers, value: f.payload }) + '\n')
  }
  r.disconnect()
}

main().catch(e => { console.error(String(e && e.stack || e)); process.exit(1) })
