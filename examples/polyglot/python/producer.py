"""A Python service writing outbox events by plain SQL with psycopg2 (Debian's
python3-psycopg2), in the same transaction as its own writes. Two ways:

  rows     INSERT the five Debezium columns into the outbox table (poll or CDC relay)
  message  pg_logical_emit_message in the table-less format of docs/cdc.md (CDC relay)

  python3 producer.py postgres://postgres@127.0.0.1:5432/test public.outbox rows 20
"""
import json
import sys
import uuid

import psycopg2
from psycopg2 import sql


def main():
    dsn, table, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    schema, name = table.split(".")
    conn = psycopg2.connect(dsn)
    try:
        for i in range(n):
            event = {"id": str(uuid.uuid4()), "aggregatetype": "order",
                     "aggregateid": "python-%d" % (i % 3), "type": "OrderPlaced"}
            payload = json.dumps({"producer": "python", "n": i})
            with conn:  # one transaction, committed when the block ends
                with conn.cursor() as cur:
                    # ... the service's own writes go here ...
                    if mode == "rows":
                        cur.execute(sql.SQL("INSERT INTO {} (id, aggregatetype, aggregateid, type, payload)"
                                            " VALUES (%s, %s, %s, %s, %s)").format(sql.Identifier(schema, name)),
                                    (event["id"], event["aggregatetype"], event["aggregateid"], event["type"], payload))
                    else:
                        # The table-less format: a one-line JSON object, a newline, the
                        # payload. Its order number comes from the table's sequence, as
                        # a row's does (outbox-seq stays comparable across write modes).
                        cur.execute("SELECT nextval(pg_get_serial_sequence(%s, 'seq'))", (table,))
                        event["seq"] = cur.fetchone()[0]
                        content = (json.dumps(event) + "\n").encode() + payload.encode()
                        cur.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                                    (table, psycopg2.Binary(content)))
    finally:
        conn.close()


if __name__ == "__main__":
    main()
