// Reads n records from a Kafka topic with kafkajs and no codec plugins (kafkajs
// throws on a Snappy batch without kafkajs-snappy), and prints one JSON line per
// record: key, the headers as strings, the value.
const { Kafka, logLevel } = require('kafkajs')

const [broker, topic, n] = process.argv.slice(2)
const kafka = new Kafka({ brokers: [broker], logLevel: logLevel.NOTHING })
const consumer = kafka.consumer({ groupId: 'foreign-' + Date.now() })

async function main () {
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  let seen = 0
  await new Promise((resolve, reject) => {
    consumer.run({
      eachMessage: async ({ message }) => {
        const headers = {}
        for (const [k, v] of Object.entries(message.headers || {})) headers[k] = v.toString()
        process.stdout.write(JSON.stringify({ key: message.key && message.key.toString(), headers, value: message.value && message.value.toString() }) + '\n')
        if (++seen >= Number(n)) resolve()
      }
    }).catch(reject)
    consumer.on(consumer.events.CRASH, e => reject(e.payload.error))
  })
  await consumer.disconnect()
}

main().catch(e => { console.error(String(e && e.stack || e)); process.exit(1) })
