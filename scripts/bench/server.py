#!/usr/bin/env python3
"""server.py — what `make bench-server` runs: what the stack's ClickHouse server
(stack/chdb_server.py) costs for the sink's exactly-once insert shape, next to a plain insert of
the same rows and next to chDB itself.

Data flow, for each size N in BENCH_ROWS:
  N JSONEachRow rows of the bench's order shape (order_id UInt64, user_id UInt32,
  amount Decimal(12, 2), status LowCardinality(String), created_at DateTime64(3), and the sink's
  metadata columns _topic LowCardinality(String), _partition UInt32, _offset UInt64), ~184 B a row
    -> one warm-up round, then BENCH_ROUNDS rounds, the shapes interleaved (a, b, c, d, a, b, ...);
       a sample is K = min(BENCH_SAMPLE_ROWS / N, 200) inserts of the N rows (the CPU clock ticks
       in 10 ms), BENCH_INSERTS_PER_TABLE (10) into each of fresh plain MergeTree tables of the
       sample's own (non_replicated_deduplication_window = 0, merges stopped: one part per insert,
       at most 9 before it), made, checked and dropped outside the clock:
       a  plain      HTTP POST, `INSERT INTO db.t FORMAT JSONEachRow`, rows as the body (the sink's
                     at-least-once insert)
       b  exactly    HTTP POST, the sink's exactly-once insert as crates/sluice/src/ch/service.rs
                     sends it: `INSERT INTO db.t SELECT * FROM input() WHERE (SELECT throwIf(
                     toUnixTimestamp64Milli(now64(3)) > D, ...)) = 0 AND throwIf(
                     toUnixTimestamp(nowInBlock()) * 1000 + 999 > D, ...) = 0 FORMAT JSONEachRow`
       c  chdb       chDB in-process (a helper process holding one session), the floor:
                     `INSERT INTO db.t SELECT * FROM file('<rows>', JSONEachRow, '<structure>')`
       d  chdb-eo    chDB in-process, c with b's WHERE: what the engine itself adds for b
       Both HTTP shapes carry the sink's insert settings (async_insert=0, max_insert_threads=1,
       input_format_parallel_parsing=0, block sizes, timeouts, deduplicate_insert, a fresh
       insert_deduplication_token and query_id) as URL parameters, over one keep-alive connection,
       the body sent chunked as one chunk (as the `clickhouse` crate does); the helper SETs the
       same settings once.
    -> per sample: the CPU seconds (user + sys) of the whole server (or helper) process from
       /proc/<pid>/stat just before the first request and just after the last answer, divided by K;
       the wall time likewise; the CPU of each of the server's threads (/proc/<pid>/task), grouped:
       its Python request threads (the server's code and the chDB calls made from them: parsing
       and planning), the engine's ThreadPool (query pipelines), other engine threads
  -> Markdown tables on stdout (medians over the rounds, µs of CPU per row, b/a as the median of
     the per-round ratios, what the WHERE adds as the median of the per-round differences b - a
     and d - c) and BENCH_OUT/bench-server.json (every sample, the machine).

The server: by default a private chdb_server (BENCH_SERVER_SCRIPT, default stack/chdb_server.py,
run by this interpreter, which must have chdb: SLUICE_CHDB_PYTHON) on a free port of 127.0.0.1
with a data dir of its own, so that the stack's other users add nothing to its CPU.
BENCH_SERVER=stack measures the stack's own server instead (CLICKHOUSE_URL; its pid from
.stack/chdb.pid). BENCH_PROFILE=1 runs the private server under an instrumenting wrapper
(`server.py --instrumented-server`) and adds a table of where its request threads' CPU goes
(thread_time per step, each step's own time without the steps inside it); its figures are not
the headline ones. Env: BENCH_ROWS ("100000 10000 1000"), BENCH_ROUNDS (7), BENCH_SAMPLE_ROWS
(1000000), BENCH_INSERTS_PER_TABLE (10), BENCH_SHAPES ("a b c d"), BENCH_OUT (docs; "-": no file), BENCH_SERVER,
BENCH_SERVER_SCRIPT, BENCH_PROFILE, CLICKHOUSE_URL. Everything runs in database bench_server,
dropped at the end; every process it starts is ended on exit. Exit status 1 when a table did not
get exactly its rows.
"""
import collections
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ROWS = [int(n) for n in os.environ.get("BENCH_ROWS", "100000 10000 1000").split()]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
SAMPLE_ROWS = int(os.environ.get("BENCH_SAMPLE_ROWS", "1000000"))
MAX_INSERTS = 200                      # per sample
# Inserts per table, each a part of its own (merges stopped): an insert's fixed cost grows with the
# parts a table already has (chDB 1,000 rows: ~7 ms into 0-20 parts, ~14 ms into 180-200).
PER_TABLE = int(os.environ.get("BENCH_INSERTS_PER_TABLE", "10"))
SHAPES = os.environ.get("BENCH_SHAPES", "a b c d").split()
OUT = os.environ.get("BENCH_OUT", os.path.join(REPO, "docs"))
MODE = os.environ.get("BENCH_SERVER", "private")
SERVER_SCRIPT = os.path.abspath(os.environ.get("BENCH_SERVER_SCRIPT",
                                               os.path.join(REPO, "stack", "chdb_server.py")))
PROFILE = os.environ.get("BENCH_PROFILE", "") not in ("", "0")
DB = "bench_server"
TICK = os.sysconf("SC_CLK_TCK")
DEADLINE_PASSED = "sluice: attempt deadline passed"      # crates/sluice/src/ch/service.rs
NAMES = {"a": "plain insert, HTTP", "b": "exactly-once insert, HTTP",
         "c": "chDB in-process, plain", "d": "chDB in-process, exactly-once WHERE"}

COLUMNS = ("order_id UInt64, user_id UInt32, amount Decimal(12, 2), status LowCardinality(String), "
           "created_at DateTime64(3), _topic LowCardinality(String), _partition UInt32, _offset UInt64")
STRUCTURE = ("`order_id` UInt64, `user_id` UInt32, `amount` Decimal(12, 2), "
             "`status` LowCardinality(String), `created_at` DateTime64(3), "
             "`_topic` LowCardinality(String), `_partition` UInt32, `_offset` UInt64")
STATUSES = ["paid", "pending_payment", "shipped", "delivered", "cancelled", "refunded"]

# The sink's insert settings (ClickHouse::connect; max_batch_rows 100,000 -> blocks of 1,048,449;
# insert_timeout 30 s; exactly-once sends tokens, so deduplicate_insert = enable). JSON records
# add no format settings, a plain MergeTree no consistency ones.
SETTINGS = [("async_insert", "0"), ("insert_deduplicate", "1"),
            ("max_insert_block_size", "1048449"), ("min_insert_block_size_rows", "1048449"),
            ("max_insert_block_size_bytes", "0"), ("min_insert_block_size_bytes", "0"),
            ("max_insert_threads", "1"), ("input_format_parallel_parsing", "0"),
            ("max_execution_time", "30"), ("http_receive_timeout", "30"), ("http_send_timeout", "30"),
            ("deduplicate_insert", "enable")]

CHILDREN = []


def mix(i):
    return (i * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF


def rows(n):
    """n JSONEachRow lines as the sink sends them: the record's JSON, the metadata appended."""
    out = []
    for i in range(n):
        h = mix(i) ^ mix(i >> 7)
        s = i % 86400
        out.append('{"order_id":%d,"user_id":%d,"amount":%d.%02d,"status":"%s",'
                   '"created_at":"2026-11-30 %02d:%02d:%02d.%03d","_topic":"shop_orders_v1",'
                   '"_partition":%d,"_offset":%d}\n' % (
                       1_000_000_000_000 + i, h, h % 100_000, h % 100, STATUSES[h % 6],
                       s // 3600, s // 60 % 60, s % 60, h % 1000, i % 8, 5_000_000 + i // 8))
    return "".join(out).encode()


def cpu_of(pid):
    """user + sys CPU seconds of a whole process (every thread, live or ended)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def threads_of(pid):
    """{tid: (group, CPU seconds)} of a process's live threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s.rsplit(")", 1)[1].split()
        group = ("main thread" if tid == str(pid) else "request threads (Python)"
                 if comm.startswith(("python", "Thread-")) else
                 "engine ThreadPool" if comm == "ThreadPool" else "other engine threads")
        out[tid] = (group, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def by_group(before, after, total):
    """CPU seconds per thread group between two threads_of() reads; threads that ended in between
    are what `total` (the process's own count) has beyond the live ones."""
    out = collections.Counter()
    for tid, (group, cpu) in after.items():
        out[group] += cpu - before.get(tid, (group, 0.0))[1]
    out["ended threads"] = total - sum(out.values())
    return out


# ---------------------------------------------------------------- the server over HTTP
class Server:
    def __init__(self, url, pid, proc=None):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.pid, self.proc = u.hostname, u.port or 8123, pid, proc
        self.conn = None

    def request(self, sql, body=None, settings=(), chunked=False):
        """(status, answer) of one POST; `body` None: the query is the body."""
        params = [("query", sql)] if body is not None else []
        params += list(settings)
        path = "/?" + urllib.parse.urlencode(params)
        data = sql.encode() if body is None else body
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
            try:
                if chunked:    # one chunk: the crate's one send() of the whole body
                    self.conn.putrequest("POST", path, skip_accept_encoding=True)
                    self.conn.putheader("Transfer-Encoding", "chunked")
                    self.conn.endheaders()
                    self.conn.send(b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n")
                else:
                    self.conn.request("POST", path, body=data)
                r = self.conn.getresponse()
                return r.status, r.read().decode(errors="replace")
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError

    def ch(self, sql):
        status, text = self.request(sql)
        if status != 200:
            raise RuntimeError(f"ClickHouse: {status} {text[:500]} (query: {sql[:200]})")
        return text.strip()

    def stop(self):
        """SIGTERM a private server (it stops promptly) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_private(work):
    port = free_port()
    log = open(os.path.join(work, "chdb_server.log"), "w")
    wrap = [os.path.abspath(__file__), "--instrumented-server"] if PROFILE else []
    env = dict(os.environ, BENCH_PROFILE_FILE=os.path.join(work, "profile.json"))
    p = subprocess.Popen([sys.executable, *wrap, SERVER_SCRIPT, "--path", os.path.join(work, "chdb"),
                          "--port", str(port), "--host", "127.0.0.1"],
                         stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
    CHILDREN.append(p)
    srv = Server(f"http://127.0.0.1:{port}", p.pid, p)
    deadline = time.time() + 120
    while True:
        try:
            if srv.request("SELECT 1")[0] == 200:
                return srv
        except OSError:
            srv.conn = None
        if p.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the private chdb_server did not start; see {log.name}")
        time.sleep(0.3)


def stack_server():
    pidfile = os.path.join(os.environ.get("SLUICE_STACK_DIR", os.path.join(REPO, ".stack")), "chdb.pid")
    with open(pidfile) as f:
        pid = int(f.read().strip())
    return Server(os.environ.get("CLICKHOUSE_URL", "http://127.0.0.1:18123"), pid)


# ---------------------------------------------------------------- the instrumented server
def instrumented_server(script, args):
    """`server.py --instrumented-server SCRIPT ARGS...`: runs SCRIPT's main() with some of its steps
    timed by thread_time (each step's own time, without the timed steps inside it); SIGUSR1 writes
    the totals so far to $BENCH_PROFILE_FILE (with a sequence number)."""
    sys.path.insert(0, os.path.dirname(script))
    import importlib
    s = importlib.import_module(os.path.splitext(os.path.basename(script))[0])
    totals, lock, local, seq = collections.defaultdict(lambda: [0.0, 0]), threading.Lock(), \
        threading.local(), [0]

    def timed(fn, key):
        def run(*a, **k):
            stack = local.__dict__.setdefault("stack", [])
            stack.append(0.0)                  # the time of timed steps inside this one
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                spent = time.thread_time() - t0
                inner = stack.pop()
                if stack:
                    stack[-1] += spent
                with lock:
                    t = totals[key(*a, **k) if callable(key) else key]
                    t[0] += spent - inner
                    t[1] += 1
        return run

    def statement(_conn, sql, *_a, **_k):
        w = sql.split(None, 1)[0].upper()
        if w == "INSERT":
            return "chDB call: INSERT" + (" ... WHERE" if " WHERE " in sql else "")
        if "system.columns" in sql:
            return "chDB call: SELECT FROM system.columns"
        return "chDB call: " + w

    h = s.Handler
    h.chdb = staticmethod(timed(h.__dict__["chdb"].__func__, statement))
    h.handle_request = timed(h.handle_request, "HTTP handler, the rest")
    h.read_query = timed(h.read_query, "read_query (parse the INSERT)")
    h.input_structure = timed(h.input_structure, "input_structure, the rest")
    h.run_with_data = timed(h.run_with_data, "temporary file: write, unlink")
    s.Body.read_all = timed(s.Body.read_all, "read the body")
    s.now_at_start = timed(s.now_at_start, "now_at_start")
    s.chdb_state.connect = timed(s.chdb_state.connect, "chDB connect")

    def dump(_signum, _frame):
        with lock:
            seq[0] += 1
            out = {"seq": seq[0], "totals": {k: v[:] for k, v in totals.items()}}
        with open(os.environ["BENCH_PROFILE_FILE"] + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(os.environ["BENCH_PROFILE_FILE"] + ".tmp", os.environ["BENCH_PROFILE_FILE"])

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = [script] + args
    s.main()


def profile_totals(srv, work, last=[0]):  # noqa: B006 - the last sequence number seen
    os.kill(srv.pid, signal.SIGUSR1)
    path = os.path.join(work, "profile.json")
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with open(path) as f:
                d = json.load(f)
            if d["seq"] > last[0]:
                last[0] = d["seq"]
                return {k: v[0] for k, v in d["totals"].items()}
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise RuntimeError("the instrumented server wrote no profile")


# ---------------------------------------------------------------- chDB in-process (the floor)
def helper_main(path):
    """`server.py --helper DIR`: one chDB session; runs each statement read from stdin (one JSON
    string a line), answering one JSON line: {"out": <result text>} or {"error": <text>}."""
    from chdb import session
    s = session.Session(path)
    s.query("SET " + ", ".join(f"{k} = '{v}'" for k, v in SETTINGS))
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            r = s.query(json.loads(line), "TabSeparated")
            print(json.dumps({"out": r.bytes().decode()}), flush=True)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"error": str(e)}), flush=True)
    s.close()


class Helper:
    def __init__(self, work):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--helper",
                                   os.path.join(work, "direct")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        CHILDREN.append(self.p)
        self.pid = self.p.pid
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError("the chDB helper did not start")

    def run(self, sql):
        self.p.stdin.write(json.dumps(sql) + "\n")
        self.p.stdin.flush()
        answer = json.loads(self.p.stdout.readline())
        if "error" in answer:
            raise RuntimeError(f"chDB helper: {answer['error'][:500]} (query: {sql[:200]})")
        return answer["out"].strip()

    def stop(self):
        self.p.stdin.close()                   # it ends at the end of its input
        self.p.wait(30)


# ---------------------------------------------------------------- the shapes
def create(run_sql, table):
    run_sql(f"CREATE TABLE {DB}.{table} ({COLUMNS}) ENGINE = MergeTree ORDER BY (_partition, _offset) "
            "SETTINGS non_replicated_deduplication_window = 0")
    run_sql(f"SYSTEM STOP MERGES {DB}.{table}")      # one part per insert, no merge on the clock


def eo_where(deadline_ms):
    return (f"WHERE (SELECT throwIf(toUnixTimestamp64Milli(now64(3)) > {deadline_ms}, "
            f"'{DEADLINE_PASSED}')) = 0 "
            f"AND throwIf(toUnixTimestamp(nowInBlock()) * 1000 + 999 > {deadline_ms}, "
            f"'{DEADLINE_PASSED}') = 0")


def sample(shape, n, body, path, srv, helper, tables, reps):
    """(cpu s, wall s, cpu s by thread group) of inserting `body` (n rows) by `shape` `reps` times,
    PER_TABLE times into each of `tables` in turn."""
    reqs = []
    for k in range(reps):
        table = tables[k // PER_TABLE]
        ref = f"`{DB}`.`{table}`"
        deadline = int(time.time() * 1000) + 30_000
        if shape in ("a", "b"):
            sql = (f"INSERT INTO {ref} FORMAT JSONEachRow" if shape == "a" else
                   f"INSERT INTO {ref} SELECT * FROM input() {eo_where(deadline)} FORMAT JSONEachRow")
            settings = [("query_id", str(uuid.uuid4()))] + SETTINGS + [
                ("insert_deduplication_token", f"sluice-bench:{table}:{k * n}-{k * n + n - 1}")]
            reqs.append((sql, settings))
        else:
            sql = f"INSERT INTO {ref} SELECT * FROM file('{path}', JSONEachRow, '{STRUCTURE}')"
            reqs.append((sql + " " + eo_where(deadline) if shape == "d" else sql, None))
    pid = srv.pid if shape in ("a", "b") else helper.pid
    t0 = threads_of(pid)
    c0, w0 = cpu_of(pid), time.perf_counter()
    for sql, settings in reqs:
        if settings is None:
            helper.run(sql)
            continue
        status, text = srv.request(sql, body, settings, chunked=True)
        if status != 200:
            raise RuntimeError(f"{shape}: {status} {text[:500]}")
    w1, c1 = time.perf_counter(), cpu_of(pid)
    return c1 - c0, w1 - w0, by_group(t0, threads_of(pid), c1 - c0)


def machine():
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import chdb
        info["chdb"] = chdb.__version__
    except ImportError:
        pass
    info["load_1m_start"] = round(os.getloadavg()[0], 2)
    return info


def run(work, srv, helper, info):
    samples, failed = [], []
    for n in ROWS:
        body = rows(n)
        path = os.path.join(work, f"rows-{n}.json")
        with open(path, "wb") as f:
            f.write(body)
        reps = max(1, min(SAMPLE_ROWS // n, MAX_INSERTS))
        for r in range(-1, ROUNDS):            # round -1: the warm-up, not kept
            for shape in SHAPES:
                run_sql = srv.ch if shape in ("a", "b") else helper.run
                tables = [f"t_{shape}_{n}_{r + 1}_{i}" for i in range((reps + PER_TABLE - 1) // PER_TABLE)]
                for table in tables:
                    create(run_sql, table)
                prof = PROFILE and shape in ("a", "b") and profile_totals(srv, work)
                cpu, wall, groups = sample(shape, n, body, path, srv, helper, tables, reps)
                if prof:
                    after = profile_totals(srv, work)
                    prof = {k: round((v - prof.get(k, 0.0)) / reps, 6) for k, v in after.items()}
                for i, table in enumerate(tables):
                    count = run_sql(f"SELECT count() FROM {DB}.{table}")
                    if int(count) != n * min(PER_TABLE, reps - i * PER_TABLE):
                        failed.append((shape, n, r, table, count))
                    run_sql(f"DROP TABLE {DB}.{table} SYNC")
                print(f"  {n} rows x{reps} round {r} {shape}: cpu {cpu / reps:.4f} s, "
                      f"wall {wall / reps:.4f} s per insert", file=sys.stderr, flush=True)
                if r >= 0:
                    samples.append({"shape": shape, "rows": n, "inserts": reps, "bytes": len(body),
                                    "round": r, "cpu_s": round(cpu / reps, 5), "wall_s": round(wall / reps, 5),
                                    "threads_s": {k: round(v / reps, 5) for k, v in groups.items()},
                                    **({"profile_s": prof} if prof else {})})
    return samples, failed


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--helper":
        return helper_main(sys.argv[2])
    if len(sys.argv) > 2 and sys.argv[1] == "--instrumented-server":
        return instrumented_server(sys.argv[2], sys.argv[3:])
    if PROFILE and MODE != "private":
        raise SystemExit("BENCH_PROFILE needs the private server")
    work = tempfile.mkdtemp(prefix="sluice-bench-server-")
    srv = helper = None
    try:
        srv = start_private(work) if MODE == "private" else stack_server()
        helper = Helper(work) if {"c", "d"} & set(SHAPES) else None
        info = machine()
        info.update(server=MODE, server_script=os.path.relpath(SERVER_SCRIPT, REPO), profiled=PROFILE,
                    engine=srv.ch("SELECT version()"))
        for ch in (srv.ch, helper and helper.run):
            if ch:
                ch(f"DROP DATABASE IF EXISTS {DB}")
                ch(f"CREATE DATABASE {DB}")
        samples, failed = run(work, srv, helper, info)
        for ch in (srv.ch, helper and helper.run):
            if ch:
                ch(f"DROP DATABASE IF EXISTS {DB}")
    finally:
        if helper is not None:
            helper.stop()
        if srv is not None and MODE == "private":
            srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    info["load_1m_end"] = round(os.getloadavg()[0], 2)
    table = summary(samples)
    print(render(table, info))
    if OUT != "-":
        with open(os.path.join(OUT, "bench-server.json"), "w") as f:
            json.dump({"machine": info, "summary": table, "samples": samples}, f, indent=1)
            f.write("\n")
    if failed:
        print(f"tables without exactly their rows: {failed}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- the report
def summary(samples):
    """Per (rows, shape): medians over the rounds; the ratio to a as the median of the per-round
    ratios (a and the shape measured side by side in the same round)."""
    out = []
    for n in ROWS:
        by = {sh: sorted((s for s in samples if s["rows"] == n and s["shape"] == sh),
                         key=lambda s: s["round"]) for sh in SHAPES}
        for sh in SHAPES:
            ss = by[sh]
            if not ss:
                continue
            cpu = statistics.median(s["cpu_s"] for s in ss)
            row = {"shape": sh, "what": NAMES[sh], "rows": n, "bytes": ss[0]["bytes"],
                   "inserts_per_sample": ss[0]["inserts"], "rounds": len(ss),
                   "cpu_s": round(cpu, 5), "cpu_min_s": min(s["cpu_s"] for s in ss),
                   "cpu_max_s": max(s["cpu_s"] for s in ss), "us_per_row": round(cpu / n * 1e6, 3),
                   "wall_s": round(statistics.median(s["wall_s"] for s in ss), 5),
                   "threads_s": {g: round(statistics.median(s["threads_s"].get(g, 0.0) for s in ss), 5)
                                 for g in sorted({g for s in ss for g in s["threads_s"]})}}
            if any("profile_s" in s for s in ss):
                keys = sorted({k for s in ss for k in s.get("profile_s", {})})
                row["profile_s"] = {k: round(statistics.median(s.get("profile_s", {}).get(k, 0.0)
                                                               for s in ss), 6) for k in keys}
            if by.get("a") and sh != "a":
                pairs = [s["cpu_s"] / a["cpu_s"] for s, a in zip(ss, by["a"]) if a["cpu_s"] > 0]
                row["ratio_to_a"] = round(statistics.median(pairs), 3) if pairs else None
            plain = {"b": "a", "d": "c"}.get(sh)
            if by.get(plain):       # what the exactly-once WHERE adds: b - a, d - c, round by round
                row["extra_s"] = round(statistics.median(s["cpu_s"] - p["cpu_s"] for s, p in zip(ss, by[plain])), 5)
            out.append(row)
    return out


def render(table, info):
    lines = [f"CPU per insert ({info['server']} chdb_server {info['server_script']}, ClickHouse "
             f"{info['engine']}{', instrumented' if info['profiled'] else ''}; {info.get('cpus')} CPUs, "
             f"{info.get('cpu', '?')}; load {info['load_1m_start']} -> {info['load_1m_end']})", "",
             "| shape | rows | bytes | CPU s (median) | min..max | µs/row | wall s | ratio to a "
             "| WHERE adds, ms (b-a, d-c) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in table:
        ratio = "1" if r["shape"] == "a" else f"{r['ratio_to_a']:.3f}" if r.get("ratio_to_a") else ""
        extra = f"{r['extra_s'] * 1e3:.2f}" if "extra_s" in r else ""
        lines.append(f"| {r['shape']} {r['what']} | {r['rows']:,} | {r['bytes']:,} | {r['cpu_s']:.4f} | "
                     f"{r['cpu_min_s']:.4f}..{r['cpu_max_s']:.4f} | {r['us_per_row']:.2f} | "
                     f"{r['wall_s']:.4f} | {ratio} | {extra} |")
    groups = sorted({g for r in table for g in r["threads_s"]})
    lines += ["", "CPU ms per insert by thread (medians)", "",
              "| shape | rows | " + " | ".join(groups) + " |", "| --- | ---: |" + " ---: |" * len(groups)]
    for r in table:
        lines.append(f"| {r['shape']} | {r['rows']:,} | "
                     + " | ".join(f"{r['threads_s'].get(g, 0) * 1e3:.2f}" for g in groups) + " |")
    prof = [r for r in table if "profile_s" in r]
    if prof:
        steps = sorted({k for r in prof for k, v in r["profile_s"].items() if v})
        lines += ["", "request threads' CPU ms per insert by step (instrumented server, medians)", "",
                  "| step | " + " | ".join(f"{r['shape']} {r['rows']:,}" for r in prof) + " |",
                  "| --- |" + " ---: |" * len(prof)]
        for k in steps:
            lines.append(f"| {k} | " + " | ".join(f"{r['profile_s'].get(k, 0) * 1e3:.3f}" for r in prof) + " |")
    return "\n".join(lines)


def cleanup():
    for p in CHILDREN:
        if p.poll() is None:
            p.terminate()
    for p in CHILDREN:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


if __name__ == "__main__":
    status = 1
    try:
        status = main()
    finally:
        cleanup()
    sys.exit(status)
