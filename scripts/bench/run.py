#!/usr/bin/env python3
"""run.py — the `make bench` driver: one data set per record size, five ways to move it.

Data flow, for each record size (1 KB and 200 B JSON objects):
  generate N records in memory (deterministic, ~BENCH_MB MB of JSON)
    -> produce them once into a fresh topic (BENCH_PARTITIONS partitions, record i -> partition
       i % P, lz4, idempotent producer), check every partition's offsets run 0..n-1
    -> cases, one after another, each with its own consumer group / fresh table:
       raw_fetch   target/release/examples/raw_fetch reads the topic and discards it (Kafka limit)
       raw_insert  target/release/examples/raw_insert: the topic read, encoded and cut into batches by
                   sluice's own code before the clock, then inserted by sluice's own ClickHouse
                   service, 4 at a time (ClickHouse limit)
       sluice_eo   `sluice run`, delivery = exactly-once (fence_wait = 0s: the group is fresh)
       sluice_alo  `sluice run`, delivery = at-least-once
       baseline    scripts/bench/baseline.py (confluent-kafka + clickhouse-connect, commit after insert)
    -> while a process runs: /proc/<pid>/{stat,status} every 250 ms (CPU seconds, VmRSS, VmHWM),
       SELECT count() every 500 ms; the clock runs from process start until count() == produced;
       then the process is SIGTERMed and the table checked (count, uniqExact(_partition, _offset)).
  -> docs/bench/results.json (raw numbers, series, machine info); report.py renders README + SVGs.

Env: BENCH_MB (MB of JSON per record size, default 250: ~10 min on 2 cores), BENCH_SIZES ("1k,200b"),
BENCH_PARTITIONS (4), BENCH_MAX_BUFFERED_MB (128: the sink's max_buffered_bytes), BENCH_CASES (comma list, default all), BENCH_OUT (docs/bench),
BENCH_KAFKA_PROPERTIES ("k=v,…": librdkafka properties for sluice and raw_insert),
BENCH_BIN (dir holding private copies of sluice, raw_fetch and raw_insert), KAFKA_BROKERS, CLICKHOUSE_URL,
BENCH_KAFKA_KIND (what KAFKA_BROKERS is, for the report), BENCH_MOCK_FD / BENCH_MOCK_OUT (bench.sh).
Every process it starts is killed on exit (also on Ctrl-C and errors). Exit status 1 on any
verification failure.
"""
import atexit
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BROKERS = os.environ.get("KAFKA_BROKERS", "127.0.0.1:19092")
CH = os.environ.get("CLICKHOUSE_URL", "http://127.0.0.1:18123")
BIN = os.environ.get("BENCH_BIN", "/tmp/bench-bin")
MB = float(os.environ.get("BENCH_MB", "250"))
SIZES = os.environ.get("BENCH_SIZES", "1k,200b").split(",")
PARTS = int(os.environ.get("BENCH_PARTITIONS", "4"))
ALL_CASES = ["raw_fetch", "raw_insert", "sluice_eo", "sluice_alo", "baseline"]
CASES = os.environ.get("BENCH_CASES", ",".join(ALL_CASES)).split(",")
OUT = os.environ.get("BENCH_OUT", os.path.join(REPO, "docs", "bench"))
CASE_TIMEOUT = float(os.environ.get("BENCH_CASE_TIMEOUT", "600"))
KAFKA_PROPS = os.environ.get("BENCH_KAFKA_PROPERTIES", "")   # "k=v,k=v": extra librdkafka properties
RUN = time.strftime("%Y%m%d%H%M%S")
WORK = f"/tmp/sluice-bench-{RUN}"          # configs and logs of this run
# What sluice uses (crates/sluice/src/config defaults, the bench's config below).
BATCH_ROWS, BATCH_BYTES, CONCURRENCY = 100_000, 16 << 20, 4
MAX_BUFFERED = int(os.environ.get("BENCH_MAX_BUFFERED_MB", "128")) << 20
TICK = os.sysconf("SC_CLK_TCK")

CHILDREN = []          # every Popen we started; killed at exit


def cleanup(*_):
    for p in CHILDREN:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 5
    for p in CHILDREN:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


def on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


atexit.register(cleanup)
signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)


def spawn(args, log, **kw):
    p = subprocess.Popen(args, stdout=kw.pop("stdout", log), stderr=log, stdin=subprocess.DEVNULL, **kw)
    CHILDREN.append(p)
    return p


# ---------------------------------------------------------------- ClickHouse over HTTP

def ch(sql, body=None, settings=None, timeout=120):
    """Runs one statement; `body` (bytes) goes after `sql` as insert data."""
    params = {"query": sql} if body is not None else {}
    params.update(settings or {})
    url = CH + "/?" + urllib.parse.urlencode(params)
    data = body if body is not None else sql.encode()
    req = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode().strip()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"ClickHouse: {e.code} {e.read().decode()[:500]} (query: {sql[:200]})")


# ---------------------------------------------------------------- the data set

COUNTRIES = ["DE", "US", "FR", "GB", "IN", "BR", "JP", "NL", "PL", "ES", "IT", "SE"]
EVENTS = ["page_view", "click", "add_to_cart", "checkout", "purchase", "search", "scroll"]
DEVICES = ["mobile", "desktop", "tablet"]
WORDS = ("order shipment customer invoice payment refund warehouse delivery parcel tracking "
         "discount coupon review rating product category basket session checkout address "
         "express standard priority returned cancelled confirmed pending processed").split()
AGENTS = ["Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
          "Chrome/131.0.0.0 Safari/537.36",
          "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, "
          "like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
          "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"]
SMALL_COLS = """event_id UInt64, user_id UInt32, session_id String, event LowCardinality(String),
  path String, country LowCardinality(String), device LowCardinality(String),
  duration_ms UInt32, price Float64, ts DateTime64(3)"""
LARGE_COLS = SMALL_COLS + """, referrer String, user_agent String, ip String, tags Array(String),
  title String, message String, utm_source LowCardinality(String), utm_campaign String,
  lat Float64, lon Float64, items UInt16, revenue Float64, experiment String,
  variant LowCardinality(String)"""


def mix(i):  # a cheap deterministic pseudo-random 32-bit value per record
    return (i * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF


def small_fields(i, h):
    s = i % 86400
    return ('"event_id":%d,"user_id":%d,"session_id":"%016x","event":"%s","path":"/products/%d",'
            '"country":"%s","device":"%s","duration_ms":%d,"price":%d.%02d,'
            '"ts":"2026-11-30 %02d:%02d:%02d.%03d"' % (
                i, h % 1_000_000, h * 0x5851F42D, EVENTS[h % 7], h % 50_000, COUNTRIES[h % 12],
                DEVICES[h % 3], h % 60_000, h % 500, h % 100, s // 3600, s // 60 % 60, s % 60,
                h % 1000))


def record(size, i):
    """The JSON text of record `i` of the data set `size` ('1k' or '200b')."""
    h = mix(i) ^ mix(i >> 7)
    if size == "200b":
        return ("{" + small_fields(i, h) + "}").encode()
    n = 30 + h % 30     # words of free text: the message varies in length like real ones do
    msg = " ".join(WORDS[(h >> (k % 24)) % len(WORDS)] for k in range(n))
    tags = ",".join('"%s"' % WORDS[(h + 7 * k) % len(WORDS)] for k in range(1 + h % 5))
    return ("{" + small_fields(i, h) +
            ',"referrer":"https://www.example.com/search?q=%s+%s&page=%d","user_agent":"%s",'
            '"ip":"10.%d.%d.%d","tags":[%s],"title":"%s %s #%d","message":"%s",'
            '"utm_source":"%s","utm_campaign":"winter-sale-%d","lat":%d.%04d,"lon":%d.%04d,'
            '"items":%d,"revenue":%d.%02d,"experiment":"exp-%d","variant":"%s"}' % (
                WORDS[h % 27], WORDS[h % 26], h % 20, AGENTS[h % 3], h % 256, h >> 8 & 255,
                h >> 16 & 255, tags, WORDS[h % 23].title(), WORDS[h % 19], h % 100_000, msg,
                ["google", "newsletter", "direct", "partner"][h % 4], h % 40, h % 90, h % 10_000,
                h % 180, h >> 4 & 8191, 1 + h % 12, h % 2000, h % 100, h % 16, "AB"[h % 2])
            ).encode()


def create_topic(topic):
    mock_fd = os.environ.get("BENCH_MOCK_FD")
    if mock_fd is None:
        admin = AdminClient({"bootstrap.servers": BROKERS})
        for f in admin.create_topics([NewTopic(topic, PARTS, 1)]).values():
            f.result()
        return
    # librdkafka's mock cluster (bench.sh, BENCH_KAFKA=mock) has no controller for the admin
    # API: its process creates the topic when told on its stdin.
    os.write(int(mock_fd), f"{topic} {PARTS}\n".encode())
    deadline = time.time() + 10
    while f"created {topic}" not in open(os.environ["BENCH_MOCK_OUT"]).read():
        if time.time() > deadline:
            raise RuntimeError(f"the mock broker did not create {topic}")
        time.sleep(0.05)


def produce(topic, records):
    create_topic(topic)
    p = Producer({"bootstrap.servers": BROKERS, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 20, "compression.type": "lz4", "batch.size": 1_000_000,
                  "queue.buffering.max.kbytes": 262144})
    t0 = time.time()
    for i, v in enumerate(records):
        while True:
            try:
                p.produce(topic, v, partition=i % PARTS)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("producer could not deliver every record")
    secs = time.time() - t0
    c = Consumer({"bootstrap.servers": BROKERS, "group.id": "bench-wm-" + topic})
    for part in range(PARTS):
        want = len(range(part, len(records), PARTS))
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
        if (lo, hi) != (0, want):
            raise RuntimeError(f"{topic}[{part}]: offsets {lo}..{hi}, expected 0..{want}")
    c.close()
    return secs


def create_table(table, size):
    cols = LARGE_COLS if size == "1k" else SMALL_COLS
    ch("CREATE DATABASE IF NOT EXISTS bench")
    ch(f"""CREATE TABLE {table} ({cols},
  _topic LowCardinality(String), _partition UInt32, _offset UInt64,
  INDEX offset_minmax _offset TYPE minmax GRANULARITY 1,
  PROJECTION watermark (SELECT _topic, _partition, max(_offset) GROUP BY _topic, _partition)
) ENGINE = ReplacingMergeTree(_offset) ORDER BY (event, event_id)
SETTINGS deduplicate_merge_projection_mode = 'rebuild'""")
    # No merges while the bench runs: a duplicate must stay visible to count(), not be replaced away.
    ch(f"SYSTEM STOP MERGES {table}")


def verify(table, want, exactly_once):
    n, distinct = map(int, ch(f"SELECT count(), uniqExact(_partition, _offset) FROM {table}").split())
    ok = n == want and (distinct == n or not exactly_once)
    return {"count": n, "distinct_offsets": distinct, "expected": want, "ok": ok}


# ---------------------------------------------------------------- /proc sampling

def proc_stat(pid):
    """(cpu seconds, rss MB, peak rss MB, minor page faults) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            st = dict(l.split(":", 1) for l in f if ":" in l)
    except (FileNotFoundError, ProcessLookupError):
        return None
    cpu = (int(fields[11]) + int(fields[12])) / TICK        # utime + stime
    kb = lambda k: int(st.get(k, "0 kB").split()[0]) / 1024
    return cpu, kb("VmRSS"), kb("VmHWM"), int(fields[7])     # minflt: first touches of fresh pages


def thread_cpu(pid):
    """CPU seconds per thread name (librdkafka rdk:*, tokio workers, ...) of a live process."""
    out = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
            name = s[s.index("(") + 1:s.rindex(")")]
            name = name.rstrip("0123456789-#").rstrip(":/") or name   # rdk:broker1 -> rdk:broker
            f2 = s.rsplit(")", 1)[1].split()
            out[name] = round(out.get(name, 0) + (int(f2[11]) + int(f2[12])) / TICK, 2)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


EXTRA_PIDS = {}   # name -> pid: more processes stack_cpu() reads (pipeline.py's private server)


def stack_pids():
    d = os.environ.get("SLUICE_STACK_DIR", os.path.join(REPO, ".stack"))
    out = {}
    for name in ("kafka", "chdb"):
        try:
            out[name] = int(open(os.path.join(d, name + ".pid")).read())
        except (OSError, ValueError):
            pass
    out.update(EXTRA_PIDS)
    return out


class Watch:
    """Samples a process (every 250 ms) and, if `table` is set, count() (every `every` s, 500 ms);
    `landed` (a function: the rows landed so far) replaces count() where the poll must not load
    ClickHouse (pipeline.py)."""

    def __init__(self, pid, table=None, landed=None, every=0.5):
        self.pid, self.table, self.t0 = pid, table, time.time()
        self.mem, self.rows, self.last, self.rows_now = [], [], None, 0
        self.landed = landed or (lambda: int(ch(f"SELECT count() FROM {table}", timeout=10)))
        self.every = every
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._proc, daemon=True)]
        if table or landed:
            self.threads.append(threading.Thread(target=self._count, daemon=True))
        for t in self.threads:
            t.start()

    def _proc(self):
        while not self.stop.is_set():
            s = proc_stat(self.pid)
            if s:
                self.last = s
                self.mem.append((round(time.time() - self.t0, 3), round(s[1], 1)))
            self.stop.wait(0.25)

    def _count(self):
        while not self.stop.is_set():
            try:
                self.rows_now = self.landed()
                self.rows.append((round(time.time() - self.t0, 3), self.rows_now))
            except Exception as e:   # a slow answer under load is not a failure
                print(f"  (count poll: {e})", file=sys.stderr)
            self.stop.wait(self.every)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def stack_cpu():
    return {n: (proc_stat(p) or (0, 0, 0, 0))[0] for n, p in stack_pids().items()}


def diff(a, b):
    return {k: round(b[k] - a.get(k, 0), 2) for k in b}


# ---------------------------------------------------------------- cases

def rates(out, records, nbytes, seconds):
    out.update(records=records, bytes=nbytes, seconds=round(seconds, 3),
               records_per_s=round(records / seconds), mb_per_s=round(nbytes / 1e6 / seconds, 2))
    return out


def run_example(name, ds, args):
    """Runs target/release/examples/<name> to its end while watching it: (its JSON line, its
    progress series, (cpu, _, peak), the stack's CPU during it)."""
    log = open(f"{WORK}/{name}-{ds['size']}.log", "w")
    s0 = stack_cpu()
    # The stack's SLUICE_* variables (ports, state dir) are not sluice settings: keep them out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    p = spawn([f"{BIN}/{name}", *args], log, stdout=subprocess.PIPE, text=True, env=env)
    w = Watch(p.pid)
    out_text, _ = p.communicate(timeout=CASE_TIMEOUT)
    w.finish()
    log.close()
    if p.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {p.returncode}); see {log.name}")
    r = json.loads(out_text)
    series = [(round(x["t"], 3), x["records"]) for x in map(json.loads, open(log.name)) if "t" in x]
    return r, series + [(r["seconds"], r["records"])], w, diff(s0, stack_cpu())


def case_raw_fetch(ds):
    t0 = time.time()
    r, series, w, stack = run_example("raw_fetch", ds, [ds["topic"], str(MAX_BUFFERED)])
    ok = r["records"] == ds["records"] and r["bytes"] == ds["bytes"]
    res = rates({"verify": {"ok": ok, "expected": ds["records"], "count": r["records"]}},
                r["records"], r["bytes"], r["seconds"])
    cpu, _, peak, _ = w.last or (0, 0, 0, 0)
    first = r.get("first_record_seconds")
    if first is not None and r["seconds"] > first:
        res.update(time_to_first_row=round(first, 3), first_to_last_seconds=round(r["seconds"] - first, 3),
                   first_to_last_mb_per_s=round(r["bytes"] / 1e6 / (r["seconds"] - first), 2))
    res.update(wall_seconds=round(time.time() - t0, 3), cpu_seconds=cpu, peak_rss_mb=round(peak, 1),
               mem_series=w.mem, rows_series=series, stack_cpu=stack)
    return res


def case_raw_insert(ds):
    """target/release/examples/raw_insert: the topic read and encoded by sluice's own code before the
    clock starts, then inserted with sluice's own ClickHouse service and settings."""
    table = f"bench.raw_insert_{ds['size']}_{RUN}"
    create_table(table, ds["size"])
    config = sluice_config(ds, "exactly-once", table, f"bench-raw-insert-{ds['size']}-{RUN}")
    r, series, w, stack = run_example("raw_insert", ds, [config])
    res = rates({"table": table, "batches": r["batches"], "body_bytes": r["body_bytes"]},
                r["records"], r["bytes"], r["seconds"])
    cpu, _, peak, _ = w.last or (0, 0, 0, 0)
    res.update(wall_seconds=round(r["seconds"], 3), cpu_seconds=cpu, peak_rss_mb=round(peak, 1),
               stack_cpu=stack, rows_series=series, verify=verify(table, ds["records"], True))
    return res


def sluice_config(ds, delivery, table, group):
    path = f"{WORK}/{group}.toml"
    with open(path, "w") as f:
        f.write(f"""[kafka]
group_id = "{group}"
[clickhouse]
insert_timeout = "30s"
[sink]
delivery = "{delivery}"
max_buffered_bytes = {MAX_BUFFERED}
fence_wait = "0s"   # a fresh group: no previous owner whose inserts could still land
[[route]]
topic = "{ds['topic']}"
table = "{table}"
""")
        if KAFKA_PROPS:
            f.write("[kafka.properties]\n")
            for kv in KAFKA_PROPS.split(","):
                k, v = kv.split("=", 1)
                f.write(f'"{k.strip()}" = "{v.strip()}"\n')
    return path


def run_sink(ds, name, args, table, exactly_once, landed=None, every=0.5):
    """Starts a sink process, watches it until count() (or `landed()`, see Watch) == produced,
    stops it, measures."""
    log = open(f"{WORK}/{name}-{ds['size']}.log", "w")
    s0 = stack_cpu()
    t0 = time.time()
    # The stack's SLUICE_* variables (ports, state dir) are not sluice settings: keep them out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    p = spawn(args, log, env=dict(env, RUST_LOG=os.environ.get("RUST_LOG", "info")))
    w = Watch(p.pid, table, landed, every)
    want, failed, threads = ds["records"], None, {}
    while w.rows_now < want:
        if p.poll() is not None:
            failed = f"{name} exited early with status {p.returncode}; see {log.name}"
            break
        if time.time() - t0 > CASE_TIMEOUT:
            failed = f"{name}: only {w.rows_now} of {want} rows after {CASE_TIMEOUT:.0f} s"
            break
        time.sleep(0.05)
    secs = time.time() - t0
    last = proc_stat(p.pid) or w.last or (0, 0, 0, 0)   # read before the process ends
    threads = thread_cpu(p.pid)
    s1 = stack_cpu()
    w.finish()
    t_stop = time.time()
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    rows = w.rows
    first = next((t for t, n in rows if n > 0), None)
    res = rates({"table": table, "log": log.name}, want, ds["bytes"], secs)
    cpu = last[0]
    res.update(
        cpu_seconds=round(cpu, 2), cpu_s_per_mb=round(cpu / (ds["bytes"] / 1e6), 4),
        us_per_record=round(cpu / want * 1e6, 2),
        mb_per_cpu_s=round(ds["bytes"] / 1e6 / cpu, 1) if cpu else None,
        peak_rss_mb=round(last[2], 1), minor_faults=last[3], time_to_first_row=first,
        first_to_last_seconds=round(secs - first, 3) if first is not None else None,
        first_to_last_mb_per_s=round(ds["bytes"] / 1e6 / (secs - first), 2)
        if first is not None and secs > first else None,
        stop_seconds=round(time.time() - t_stop, 2), exit_status=p.returncode,
        threads=threads, stack_cpu=diff(s0, s1), mem_series=w.mem, rows_series=rows,
        verify=verify(table, want, exactly_once), error=failed)
    if failed:
        res["verify"]["ok"] = False
    return res


def case_sluice(ds, delivery):
    short = "eo" if delivery == "exactly-once" else "alo"
    table = f"bench.sluice_{short}_{ds['size']}_{RUN}"
    group = f"bench-{short}-{ds['size']}-{RUN}"
    create_table(table, ds["size"])
    cfg = sluice_config(ds, delivery, table, group)
    return run_sink(ds, f"sluice_{short}", [f"{BIN}/sluice", "run", "--config", cfg], table,
                    delivery == "exactly-once")


def case_baseline(ds):
    table = f"bench.baseline_{ds['size']}_{RUN}"
    create_table(table, ds["size"])
    args = [sys.executable, os.path.join(HERE, "baseline.py"), "--topic", ds["topic"],
            "--table", table, "--group", f"bench-py-{ds['size']}-{RUN}"]
    return run_sink(ds, "baseline", args, table, False)


# ---------------------------------------------------------------- driver

def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    import confluent_kafka
    import clickhouse_connect
    ver = lambda *a: subprocess.run(a, capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "mem_gb": round(mem / 1e6, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "sluice": ver(f"{BIN}/sluice", "--version"), "rustc": ver("rustc", "--version"),
            "git_commit": ver("git", "-C", REPO, "rev-parse", "--short", "HEAD"),
            "source": os.environ.get("BENCH_SOURCE", "?"),
            "stack": os.environ.get("BENCH_STACK_KIND", "?"),
            "clickhouse": ch("SELECT version()") + " (chDB behind stack/chdb_server.py)",
            "kafka": os.environ.get("BENCH_KAFKA_KIND", "?"),
            "confluent_kafka": confluent_kafka.version()[0], "librdkafka": confluent_kafka.libversion()[0],
            "clickhouse_connect": clickhouse_connect.common.version()}


def main():
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    res = {"run": RUN, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_start": os.getloadavg(),
           "machine": machine(),
           "config": {"bench_mb": MB, "partitions": PARTS, "batch_rows": BATCH_ROWS,
                      "batch_bytes": BATCH_BYTES, "concurrency": CONCURRENCY,
                      "max_buffered_bytes": MAX_BUFFERED, "compression": "lz4", "cases": CASES},
           "sizes": [], "failures": []}
    for size in SIZES:
        avg = sum(len(record(size, i)) for i in range(1000)) / 1000
        n = int(MB * 1e6 / avg) // PARTS * PARTS
        t = time.time()
        data = [record(size, i) for i in range(n)]
        ds = {"size": size, "topic": f"bench_{size}_{RUN}", "records": n,
              "bytes": sum(map(len, data)), "data": data}
        print(f"== {size}: {n} records, {ds['bytes'] / 1e6:.1f} MB JSON "
              f"(avg {ds['bytes'] / n:.0f} B, generated in {time.time() - t:.1f}s) -> {ds['topic']}",
              flush=True)
        ds["produce_seconds"] = round(produce(ds["topic"], data), 2)
        print(f"   produced in {ds['produce_seconds']}s", flush=True)
        entry = {k: v for k, v in ds.items() if k != "data"}
        entry["avg_record_bytes"] = round(ds["bytes"] / n, 1)
        entry["cases"] = {}
        res["sizes"].append(entry)
        runners = {"raw_fetch": case_raw_fetch, "raw_insert": case_raw_insert,
                   "sluice_eo": lambda d: case_sluice(d, "exactly-once"),
                   "sluice_alo": lambda d: case_sluice(d, "at-least-once"), "baseline": case_baseline}
        for case in [c for c in ALL_CASES if c in CASES]:
            time.sleep(2)   # let the stack settle (flushes of the previous case)
            load = os.getloadavg()[0]
            r = runners[case](ds)
            r["load_1m_before"] = load
            entry["cases"][case] = r
            v = r["verify"]
            flag = "ok" if v["ok"] else "FAILED"
            print(f"   {case:<11} {r['records_per_s']:>9,} rec/s {r['mb_per_s']:>7.2f} MB/s "
                  f"{r['seconds']:>7.1f}s  cpu {r.get('cpu_seconds', r.get('client_cpu_seconds'))}s "
                  f"peak {r.get('peak_rss_mb', '-')} MB  us/rec {r.get('us_per_record', '-')}  "
                  f"faults {r.get('minor_faults', '-')}  verify {flag}", flush=True)
            if not v["ok"]:
                msg = f"{size}/{case}: VERIFICATION FAILED: {v} {r.get('error') or ''}"
                print("!" * 72 + "\n!! " + msg + "\n" + "!" * 72, file=sys.stderr, flush=True)
                res["failures"].append(msg)
        del ds, data
    res["load_end"] = os.getloadavg()
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path = os.path.join(OUT, "results.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"== wrote {path} (logs and configs in {WORK})")
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
