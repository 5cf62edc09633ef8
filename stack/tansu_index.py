#!/usr/bin/env python3
"""tansu_index.py DB — adds the index that tansu 0.6's sqlite schema lacks.

tansu reads the headers of every record it fetches with a join on
header(topition, offset_id), a table without an index: each record fetched
scans every header the broker holds. Once a dead-letter topic (whose records
carry headers) holds a few thousand records, one fetch takes seconds, the
broker's single storage task falls behind, offset commits and group requests
time out, sessions expire and partitions move for ever. With the index the
lookup is one seek.

Run after tansu has created its schema; idempotent, and safe while tansu runs.
"""
import sqlite3
import sys
import time

db = sys.argv[1]
deadline = time.monotonic() + 30
while True:
    try:
        with sqlite3.connect(db, timeout=30) as c:
            c.execute("create index if not exists header_topition_offset_id"
                      " on header (topition, offset_id)")
        break
    except sqlite3.OperationalError as e:  # the schema is not there yet
        if time.monotonic() > deadline:
            sys.exit(f"tansu_index.py: {db}: {e}")
        time.sleep(0.2)
