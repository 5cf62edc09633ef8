#!/usr/bin/env python3
"""pipeline.py — what `make bench-pipeline` runs: the whole pipeline's CPU per record, the sink's
and the ClickHouse server's during the same ingest, side by side (issue 32).

Data flow, for each record size (BENCH_SIZES, "200b,1k": run.py's data sets, ~BENCH_MB MB of JSON):
  generate the records (run.py's `record`) -> produce them once into a fresh topic (run.py's
  `produce`); at 200 B also the same values through the official Confluent AvroSerializer and
  ProtobufSerializer (formats.py's, registered in SCHEMA_REGISTRY_URL) into two more topics
  -> BENCH_RUNS rounds (3), each running every case once, in this order, on a fresh table
     (run.py's `create_table`) and a fresh consumer group:
       json / sluice json     `sluice run`, exactly-once, clickhouse.insert_format = "json"
       json / sluice binary   the same with insert_format = "binary" (RowBinaryWithDefaults)
       json / baseline        scripts/bench/baseline.py (confluent-kafka + clickhouse-connect)
       avro, protobuf / sluice binary, sluice json   (200 B only; BENCH_FORMATS, "avro,protobuf")
  -> per run (run.py's `run_sink`): the sink process's CPU (utime + stime from /proc/<pid>/stat)
     and peak RSS (VmHWM), the ClickHouse server process's CPU over the same window (from just
     before the sink starts to the moment every row has landed; run.py's `stack_cpu`, which reads
     each process by its own pid, so the broker's CPU is counted apart), the wall time; "landed"
     is read without asking ClickHouse, so that the poll adds nothing to the server's CPU: the
     sink's sluice_rows_inserted_total on its /metrics (a free 127.0.0.1 port), the baseline's
     committed offsets (it commits right after each insert). Then count() == uniqExact(_partition,
     _offset) == produced is checked, and for sluice the run's sluice_json_fallback_batches_total
     (by reason) and sluice_batches_total, and the log's "inserts go as ..." lines, say which
     format its inserts went in.
  -> a Markdown table on stdout, docs/bench-pipeline.md and docs/bench-pipeline.json (every run).

The server: by default a private stack/chdb_server.py (the stack's script and engine, run by
SLUICE_CHDB_PYTHON) on a free 127.0.0.1 port with a data directory of its own, so that the
stack's other users (tests, the lab) add nothing to its CPU; BENCH_SERVER=stack inserts into the
stack's own server (CLICKHOUSE_URL, its pid from .stack/chdb.pid) instead. Either way the server's
CPU while idle is read for 2 s before each run and reported beside it. The broker and the schema
registry are the stack's.

Run with the clients' venv (SLUICE_CLIENTS_PYTHON); `pipeline.py --render docs/bench-pipeline.json`
writes the Markdown of a run again. Env: BENCH_MB (150: ~8 min on 2 cores), BENCH_RUNS (3),
BENCH_SIZES ("200b,1k"), BENCH_FORMATS ("avro,protobuf"; "" for none), BENCH_SERVER (private),
BENCH_PIPELINE_OUT (docs; "-": no files), BENCH_BIN (dir holding `sluice`), BENCH_SOURCE (what the
binary was built from, for the report), KAFKA_BROKERS, CLICKHOUSE_URL, SCHEMA_REGISTRY_URL,
SLUICE_CHDB_PYTHON, SLUICE_CHDB_SERVER. Every process it starts is ended on exit; its topics
and tables are deleted at the end. Exit status 1 when a run did not land every row exactly once.
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
KNOBS = {k: os.environ[k] for k in ("BENCH_MB", "BENCH_RUNS", "BENCH_SIZES", "BENCH_FORMATS", "BENCH_SERVER")
         if k in os.environ}   # as given, for the report's command line
os.environ.setdefault("BENCH_MB", "150")
import run as bench  # noqa: E402  (the data set, produce, tables, run_sink, stack_cpu)

from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SIZES = [s for s in os.environ.get("BENCH_SIZES", "200b,1k").split(",") if s]
FORMATS = [f for f in os.environ.get("BENCH_FORMATS", "avro,protobuf").split(",") if f]
SERVER = os.environ.get("BENCH_SERVER", "private")
OUT = os.environ.get("BENCH_PIPELINE_OUT", os.path.join(bench.REPO, "docs"))
SETTLE = 2.0            # seconds between runs, over which the server's idle CPU is read
KINDS = {"sluice-json": "sluice, insert_format = json", "sluice-binary": "sluice, insert_format = binary",
         "baseline": "Python baseline"}
LOG_MARKS = ("inserts go as", "row sent as JSONEachRow", "sluice_json_fallback", "refused")


# ---------------------------------------------------------------- the ClickHouse server

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_private_server():
    """A private chdb_server.py on a free port; returns (url, pid, data dir)."""
    port, data = free_port(), os.path.join(bench.WORK, "chdb")
    script = os.environ.get("SLUICE_CHDB_SERVER", os.path.join(bench.REPO, "stack", "chdb_server.py"))
    log = open(os.path.join(bench.WORK, "chdb_server.log"), "w")
    p = bench.spawn([os.environ["SLUICE_CHDB_PYTHON"], script, "--path", data, "--port", str(port),
                     "--host", "127.0.0.1"], log)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/?query=SELECT%201", timeout=5) as r:
                if r.read().strip() == b"1":
                    return url, p.pid, data
        except OSError:
            pass
        if p.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the private chdb_server did not start; see {log.name}")
        time.sleep(0.3)


def baseline_python():
    """The Python that runs baseline.py: the venv `make bench` keeps for it (scripts/bench/bench.sh:
    scripts/bench/requirements.txt, confluent-kafka and clickhouse-connect pinned), made if missing."""
    if os.environ.get("BENCH_BASELINE_PYTHON"):
        return os.environ["BENCH_BASELINE_PYTHON"]
    import hashlib
    req = os.path.join(HERE, "requirements.txt")
    cache = os.environ.get("SLUICE_CACHE", os.path.expanduser("~/.cache/sluice"))
    venv = os.path.join(cache, "venv-bench-" + hashlib.sha256(open(req, "rb").read()).hexdigest()[:12])
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(os.path.join(venv, ".complete")):
        print(f"== installing the bench's Python deps into {venv}", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["python3", "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", req],
                       check=True)
        open(os.path.join(venv, ".complete"), "w").close()
    return py


def machine(baseline_py):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    ver = lambda *a: subprocess.run(a, capture_output=True, text=True).stdout.strip()
    import confluent_kafka
    import platform
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "mem_gb": round(mem / 1e6, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "sluice": ver(f"{bench.BIN}/sluice", "--version"),
            "git_commit": ver("git", "-C", bench.REPO, "rev-parse", "--short", "HEAD"),
            "source": os.environ.get("BENCH_SOURCE", "the work tree"),
            "clickhouse": bench.ch("SELECT version()"),
            "producer_confluent_kafka": confluent_kafka.__version__,
            "baseline_clients": ver(baseline_py, "-c", "import confluent_kafka as k, clickhouse_connect as c; "
                                    "print(f'confluent-kafka {k.version()[0]} (librdkafka {k.libversion()[0]}), "
                                    "clickhouse-connect {c.common.version()}')")}


def cpu_of(pid):
    return (bench.proc_stat(pid) or (0,))[0]


# ---------------------------------------------------------------- "landed", without asking ClickHouse

def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        return r.read().decode()


def series(text, name):
    """{labels: value} of one metric in a Prometheus text exposition."""
    out = {}
    for line in (text or "").splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, val = line.rsplit(" ", 1)
            out[key[len(name):]] = float(val)
    return out


def sluice_landed(port, seen):
    """Rows sluice was told ClickHouse stored (sluice_rows_inserted_total); keeps the last scrape."""
    def landed():
        try:
            text = scrape(port)
        except OSError:
            return 0          # not serving yet
        seen["metrics"] = text
        return int(sum(series(text, "sluice_rows_inserted_total").values()))
    return landed


def committed_landed(topic, group):
    """Records the group committed (the baseline commits right after each insert)."""
    c = Consumer({"bootstrap.servers": bench.BROKERS, "group.id": group, "enable.auto.commit": False})
    tps = [TopicPartition(topic, p) for p in range(bench.PARTS)]

    def landed():
        return sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=5))
    return landed, c


# ---------------------------------------------------------------- one run

def sluice_config(ds, table, group, insert_format, fmt, port):
    path = bench.sluice_config(ds, "exactly-once", table, group)
    with open(path) as f:
        cfg = f.read()
    cfg = cfg.replace("[clickhouse]\n", f'[clickhouse]\ninsert_format = "{insert_format}"\n', 1)
    head = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    if fmt != "json":
        head += f'[schema_registry]\nurl = "{os.environ["SCHEMA_REGISTRY_URL"]}"\n'
    cfg = cfg.replace("[[route]]\n", head + "[[route]]\n", 1)
    if fmt != "json":
        cfg = cfg.replace(f'table = "{table}"\n', f'table = "{table}"\nformat = "{fmt}"\n', 1)
    with open(path, "w") as f:
        f.write(cfg)
    return path


def log_lines(path):
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if any(m in line for m in LOG_MARKS):
                out.append(line.strip()[:300])
    return out[:8]


def one_run(ds, fmt, kind, rnd, server_pid):
    tag = f"{ds['size']}_{fmt}_{kind.replace('-', '_')}_{rnd}"
    table, group = f"bench.pipe_{tag}_{bench.RUN}", f"bench-pipe-{tag}-{bench.RUN}"
    bench.create_table(table, ds["size"])
    c0 = cpu_of(server_pid)
    time.sleep(SETTLE)                 # the stack settles; the server's idle CPU meanwhile
    idle = (cpu_of(server_pid) - c0) / SETTLE
    load = os.getloadavg()[0]
    seen, consumer = {}, None
    if kind == "baseline":
        landed, consumer = committed_landed(ds["topic"], group)
        args = [BASELINE_PY, os.path.join(HERE, "baseline.py"), "--topic", ds["topic"],
                "--table", table, "--group", group]
    else:
        port = free_port()
        landed = sluice_landed(port, seen)
        cfg = sluice_config(ds, table, group, kind.split("-")[1], fmt, port)
        args = [f"{bench.BIN}/sluice", "run", "--config", cfg]
    try:
        r = bench.run_sink(ds, f"pipe-{tag}", args, table, True, landed=landed, every=0.25)
    finally:
        if consumer is not None:
            consumer.close()
    n = ds["records"]
    sink, server = r["cpu_seconds"], r["stack_cpu"].get("server", 0)
    out = {"topic_format": fmt, "kind": kind, "round": rnd, "table": table, "records": n,
           "sink_cpu_s": sink, "server_cpu_s": server, "broker_cpu_s": r["stack_cpu"].get("kafka"),
           "sink_us": round(sink / n * 1e6, 3), "server_us": round(server / n * 1e6, 3),
           "total_us": round((sink + server) / n * 1e6, 3), "wall_s": r["seconds"],
           "records_per_s": r["records_per_s"], "time_to_first_row": r["time_to_first_row"],
           "peak_rss_mb": r["peak_rss_mb"], "server_idle_cpu_per_s": round(idle, 3),
           "load_1m_before": load, "threads": r["threads"], "verify": r["verify"],
           "error": r["error"], "log": r["log"]}
    if kind != "baseline":
        m = seen.get("metrics")
        fb = series(m, "sluice_json_fallback_batches_total")
        out["metrics"] = {
            "scraped": m is not None,
            "batches": int(sum(series(m, "sluice_batches_total").values())),
            "rows_inserted": int(sum(series(m, "sluice_rows_inserted_total").values())),
            "json_fallback_batches": int(sum(fb.values())),
            "json_fallback_by_reason": {k: int(v) for k, v in fb.items()},
            "insert_retries": int(sum(series(m, "sluice_insert_retries_total").values()))}
        out["log_lines"] = log_lines(r["log"])
        went = " ".join(out["log_lines"])
        out["went_binary"] = ("inserts go as RowBinaryWithDefaults" in went
                              and out["metrics"]["scraped"] and out["metrics"]["json_fallback_batches"] == 0)
    try:
        bench.ch(f"DROP TABLE IF EXISTS {table}")
    except RuntimeError as e:
        print(f"  (drop {table}: {e})", file=sys.stderr)
    return out


# ---------------------------------------------------------------- the data sets

def datasets():
    """Yields (size, [(topic format, ds)]) one size at a time, its topics produced."""
    for size in SIZES:
        avg = sum(len(bench.record(size, i)) for i in range(1000)) / 1000
        n = int(bench.MB * 1e6 / avg) // bench.PARTS * bench.PARTS
        texts = [bench.record(size, i) for i in range(n)]
        encoders = {"json": None}
        if size == "200b" and FORMATS:
            import formats   # needs SCHEMA_REGISTRY_URL; the official serializers
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.serialization import MessageField, SerializationContext
            client = SchemaRegistryClient({"url": os.environ["SCHEMA_REGISTRY_URL"]})
            makers = {"avro": formats.avro_serializer, "protobuf": formats.proto_serializer}
            for f in FORMATS:
                encoders[f] = makers[f](client)
        sets = []
        for fmt, encode in encoders.items():
            topic = f"bench_pipe_{size}_{fmt}_{bench.RUN}"
            if encode is None:
                data = texts
            else:
                ctx = SerializationContext(topic, MessageField.VALUE)
                data = [encode(formats.values(t), ctx) for t in texts]
            ds = {"size": size, "topic": topic, "records": n, "bytes": sum(map(len, data))}
            t = time.time()
            secs = bench.produce(topic, data)
            print(f"== {size} {fmt}: {n:,} records, {ds['bytes'] / n:.0f} B/record "
                  f"(+ {time.time() - t - secs:.1f}s to check) produced in {secs:.1f}s -> {topic}", flush=True)
            TOPICS.append(topic)
            sets.append((fmt, ds))
            del data
        yield size, sets


TOPICS = []
BASELINE_PY = None


# ---------------------------------------------------------------- the report

def med(xs):
    return statistics.median(xs) if xs else None


def summarize(runs):
    """Per (size, topic format, kind): medians over the rounds, and the ratios."""
    groups = {}
    for r in runs:
        groups.setdefault((r["size"], r["topic_format"], r["kind"]), []).append(r)
    rows = {}
    for key, rs in groups.items():
        rows[key] = {
            "size": key[0], "topic_format": key[1], "kind": key[2], "runs": len(rs),
            "records": rs[0]["records"], "bytes_per_record": rs[0]["bytes_per_record"],
            "sink_us": med([r["sink_us"] for r in rs]), "server_us": med([r["server_us"] for r in rs]),
            "total_us": med([r["total_us"] for r in rs]),
            "total_us_min": min(r["total_us"] for r in rs), "total_us_max": max(r["total_us"] for r in rs),
            "broker_us": med([(r["broker_cpu_s"] or 0) / r["records"] * 1e6 for r in rs]),
            "wall_s": med([r["wall_s"] for r in rs]), "records_per_s": med([r["records_per_s"] for r in rs]),
            "peak_rss_mb": med([r["peak_rss_mb"] for r in rs]),
            "server_idle_cpu_per_s": max(r["server_idle_cpu_per_s"] for r in rs),
            "exact": all(r["verify"]["ok"] for r in rs),
            "threads_us": {t: med([r["threads"].get(t, 0) / r["records"] * 1e6 for r in rs])
                           for t in sorted({t for r in rs for t in r["threads"]})}}
        if key[2] != "baseline":
            rows[key]["json_fallback_batches"] = sum(r["metrics"]["json_fallback_batches"] for r in rs)
            rows[key]["batches"] = sum(r["metrics"]["batches"] for r in rs)
            rows[key]["went_binary"] = all(r["went_binary"] for r in rs)
    for (size, fmt, kind), row in rows.items():
        def ratio(other, field="total_us"):
            o = rows.get(other)
            return round(row[field] / o[field], 3) if o and o[field] else None
        row["x_baseline"] = ratio((size, "json", "baseline"))
        row["sink_x_baseline"] = ratio((size, "json", "baseline"), "sink_us")
        row["server_x_baseline"] = ratio((size, "json", "baseline"), "server_us")
        row["x_json_insert"] = ratio((size, fmt, "sluice-json")) if kind != "baseline" else None
        row["server_x_json_insert"] = ratio((size, fmt, "sluice-json"), "server_us") if kind != "baseline" else None
        row["x_json_topic"] = ratio((size, "json", kind)) if kind != "baseline" else None
        row["sink_x_json_topic"] = ratio((size, "json", kind), "sink_us") if kind != "baseline" else None
    return rows


def fmt_num(x, d=2):
    return "" if x is None else f"{x:.{d}f}"


def table_md(rows):
    head = ("| size | topic | case | records | B/record | sink µs/rec | server µs/rec | **sink+server µs/rec** "
            "| min..max | × baseline | × insert json | × JSON topic | wall s | records/s | peak RSS MB "
            "| JSON-fallback batches / batches | exactly once |\n"
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    lines = [head]
    order = {"sluice-json": 0, "sluice-binary": 1, "baseline": 2}
    fmts = {"json": 0, "avro": 1, "protobuf": 2}
    for row in sorted(rows.values(), key=lambda r: (SIZES.index(r["size"]), fmts.get(r["topic_format"], 9),
                                                    order[r["kind"]])):
        fb = "" if row["kind"] == "baseline" else f"{row['json_fallback_batches']} / {row['batches']}"
        lines.append(
            f"| {row['size']} | {row['topic_format']} | {KINDS[row['kind']]} | {row['records']:,} "
            f"| {row['bytes_per_record']:.0f} | {fmt_num(row['sink_us'])} | {fmt_num(row['server_us'])} "
            f"| **{fmt_num(row['total_us'])}** | {fmt_num(row['total_us_min'])}..{fmt_num(row['total_us_max'])} "
            f"| {fmt_num(row['x_baseline'])} | {fmt_num(row['x_json_insert'])} | {fmt_num(row['x_json_topic'])} "
            f"| {fmt_num(row['wall_s'], 1)} | {row['records_per_s']:,.0f} | {fmt_num(row['peak_rss_mb'], 0)} "
            f"| {fb} | {'yes' if row['exact'] else '**NO**'} |")
    return "\n".join(lines)


def verdict(rows):
    out, goals = [], {}
    b, j = rows.get(("200b", "json", "sluice-binary")), rows.get(("200b", "json", "baseline"))
    if b and j:
        met = b["total_us"] <= 0.5 * j["total_us"]
        goals["binary_half_of_baseline_200b"] = {"met": met, "ratio": b["x_baseline"]}
        out.append(f"- **Sink + server ≤ 0.5 × the baseline's at 200 B JSON: {'met' if met else 'not met'}** — "
                   f"sluice binary {b['total_us']:.2f} µs a record against the baseline's {j['total_us']:.2f} "
                   f"(× {b['x_baseline']:.2f}; sink × {b['sink_x_baseline']:.2f}, server × {b['server_x_baseline']:.2f}).")
    for fmt in FORMATS:
        for kind in ("sluice-binary", "sluice-json"):
            r, base = rows.get(("200b", fmt, kind)), rows.get(("200b", "json", kind))
            if not (r and base):
                continue
            met = r["total_us"] <= base["total_us"]
            goals[f"{fmt}_{kind}_at_most_json"] = {"met": met, "ratio": r["x_json_topic"],
                                                   "sink_ratio": r["sink_x_json_topic"]}
            out.append(f"- **{fmt.capitalize()} ≤ JSON per record ({KINDS[kind]}): {'met' if met else 'not met'}** — "
                       f"sink + server {r['total_us']:.2f} against {base['total_us']:.2f} µs (× {r['x_json_topic']:.2f}); "
                       f"the sink alone {r['sink_us']:.2f} against {base['sink_us']:.2f} (× {r['sink_x_json_topic']:.2f}).")
    for size in SIZES:
        b, js = rows.get((size, "json", "sluice-binary")), rows.get((size, "json", "sluice-json"))
        if b and js:
            wk = {k: rows[(size, "json", k)]["threads_us"] for k in ("sluice-json", "sluice-binary")}
            out.append(f"- {size}: where the sink's CPU goes, µs a record (median), json → binary: the insert "
                       f"tasks (`tokio-rt-worker`, which build each body) {wk['sluice-json'].get('tokio-rt-worker', 0):.2f} → "
                       f"{wk['sluice-binary'].get('tokio-rt-worker', 0):.2f}, the consumer thread (`sluice-consumer`) "
                       f"{wk['sluice-json'].get('sluice-consumer', 0):.2f} → {wk['sluice-binary'].get('sluice-consumer', 0):.2f}, "
                       f"librdkafka (`rdk:broker`) {wk['sluice-json'].get('rdk:broker', 0):.2f} → "
                       f"{wk['sluice-binary'].get('rdk:broker', 0):.2f}.")
            out.append(f"- {size}: the binary path against insert_format = json, sink + server × "
                       f"{b['x_json_insert']:.2f} (the server's CPU × {b['server_x_json_insert']:.2f}: "
                       f"{js['server_us']:.2f} → {b['server_us']:.2f} µs a record; the sink's "
                       f"{js['sink_us']:.2f} → {b['sink_us']:.2f}).")
    return out, goals


def binary_check(runs):
    lines = []
    for r in runs:
        if r["kind"] == "baseline":
            continue
        m = r["metrics"]
        if r["kind"] == "sluice-binary" and not r["went_binary"]:
            lines.append(f"- **{r['size']} {r['topic_format']} binary, round {r['round']}: not all binary** — "
                         f"{m['json_fallback_batches']} of {m['batches']} batches as JSON "
                         f"({m['json_fallback_by_reason']}); log: {r['log_lines']}")
        if r["kind"] == "sluice-json" and m["json_fallback_batches"] < m["batches"]:
            lines.append(f"- {r['size']} {r['topic_format']} json, round {r['round']}: "
                         f"{m['json_fallback_batches']} JSON bodies for {m['batches']} batches")
    return lines


def markdown(res, rows, verdict_lines, check_lines):
    m = res["machine"]
    idle = max((r["server_idle_cpu_per_s"] for r in res["runs"]), default=0)
    srv = ("a private `stack/chdb_server.py` (the stack's script and engine) on a port and data "
           "directory of its own, so the stack's other users add nothing to its CPU"
           if res["server"] == "private" else "the stack's own `stack/chdb_server.py`, which others use too")
    sizes = ", ".join(f"{s['size']}: {s['records']:,} records" for s in res["datasets"] if s["topic_format"] == "json")
    return f"""# The whole pipeline's cost per record (`make bench-pipeline`)

What moving a record from Kafka into ClickHouse costs in CPU, counted on both sides of the
insert: the sink process's CPU and the ClickHouse server process's CPU over the same ingest, per
record, for `sluice run` (exactly-once) with `insert_format = "json"` (JSONEachRow) and `"binary"`
(RowBinaryWithDefaults), and the Python byte-splice baseline (`scripts/bench/baseline.py`:
confluent-kafka + clickhouse-connect, JSONEachRow, at-least-once); at 200 B also the same values
as Avro and Protobuf (the official Confluent serializers) through sluice. Issue 32's goals:
sink + server at most half the baseline's at 200 B JSON; Avro and Protobuf at or below JSON's
cost per record.

## Verdict

{chr(10).join(verdict_lines)}

## Figures

Run {res['started']} → {res['finished']} ({res['elapsed_min']:.1f} min), {m['sluice']}
built from {m['source']}, {res['config']['runs']} rounds, median per case (min..max of sink + server over the
rounds); load (1 min) {res['load_start'][0]:.1f} → {res['load_end'][0]:.1f}. Every run in
[bench-pipeline.json](bench-pipeline.json).

{table_md(rows)}

µs/rec: CPU seconds (user + system) per record produced, start-up included (each process's
start, its group join, sluice's reads of watermarks and columns, the baseline's Python imports: a
fixed cost that {res['config']['bench_mb']:.0f} MB a size spreads thin but does not remove). × baseline: sink + server against the
baseline's at the same size; × insert json: against the same topic through sluice with
`insert_format = "json"`; × JSON topic: against the JSON topic through sluice with the same
`insert_format`. JSON-fallback batches: `sluice_json_fallback_batches_total` over the rounds
(every batch of `insert_format = "json"` counts there, as it should) against
`sluice_batches_total`.

## What was measured, on what

Data sets: run.py's records ({sizes}; {res['config']['partitions']} partitions, lz4), produced
once per topic; each run a fresh table (run.py's bench table: `ReplacingMergeTree`, merges
stopped) and a fresh consumer group, the cases interleaved round by round. Sink CPU: utime +
stime of the sink process from `/proc/<pid>/stat`, from its start to the moment every row had
landed (start-up included). Server CPU: the same of the ClickHouse server process over the same
window, read by its own pid, so the broker's CPU (also in the JSON) is not in it. "Landed" is
read without asking ClickHouse, so the poll costs the server nothing: sluice's
`sluice_rows_inserted_total` on its `/metrics`, the baseline's committed offsets. Then
count() == uniqExact(_partition, _offset) == records produced is checked for every run.

The server is {srv}: ClickHouse {m['clickhouse']} (chDB 26.9); the broker is the stack's Apache Kafka (one
KRaft node), the schema registry the stack's. The machine: {m['nproc']} cores ({m['cpu_model']}),
{m['mem_gb']} GB, kernel {m['kernel']}, Python {m['python']}; the baseline on {m['baseline_clients']};
the Avro and Protobuf records made by confluent-kafka {m['producer_confluent_kafka']}'s serializers; sink, broker and
ClickHouse share the 2 cores, with other engineers' builds and tests running beside them. The
server's CPU while idle, read for {SETTLE:.0f} s before each run, was at most {idle:.3f} CPU s a
second. Command: `{res['command']}`.

## Did the binary case go binary?

{chr(10).join(check_lines) if check_lines else "Yes: every `insert_format = binary` run logged `inserts go as RowBinaryWithDefaults` and its `/metrics` showed `sluice_json_fallback_batches_total` 0, while every `insert_format = json` run counted each of its batches there."}
"""


def render(path):
    """`pipeline.py --render FILE.json`: the Markdown of an earlier run, written beside it."""
    global SIZES, FORMATS
    with open(path) as f:
        res = json.load(f)
    SIZES, FORMATS = res["config"]["sizes"], res["config"]["formats"]
    rows = summarize(res["runs"])
    vlines, _ = verdict(rows)
    md = os.path.join(os.path.dirname(path), "bench-pipeline.md")
    with open(md, "w") as f:
        f.write(markdown(res, rows, vlines, binary_check(res["runs"])))
    print(f"== wrote {md}")
    return 0


def main():
    global BASELINE_PY
    if sys.argv[1:2] == ["--render"]:
        return render(sys.argv[2])
    t_start = time.time()
    os.makedirs(bench.WORK, exist_ok=True)
    BASELINE_PY = baseline_python()
    data_dir = None
    if SERVER == "private":
        url, pid, data_dir = start_private_server()
        bench.CH = url
        os.environ["CLICKHOUSE_URL"] = url        # sluice and baseline.py read it
    else:
        pid = bench.stack_pids()["chdb"]
    bench.EXTRA_PIDS["server"] = pid
    print(f"== server: {SERVER} chdb_server.py pid {pid} at {bench.CH}; {RUNS} rounds; work dir {bench.WORK}",
          flush=True)
    res = {"run": bench.RUN, "started": time.strftime("%Y-%m-%d %H:%M %z"), "load_start": os.getloadavg(),
           "machine": machine(BASELINE_PY), "server": SERVER,
           "command": " ".join([f"{k}={v}" for k, v in KNOBS.items()] + ["make bench-pipeline"]),
           "config": {"bench_mb": bench.MB, "runs": RUNS, "sizes": SIZES, "formats": FORMATS,
                      "partitions": bench.PARTS, "max_buffered_bytes": bench.MAX_BUFFERED},
           "datasets": [], "runs": [], "failures": []}
    try:
        for size, sets in datasets():
            cases = [(fmt, kind) for fmt, _ in sets
                     for kind in (("sluice-json", "sluice-binary", "baseline") if fmt == "json"
                                  else ("sluice-binary", "sluice-json"))]
            by_fmt = dict(sets)
            for fmt, ds in sets:
                res["datasets"].append({"size": size, "topic_format": fmt, "topic": ds["topic"],
                                        "records": ds["records"], "bytes": ds["bytes"]})
            for rnd in range(1, RUNS + 1):
                for fmt, kind in cases:
                    ds = by_fmt[fmt]
                    r = one_run(ds, fmt, kind, rnd, pid)
                    r["size"], r["bytes_per_record"] = size, ds["bytes"] / ds["records"]
                    res["runs"].append(r)
                    fb = "" if kind == "baseline" else \
                        f"  fallback {r['metrics']['json_fallback_batches']}/{r['metrics']['batches']}"
                    ok = r["verify"]["ok"]
                    print(f"   {size:<4} {fmt:<8} {kind:<13} r{rnd}  sink {r['sink_us']:6.2f}  server "
                          f"{r['server_us']:6.2f}  total {r['total_us']:6.2f} µs/rec  wall {r['wall_s']:5.1f}s  "
                          f"peak {r['peak_rss_mb']:5.0f} MB  idle {r['server_idle_cpu_per_s']:.2f}{fb}  "
                          f"{'ok' if ok else 'FAILED ' + str(r['verify']) + ' ' + str(r['error'] or '')}",
                          flush=True)
                    if not ok:
                        res["failures"].append(f"{size}/{fmt}/{kind}/{rnd}: {r['verify']} {r['error'] or ''}")
    finally:
        try:
            admin = AdminClient({"bootstrap.servers": bench.BROKERS})
            for f in admin.delete_topics(TOPICS).values():
                f.result()
        except Exception as e:
            print(f"  (delete topics: {e})", file=sys.stderr)
    res["load_end"] = os.getloadavg()
    res["finished"] = time.strftime("%Y-%m-%d %H:%M %z")
    res["elapsed_min"] = round((time.time() - t_start) / 60, 2)
    rows = summarize(res["runs"])
    vlines, goals = verdict(rows)
    clines = binary_check(res["runs"])
    res["summary"] = [dict(v) for v in rows.values()]
    res["goals"] = goals
    print("\n" + table_md(rows) + "\n\n" + "\n".join(vlines) + "\n" + "\n".join(clines))
    if OUT != "-":
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "bench-pipeline.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(OUT, "bench-pipeline.md"), "w") as f:
            f.write(markdown(res, rows, vlines, clines))
        print(f"== wrote {OUT}/bench-pipeline.md and .json ({res['elapsed_min']:.1f} min)")
    if data_dir:
        bench.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
