#!/usr/bin/env python3
"""baseline.py — the "obvious" Kafka → ClickHouse sink a team writes in an afternoon.

Data flow: confluent-kafka consumer (subscribe, auto.offset.reset=earliest, no auto-commit)
  -> consume() up to 10k messages at a time, append `_topic/_partition/_offset` to each JSON
     object (a byte splice, as sluice does) into one JSONEachRow buffer
  -> when the buffer holds 100k rows or 16 MiB, or 1 s has passed: clickhouse-connect
     raw_insert(fmt=JSONEachRow, async_insert=0), then commit the consumed offsets (sync)
  -> runs until SIGTERM/SIGINT; in-flight data not yet inserted is simply dropped
     (at-least-once: a restart re-reads from the last commit).
One thread, one insert at a time: no pipelining, no retries beyond the clients' own.

Usage: baseline.py --topic T --table db.t --group G  (KAFKA_BROKERS, CLICKHOUSE_URL from env)
"""
import argparse
import os
import signal
import time
from urllib.parse import urlsplit

import clickhouse_connect
from confluent_kafka import Consumer

MAX_ROWS, MAX_BYTES, MAX_AGE = 100_000, 16 << 20, 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topic", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--group", required=True)
    a = ap.parse_args()
    url = urlsplit(os.environ.get("CLICKHOUSE_URL", "http://127.0.0.1:8123"))
    client = clickhouse_connect.get_client(host=url.hostname, port=url.port or 8123)
    consumer = Consumer({
        "bootstrap.servers": os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"),
        "group.id": a.group, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe([a.topic])
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    signal.signal(signal.SIGINT, lambda *_: running.__setitem__(0, False))

    rows, size, since = [], 0, time.time()
    while running[0]:
        for m in consumer.consume(10_000, timeout=0.2):
            if m.error():
                raise RuntimeError(m.error())
            v = m.value()
            rows.append(b'%s,"_topic":"%s","_partition":%d,"_offset":%d}\n' % (
                v[:v.rindex(b"}")], m.topic().encode(), m.partition(), m.offset()))
            size += len(rows[-1])
        if rows and (len(rows) >= MAX_ROWS or size >= MAX_BYTES or time.time() - since >= MAX_AGE):
            client.raw_insert(a.table, insert_block=b"".join(rows), fmt="JSONEachRow",
                              settings={"async_insert": 0})
            consumer.commit(asynchronous=False)   # everything consumed so far is in ClickHouse
            rows, size, since = [], 0, time.time()
        elif not rows:
            since = time.time()
    consumer.close()


if __name__ == "__main__":
    main()
