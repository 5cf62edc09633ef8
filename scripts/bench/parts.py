#!/usr/bin/env python3
"""parts.py — what `make bench-parts` runs: how many INSERTs `sluice run` makes, and how big, as
the number of Kafka partitions grows at a steady input rate.

Data flow, for each partition count N in BENCH_PARTITIONS:
  a fresh topic of N partitions and a fresh plain MergeTree table (id, sent_ms, ingested DEFAULT
  now64(3), the three metadata columns; no dedup window)
    -> `sluice run --config` (exactly-once, defaults otherwise, fence_wait = 0s: a fresh group;
       /metrics on a free port of 127.0.0.1), waited for until /ready answers 200
    -> JSON records {"id": i, "sent_ms": <now ms>} produced at BENCH_RATE a second, record i to
       partition i % N, for BENCH_WARMUP + BENCH_SECS + 3 s
    -> /metrics scraped at WARMUP and at WARMUP + SECS: the differences of
       sluice_insert_duration_seconds_count and sluice_rows_inserted_total give inserts/s and
       rows/insert in the steady window
    -> once count() == sent (BENCH_CATCHUP s at most, 400): SIGTERM; count() = uniqExact(id) = sent or the run fails; latency
       record -> stored = ingested - sent_ms (p50, p99) over the rows sent in the steady window
    -> topic and table dropped.
  -> a Markdown table on stdout, docs/bench-parts.md and docs/bench-parts.json (a `## Notes`
     section already in the .md is kept).
Run with the clients' venv (SLUICE_CLIENTS_PYTHON). Env: BENCH_PARTITIONS ("8 64 256"),
BENCH_RATE (2000 records/s), BENCH_SECS (60), BENCH_WARMUP (20), BENCH_BIN (dir holding `sluice`,
default target/release), BENCH_OUT (docs), KAFKA_BROKERS, CLICKHOUSE_URL. Every process it starts
is killed on exit (also on Ctrl-C and errors). Exit status 1 when a case did not land exactly.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as bench  # noqa: E402  (ch, spawn + kill-at-exit, proc_stat)

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

PARTITIONS = [int(n) for n in os.environ.get("BENCH_PARTITIONS", "8 64 256").split()]
RATE = int(os.environ.get("BENCH_RATE", "2000"))
SECS = float(os.environ.get("BENCH_SECS", "60"))
WARMUP = float(os.environ.get("BENCH_WARMUP", "20"))
TAIL = 3.0                                   # seconds produced after the window
CATCH_UP = float(os.environ.get("BENCH_CATCHUP", "400"))   # at most, for every row to land after
BIN = bench.BIN = os.environ.get("BENCH_BIN", os.path.join(bench.REPO, "target", "release"))
OUT = os.environ.get("BENCH_OUT", os.path.join(bench.REPO, "docs"))
RUN = bench.RUN
WORK = f"/tmp/sluice-bench-parts-{RUN}"      # configs and logs of this run
ch = bench.ch


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError as e:     # an HTTP error status, or not listening yet
        return getattr(e, "code", 0), ""


def scrape(port):
    """The sink's /metrics as {name: value summed over labels}, and when it was read."""
    status, text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return time.time(), out


def start_sink(n, topic, table, port):
    group = f"bench-parts-{n}-{RUN}"
    cfg = f"{WORK}/{group}.toml"
    with open(cfg, "w") as f:
        f.write(f"""[kafka]
group_id = "{group}"
[sink]
delivery = "exactly-once"
fence_wait = "0s"   # a fresh group: no previous owner whose inserts could still land
[metrics]
listen = "127.0.0.1:{port}"
[[route]]
topic = "{topic}"
table = "{table}"
""")
    log = open(f"{WORK}/sluice-{n}.log", "w")
    # The stack's SLUICE_* variables (ports, state dir) are not sluice settings: keep them out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    p = bench.spawn([f"{BIN}/sluice", "run", "--config", cfg], log, env=dict(env, RUST_LOG="info"))
    deadline = time.time() + 90
    while http_get(f"http://127.0.0.1:{port}/ready")[0] != 200:
        if p.poll() is not None:
            raise RuntimeError(f"sluice exited with status {p.returncode}; see {log.name}")
        if time.time() > deadline:
            raise RuntimeError(f"sluice not ready after 90 s; see {log.name}")
        time.sleep(0.2)
    return p, log.name


def produce(topic, n, port):
    """Produces at RATE a second for WARMUP + SECS + TAIL s; scrapes /metrics at WARMUP and
    WARMUP + SECS in threads of their own so the pace does not stall. Returns (records sent,
    start time, the two scrapes)."""
    p = Producer({"bootstrap.servers": bench.BROKERS, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5})
    errors, scrapes = [], []
    t0 = time.time()
    timers = [threading.Timer(m, lambda: scrapes.append(scrape(port))) for m in (WARMUP, WARMUP + SECS)]
    [t.start() for t in timers]
    sent, end = 0, t0 + WARMUP + SECS + TAIL
    while (now := time.time()) < end:
        while sent < int((now - t0) * RATE):
            v = json.dumps({"id": sent, "sent_ms": int(time.time() * 1000)}).encode()
            p.produce(topic, v, partition=sent % n, on_delivery=lambda e, _m: e and errors.append(e))
            sent += 1
        p.poll(0)
        time.sleep(0.002)
    if p.flush(60) != 0 or errors:
        raise RuntimeError(f"producer: {len(errors)} failed, first {errors[:1]}")
    [t.join() for t in timers]
    if len(scrapes) != 2:
        raise RuntimeError("could not read the sink's /metrics at both ends of the window")
    return sent, t0, sorted(scrapes, key=lambda s: s[0])


def case(n):
    topic, table = f"bench_parts_{n}_{RUN}", f"bench.parts_{n}_{RUN}"
    with socket.socket() as s:       # a free port for the sink's /metrics
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    admin = AdminClient({"bootstrap.servers": bench.BROKERS})
    for f in admin.create_topics([NewTopic(topic, n, 1)]).values():
        f.result()
    # A sink subscribing before the broker serves the topic's metadata can wait for librdkafka's
    # next metadata refresh (up to 5 min) with /ready at 200: wait for every partition's leader.
    deadline = time.time() + 60
    while len([p for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
               if p.leader >= 0 and p.error is None]) < n:
        if time.time() > deadline:
            raise RuntimeError(f"{topic}: not every partition has a leader after 60 s")
        time.sleep(0.5)
    ch("CREATE DATABASE IF NOT EXISTS bench")
    ch(f"""CREATE TABLE {table} (id UInt64, sent_ms Int64, ingested DateTime64(3) DEFAULT now64(3),
  _topic LowCardinality(String), _partition UInt32, _offset UInt64)
ENGINE = MergeTree ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 0""")
    sink = None
    try:
        sink, log = start_sink(n, topic, table, port)
        sent, t0, scrapes = produce(topic, n, port)
        (ta, a), (tb, b) = scrapes
        t_end = time.time()
        while int(ch(f"SELECT count() FROM {table}")) < sent and sink.poll() is None \
                and time.time() - t_end < CATCH_UP:
            time.sleep(0.2)
        catch_up = time.time() - t_end
        cpu = (bench.proc_stat(sink.pid) or (0,))[0]
        sink.terminate()
        try:
            status = sink.wait(30)
        except subprocess.TimeoutExpired:
            sink.kill()
            status = f"killed after 30 s: {sink.wait()}"
        d = {k: b.get(k, 0) - a.get(k, 0) for k in b}
        inserts = d.get("sluice_insert_duration_seconds_count", 0)   # absent: no insert yet
        rows = d.get("sluice_rows_inserted_total", 0)
        lo, hi = int((t0 + WARMUP) * 1000), int((t0 + WARMUP + SECS) * 1000)
        count, distinct, q = ch(f"""SELECT count(), uniqExact(id),
  (SELECT quantiles(0.5, 0.99)(toUnixTimestamp64Milli(ingested) - sent_ms) FROM {table}
   WHERE sent_ms BETWEEN {lo} AND {hi}) FROM {table} FORMAT TSV""").split("\t")
        p50, p99 = json.loads(q.replace("nan", "NaN"))
        r = {"partitions": n, "inserts_per_s": round(inserts / (tb - ta), 2),
             "rows_per_insert": round(rows / inserts, 1) if inserts else None,
             "latency_p50_ms": p50 == p50 and round(p50), "latency_p99_ms": p99 == p99 and round(p99), "rows_sent": sent,
             "rows_stored": int(count), "distinct_ids": int(distinct),
             "window_s": round(tb - ta, 2), "inserts": int(inserts), "rows_inserted": int(rows),
             "mean_insert_ms": round(d["sluice_insert_duration_seconds_sum"] / inserts * 1000, 1)
             if inserts else None,
             "retries": d.get("sluice_insert_retries_total", 0),
             "reconciliations": d.get("sluice_reconciliations_total", 0),
             "in_flight_mb_end": round(b.get("sluice_in_flight_bytes", 0) / 1e6, 1),
             "sink_cpu_s_total": cpu, "catch_up_s": round(catch_up, 2),
             "load_1m_end": round(os.getloadavg()[0], 2), "sink_exit": status, "log": log}
        r["ok"] = r["rows_stored"] == r["distinct_ids"] == sent and status == 0
        return r
    finally:
        if sink is not None and sink.poll() is None:
            sink.kill()
            sink.wait()
        for f in admin.delete_topics([topic]).values():
            f.exception()            # waits; a topic left behind is no failure of the run
        ch(f"DROP TABLE IF EXISTS {table}")


MAIN = [("partitions", "partitions"), ("inserts/s", "inserts_per_s"), ("rows/insert", "rows_per_insert"),
        ("latency p50 ms", "latency_p50_ms"), ("latency p99 ms", "latency_p99_ms"),
        ("rows sent", "rows_sent"), ("rows stored", "rows_stored")]
SIDE = [("partitions", "partitions"), ("mean insert ms", "mean_insert_ms"), ("retries", "retries"),
        ("reconciliations", "reconciliations"), ("in flight MB at window end", "in_flight_mb_end"),
        ("sink CPU s", "sink_cpu_s_total"), ("catch-up s", "catch_up_s"), ("load 1m", "load_1m_end")]


def table_md(results, cols):
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + " ---: |" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(str(r[k]) for _, k in cols) + " |" for r in results])


def write_doc(res):
    path, m = os.path.join(OUT, "bench-parts.md"), res["machine"]
    old = open(path).read() if os.path.exists(path) else ""
    notes = "\n## Notes" + old.split("\n## Notes", 1)[1] if "\n## Notes" in old else ""
    text = f"""# Inserts per partition count (`make bench-parts`)

How many INSERTs `sluice run` (exactly-once, every other setting at its default: max_batch_age 1 s,
max_concurrent_inserts 4) makes, and how many rows each carries, as the topic's partition count
grows while the input stays at {RATE:,} JSON records a second, round-robin over every partition.
How: a fresh topic and plain MergeTree table per partition count; {WARMUP:.0f} s of warm-up, then
the sink's `/metrics` read at both ends of a {SECS:.0f} s steady window
(`sluice_insert_duration_seconds_count`, `sluice_rows_inserted_total`). Latency is `ingested` (the
INSERT's `now64(3)`, so the time the INSERT started) minus the record's `sent_ms`, over the records
sent in the window. Every id is checked to be stored exactly once.

Run {res['started']} on {m['nproc']} cores ({m['cpu_model']}) shared with the broker and ClickHouse
(chDB), {m['sluice']}, commit {m['git_commit']}: `make bench-parts` (BENCH_PARTITIONS="{' '.join(map(str, PARTITIONS))}"
BENCH_RATE={RATE} BENCH_SECS={SECS:.0f} BENCH_WARMUP={WARMUP:.0f}); every figure in [bench-parts.json](bench-parts.json).

{table_md(res['cases'], MAIN)}

Beside it: the mean insert duration, insert retries and reconciliations in the window, the bytes in
batches being built or inserted at the window's end, the sink's CPU seconds over its whole run, how
long the table took to hold every row once the producer stopped, the 1-minute load at the end:

{table_md(res['cases'], SIDE)}
"""
    with open(path, "w") as f:
        f.write(text + notes)
    with open(os.path.join(OUT, "bench-parts.json"), "w") as f:
        json.dump(res, f, indent=1)
    return path


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    ver = lambda *a: subprocess.run(a, capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "sluice": ver(f"{BIN}/sluice", "--version"),
            "git_commit": ver("git", "-C", bench.REPO, "rev-parse", "--short", "HEAD"),
            "clickhouse": ch("SELECT version()") + " (chDB behind stack/chdb_server.py)",
            "load_1m_start": os.getloadavg()[0]}


def main():
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    res = {"run": RUN, "started": time.strftime("%Y-%m-%d %H:%M %z"), "machine": machine(),
           "config": {"partitions": PARTITIONS, "rate": RATE, "secs": SECS, "warmup": WARMUP},
           "cases": []}
    for n in PARTITIONS:
        print(f"== {n} partitions, {RATE}/s for {WARMUP:.0f}+{SECS:.0f}+{TAIL:.0f} s", flush=True)
        r = case(n)
        res["cases"].append(r)
        print("   " + json.dumps({k: v for k, v in r.items() if k != "log"}), flush=True)
        if not r["ok"]:
            print("!" * 72 + f"\n!! {n} partitions: VERIFICATION FAILED: sent {r['rows_sent']}, "
                  f"stored {r['rows_stored']}, distinct {r['distinct_ids']}, sink exit "
                  f"{r['sink_exit']}; see {r['log']}\n" + "!" * 72, file=sys.stderr, flush=True)
    res["finished"] = time.strftime("%Y-%m-%d %H:%M %z")
    print("\n" + table_md(res["cases"], MAIN))
    print(f"== wrote {write_doc(res)} (logs and configs in {WORK})")
    return 0 if all(r["ok"] for r in res["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
