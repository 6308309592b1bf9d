// Subscribes (QoS 1) to a topic filter with MQTT.js, says "ready", then prints n
// messages as JSON lines: the key (outbox-key user property), the user properties,
// the payload.
const mqtt = require('mqtt')

const [url, filter, n] = process.argv.slice(2)
const client = mqtt.connect(url, { protocolVersion: 5, clean: true })
let seen = 0
client.on('connect', () => {
  client.subscribe(filter, { qos: 1 }, err => {
    if (err) { console.error(String(err)); process.exit(1) }
    process.stderr.write('ready\n')
  })
})
client.on('message', (topic, payload, packet) => {
  const headers = {}
  for (const [k, v] of Object.entries((packet.properties && packet.properties.userProperties) || {})) headers[k] = Array.isArray(v) ? v.join(',') : String(v)
  process.stdout.write(JSON.stringify({ key: headers['outbox-key'], headers, value: payload.toString() }) + '\n')
  // stdout is written synchronously to a pipe on Linux: every line is out.
  if (++seen >= Number(n)) process.exit(0)
})
client.on('error', e => { console.error(String(e)); process.exit(1) })
