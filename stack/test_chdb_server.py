#!/usr/bin/env python3
"""Tests for stack/chdb_server.py (stdlib only; run with the chDB venv python).

Each test class starts a private server on a free 127.0.0.1 port over a temp data dir,
talks to it with http.client (raw sockets for chunked / truncated bodies) and stops it with SIGTERM.
Run:  "$(scripts/install-chdb.sh)" stack/test_chdb_server.py -v
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chdb_server.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, path, port=None, args=()):
        self.path, self.port = path, port or free_port()
        self.proc = subprocess.Popen([sys.executable, SERVER, "--path", path, "--port", str(self.port), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if self.request("GET", "/ping")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("chdb_server did not start")

    def request(self, method, url, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request(method, url, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data, dict(r.getheaders())

    def q(self, sql, data=None, **params):
        """Query in the body, or (with data) query in the URL and data in the body."""
        if data is None:
            return self.request("POST", "/?" + urllib.parse.urlencode(params), sql.encode())
        return self.request("POST", "/?" + urllib.parse.urlencode({"query": sql, **params}), data)

    def value(self, sql, **params):
        status, body, _ = self.q(sql, **params)
        assert status == 200, body
        return body.decode().strip()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


class ChdbServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.s = Server(os.path.join(cls.tmp.name, "data"))
        cls.s.value("CREATE TABLE t (a UInt64, s String) ENGINE = MergeTree ORDER BY a")

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()
        cls.tmp.cleanup()

    def setUp(self):
        self.s.value("TRUNCATE TABLE t")

    def test_ping(self):
        self.assertEqual(self.s.request("GET", "/ping")[:2], (200, b"Ok.\n"))
        self.assertEqual(self.s.request("HEAD", "/ping")[0], 200)

    def test_select_formats_and_headers(self):
        st, body, h = self.s.request("GET", "/?query=SELECT%201%20AS%20x&default_format=JSONEachRow&query_id=q1")
        self.assertEqual((st, body), (200, b'{"x":1}\n'))
        self.assertEqual(h["X-ClickHouse-Format"], "JSONEachRow")
        self.assertEqual(h["X-ClickHouse-Query-Id"], "q1")
        self.assertEqual(self.s.value("SELECT 1, 'a' FORMAT CSV"), '1,"a"')

    def test_blank_lines_in_jsoneachrow_body(self):
        rows = b"".join(b'{"a":%d,"s":"x"}\n\n\n' % i for i in range(1000))
        st, body, _ = self.s.q("INSERT INTO t FORMAT JSONEachRow", rows, async_insert=0)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT count(), uniqExact(a) FROM t"), "1000\t1000")

    def test_insert_inline_in_body_with_blank_lines(self):
        st, body, _ = self.s.q('INSERT INTO t FORMAT JSONEachRow\n{"a":1,"s":"x"}\n\n{"a":2,"s":"y"}\n')
        self.assertEqual(st, 200, body)
        self.assertEqual(self.s.q("INSERT INTO t (a, s) VALUES (3, 'z')")[0], 200)
        self.assertEqual(self.s.value("SELECT groupArray(a) FROM (SELECT a FROM t ORDER BY a)"), "[1,2,3]")

    def test_params_in_insert_head_and_select(self):
        st, body, _ = self.s.q("INSERT INTO {db:Identifier}.{tb:Identifier} FORMAT JSONEachRow",
                               b'{"a":7,"s":"p"}\n', param_db="default", param_tb="t", async_insert=0)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT s FROM t WHERE a = {n:UInt64} AND s = {v:String}",
                                      param_n="7", param_v="p"), "p")
        st, body, h = self.s.q("INSERT INTO {tb:Identifier} FORMAT JSONEachRow", b"{}\n", param_tb="no`pe")
        self.assertEqual((st, h["X-ClickHouse-Exception-Code"]), (404, "60"))

    def test_multipart_params_like_rust_client(self):
        b = "XyZbOuNdArY"
        body = "".join(f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in
                       [("query", "SELECT {x:String}, {n:UInt8}"), ("param_x", "a\\tb"), ("param_n", "5")])
        body += f"--{b}--\r\n"
        st, data, _ = self.s.request("POST", "/", body.encode(),
                                     {"Content-Type": f"multipart/form-data; boundary={b}"})
        self.assertEqual((st, data), (200, b"a\\tb\t5\n"))

    def test_errors(self):
        for sql, status, code in [("SELECT * FROM nope", 404, 60), ("SELEC 1", 400, 62),
                                  ("SELECT 1 FROM nodb.t", 404, 81), ("SELECT throwIf(1)", 500, 395)]:
            st, body, h = self.s.q(sql)
            self.assertEqual((st, h.get("X-ClickHouse-Exception-Code")), (status, str(code)), body)
            self.assertTrue(body.startswith(b"Code: %d. DB::Exception: " % code), body)
        st, body, h = self.s.q("INSERT INTO t FORMAT JSONEachRow", b'{"a":"x"}\n')
        self.assertEqual(st, 400, body)
        st, _, h = self.s.q("SELECT 1", bogus_setting=1)
        self.assertEqual((st, h["X-ClickHouse-Exception-Code"]), (404, "115"))

    def test_settings_applied_per_query(self):
        self.assertEqual(self.s.value("SELECT getSetting('max_execution_time'), getSetting('async_insert')",
                                      max_execution_time=5, async_insert=0), "5\tfalse")
        self.assertEqual(self.s.value("SELECT getSetting('async_insert')"), "true")  # not leaked

    def test_row_numbers_count_from_the_parsing_segment(self):
        rows = b"".join(b'{"a":%d,"s":"x"}\n' % i for i in range(200)).replace(b'{"a":150,', b'{"a":"bad",')
        for extra, want in [({}, None), ({"input_format_parallel_parsing": 0}, 151)]:
            st, body, _ = self.s.q("INSERT INTO t FORMAT JSONEachRow", rows, async_insert=0,
                                   min_chunk_bytes_for_parallel_parsing=1000, **extra)
            self.assertEqual(st, 400, body)
            row = int(re.search(rb"\(at row (\d+)\)", body).group(1))
            if want is None:       # segments of >= 1000 bytes: row 151 is not the first of its segment
                self.assertLess(row, 151, body)
            else:
                self.assertEqual(row, want, body)

    def _raw(self, head, payload, close_early=False):
        sock = socket.create_connection(("127.0.0.1", self.s.port))
        sock.sendall(head + payload)
        if close_early:
            sock.close()
            return None
        resp = b""
        while b"\r\n\r\n" not in resp:
            resp += sock.recv(65536)
        sock.close()
        return resp

    def test_chunked_body(self):
        url = "/?" + urllib.parse.urlencode({"query": "INSERT INTO t FORMAT JSONEachRow", "async_insert": "0"})
        head = f"POST {url} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        chunks = [b'{"a":1,"s":"x"}\n{"a":', b'2,"s":"y"}\n\n', b'{"a":3,"s":"z"}\n']
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        self.assertTrue(self._raw(head, payload).startswith(b"HTTP/1.1 200"))
        self.assertEqual(self.s.value("SELECT count() FROM t"), "3")

    def test_truncated_body_is_not_committed(self):
        url = "/?" + urllib.parse.urlencode({"query": "INSERT INTO t FORMAT JSONEachRow", "async_insert": "0"})
        for te in (b"Transfer-Encoding: chunked", b"Content-Length: 100000"):
            head = b"POST " + url.encode() + b" HTTP/1.1\r\nHost: x\r\n" + te + b"\r\n\r\n"
            data = b'{"a":1,"s":"x"}\n' * 100
            payload = (b"%x\r\n%s\r\n" % (len(data), data)) if te.startswith(b"Transfer") else data
            self._raw(head, payload, close_early=True)
        time.sleep(1)
        self.assertEqual(self.s.value("SELECT count() FROM t"), "0")

    def test_concurrent_inserts_and_selects(self):
        errors = []

        def worker(i):
            try:
                for j in range(5):
                    rows = b"".join(b'{"a":%d,"s":"c"}\n' % (i * 100000 + j * 1000 + k) for k in range(1000))
                    st, body, _ = self.s.q("INSERT INTO t FORMAT JSONEachRow", rows, async_insert=0)
                    assert st == 200, body
                    self.s.value("SELECT count() FROM t")
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ths = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        [t.start() for t in ths]
        [t.join() for t in ths]
        self.assertEqual(errors, [])
        self.assertEqual(self.s.value("SELECT count() FROM t"), "30000")


class ProfileTest(unittest.TestCase):
    def test_profile_settings_apply_under_the_requests_own(self):
        with tempfile.TemporaryDirectory() as tmp:
            s = Server(os.path.join(tmp, "data"), args=["--profile=limit=2"])
            try:
                self.assertEqual(s.value("SELECT count() FROM (SELECT number FROM numbers(5))"), "5")
                self.assertEqual(s.value("SELECT number FROM numbers(5) FORMAT CSV"), "0\n1")
                self.assertEqual(s.value("SELECT number FROM numbers(5) FORMAT CSV", limit=0), "0\n1\n2\n3\n4")
            finally:
                s.stop()


class DedupAndRestartTest(unittest.TestCase):
    def test_token_dedup_projection_and_restart(self):
        with tempfile.TemporaryDirectory() as tmp:
            s = Server(os.path.join(tmp, "data"))
            s.value("CREATE TABLE d (_topic String, _partition UInt32, _offset UInt64, "
                    "PROJECTION p (SELECT _topic, _partition, max(_offset) GROUP BY _topic, _partition)) "
                    "ENGINE = MergeTree ORDER BY (_topic, _partition, _offset) "
                    "SETTINGS non_replicated_deduplication_window = 100, deduplicate_merge_projection_mode = 'rebuild'")
            ins = dict(async_insert=0)
            for tok, off in [("k1", 1), ("k1", 1), ("k2", 2)]:
                row = json.dumps({"_topic": "t", "_partition": 0, "_offset": off}).encode() + b"\n"
                self.assertEqual(s.q("INSERT INTO d FORMAT JSONEachRow", row, insert_deduplication_token=tok,
                                     **ins)[0], 200)
            self.assertEqual(s.value("SELECT count(), max(_offset) FROM d"), "2\t2")
            self.assertEqual(s.stop(), 0)
            s = Server(s.path, s.port)                      # same data dir: same tables, same dedup log
            row = b'{"_topic":"t","_partition":0,"_offset":1}\n'
            s.q("INSERT INTO d FORMAT JSONEachRow", row, insert_deduplication_token="k1", **ins)
            self.assertEqual(s.value("SELECT _topic, _partition, max(_offset) FROM d GROUP BY ALL"), "t\t0\t2")
            self.assertEqual(s.value("SELECT count() FROM d"), "2")
            t0 = time.time()
            self.assertEqual(s.stop(), 0)
            self.assertLess(time.time() - t0, 10)


def wait_until(fn, timeout=10.0):
    """Poll fn() until it is truthy; its last value."""
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v or time.time() > deadline:
            return v
        time.sleep(0.05)


class SlowInsert:
    """An INSERT whose body is sent by hand over a raw socket, piece by piece (chunked or Content-Length)."""

    def __init__(self, port, query, chunked=True, length=1 << 20, **params):
        self.chunked = chunked
        self.sock = socket.create_connection(("127.0.0.1", port))
        url = "/?" + urllib.parse.urlencode({"query": query, **params})
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"
        self.sock.sendall(f"POST {url} HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode())

    def send(self, data):
        self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    def finish(self):
        if self.chunked:
            self.sock.sendall(b"0\r\n\r\n")

    def response(self):
        """(status, exception code or None, body) of the answer; the server closes the connection after it."""
        self.sock.settimeout(30)
        resp = b""
        while True:
            data = self.sock.recv(65536)
            if not data:
                break
            resp += data
            head, sep, body = resp.partition(b"\r\n\r\n")
            m = re.search(rb"Content-Length: (\d+)", head)
            if sep and m and len(body) >= int(m.group(1)):
                break
        self.sock.close()
        head, _, body = resp.partition(b"\r\n\r\n")
        code = re.search(rb"X-ClickHouse-Exception-Code: (\d+)", head)
        return int(head.split()[1]), code and int(code.group(1)), body


class ProcessListTest(unittest.TestCase):
    """system.processes shows the server's running queries by query_id; KILL QUERY ends them."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.s = Server(os.path.join(cls.tmp.name, "data"))
        cls.s.value("CREATE TABLE p (a UInt64) ENGINE = MergeTree ORDER BY a")

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()
        cls.tmp.cleanup()

    def setUp(self):
        self.s.value("TRUNCATE TABLE p")

    def running(self, qid):
        return int(self.s.value("SELECT count() FROM system.processes WHERE query_id = {q:String}", param_q=qid))

    def test_slow_insert_is_listed_refuses_its_id_and_is_killed(self):
        ins = SlowInsert(self.s.port, "INSERT INTO p FORMAT JSONEachRow", query_id="slow-1", async_insert=0)
        ins.send(b'{"a":1}\n')
        self.assertTrue(wait_until(lambda: self.running("slow-1") == 1))
        row = self.s.value("SELECT query, user, is_initial_query, is_cancelled, current_database, elapsed > 0 "
                           "FROM system.processes WHERE query_id = 'slow-1'")
        self.assertEqual(row, "INSERT INTO p FORMAT JSONEachRow\tdefault\t1\t0\tdefault\t1")
        ins.send(b'{"a":2}\n')

        st, body, h = self.s.q("SELECT 1", query_id="slow-1")        # same id while it runs
        self.assertEqual((st, h["X-ClickHouse-Exception-Code"]), (500, "216"), body)
        self.assertIn(b"QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING", body)

        st, body, _ = self.s.q("KILL QUERY WHERE query_id = 'slow-1' SYNC")
        self.assertEqual((st, body), (200, b"finished\tslow-1\tdefault\tINSERT INTO p FORMAT JSONEachRow\n"))
        self.assertEqual(self.running("slow-1"), 0)                    # gone when SYNC returns
        status, code, body = ins.response()
        self.assertEqual((status, code), (500, 394), body)
        self.assertTrue(body.startswith(b"Code: 394. DB::Exception: Query was cancelled."), body)
        self.assertEqual(self.s.value("SELECT count() FROM p"), "0")  # never committed
        self.assertEqual(self.s.value("SELECT 1", query_id="slow-1"), "1")  # the id is free again

    def test_slow_insert_that_is_not_killed_commits_and_leaves_the_list(self):
        ins = SlowInsert(self.s.port, "INSERT INTO p FORMAT JSONEachRow", query_id="slow-0", async_insert=0)
        for i in range(3):
            ins.send(b'{"a":%d}\n' % i)
            self.assertTrue(wait_until(lambda: self.running("slow-0") == 1))
            time.sleep(0.2)
        ins.finish()
        status, code, body = ins.response()
        self.assertEqual((status, code), (200, None), body)
        self.assertEqual(self.running("slow-0"), 0)
        self.assertEqual(self.s.value("SELECT groupArray(a) FROM (SELECT a FROM p ORDER BY a)"), "[0,1,2]")

    def test_kill_async_lowercase_with_params_and_format_content_length_body(self):
        ins = SlowInsert(self.s.port, "INSERT INTO p FORMAT JSONEachRow", chunked=False, query_id="slow-2",
                         async_insert=0)
        ins.send(b'{"a":1}\n')
        self.assertTrue(wait_until(lambda: self.running("slow-2") == 1))
        st, body, _ = self.s.q("kill query where query_id = {id:String} async format JSONEachRow", param_id="slow-2")
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body), {"kill_status": "waiting", "query_id": "slow-2", "user": "default",
                                            "query": "INSERT INTO p FORMAT JSONEachRow"})
        self.assertTrue(wait_until(lambda: self.running("slow-2") == 0))   # as the sink's fence polls
        self.assertEqual(ins.response()[:2], (500, 394))
        self.assertEqual(self.s.value("SELECT count() FROM p"), "0")

    def test_replace_running_query(self):
        ins = SlowInsert(self.s.port, "INSERT INTO p FORMAT JSONEachRow", query_id="slow-3", async_insert=0)
        ins.send(b'{"a":1}\n')
        self.assertTrue(wait_until(lambda: self.running("slow-3") == 1))
        st, body, _ = self.s.q("INSERT INTO p FORMAT JSONEachRow", b'{"a":2}\n', query_id="slow-3",
                               replace_running_query=1, async_insert=0)
        self.assertEqual(st, 200, body)
        self.assertEqual(ins.response()[:2], (500, 394))
        self.assertEqual(self.s.value("SELECT groupArray(a) FROM p"), "[2]")

    def test_processes_table_forms_and_the_querying_request(self):
        st, body, _ = self.s.q("SELECT query_id, query_kind, is_cancelled FROM system.processes", query_id="me-1")
        self.assertEqual((st, body), (200, b"me-1\tSelect\t0\n"))         # the request itself, only
        hdr = {"X-ClickHouse-Query-Id": "me-2"}
        sql = b"SELECT count() FROM `SYSTEM`.`Processes` WHERE query_id = 'me-2'"
        st, body, _ = self.s.request("POST", "/", sql, hdr)
        self.assertEqual((st, body), (200, b"1\n"))
        self.assertEqual(self.s.value("SELECT count() FROM (SELECT * FROM system . processes) AS x "
                                      "WHERE x.query_id = 'none'"), "0")
        listed = self.s.value("SHOW PROCESSLIST FORMAT JSONEachRow", query_id="me-3")
        self.assertEqual(listed.count('"query_id":"me-3"'), 1)
        self.assertEqual(self.s.value("SELECT 'system.processes'"), "system.processes")  # a string stays a string

    def test_kill_of_a_plain_query_waits_for_its_end(self):
        # A non-streaming query (conn.query) cannot be stopped inside chDB: it ends normally, SYNC waits.
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("r", self.s.q("SELECT sleep(1)", query_id="sel-1")))
        t.start()
        self.assertTrue(wait_until(lambda: self.running("sel-1") == 1))
        st, body, _ = self.s.q("KILL QUERY WHERE query_id = 'sel-1' TEST")
        self.assertEqual((st, body), (200, b"unknown_status\tsel-1\tdefault\tSELECT sleep(1)\n"))
        st, body, _ = self.s.q("KILL QUERY WHERE query_id = 'sel-1' SYNC")
        self.assertEqual((st, body), (200, b"finished\tsel-1\tdefault\tSELECT sleep(1)\n"))
        self.assertEqual(self.running("sel-1"), 0)
        t.join()
        self.assertEqual(got["r"][:2], (200, b"0\n"))
        self.assertEqual(self.s.q("KILL QUERY WHERE query_id = 'nobody' SYNC")[:2], (200, b""))


class InsertSelectInputTest(unittest.TestCase):
    """INSERT INTO t SELECT ... FROM input(...) ... FORMAT f with the data in the body really runs."""

    DEADLINE = ("INSERT INTO db.t SELECT * FROM input() WHERE (SELECT throwIf(toUnixTimestamp64Milli(now64(3)) > "
                "{ms}, 'sluice: attempt deadline passed')) = 0 FORMAT JSONEachRow")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.s = Server(os.path.join(cls.tmp.name, "data"))
        cls.s.value("CREATE DATABASE db")
        cls.s.value("CREATE TABLE db.t (a UInt64, s String DEFAULT 'dflt', m UInt64 MATERIALIZED a * 2, "
                    "e String EPHEMERAL, x String ALIAS upper(s)) ENGINE = MergeTree ORDER BY a "
                    "SETTINGS non_replicated_deduplication_window = 100")

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()
        cls.tmp.cleanup()

    def setUp(self):
        self.s.value("TRUNCATE TABLE db.t")

    def rows(self):
        return self.s.value("SELECT groupArray((a, s, m)) FROM (SELECT a, s, m FROM db.t ORDER BY a)")

    def test_input_without_structure_takes_the_table_columns_and_defaults(self):
        st, body, h = self.s.q('INSERT INTO db.t SELECT * FROM input() FORMAT JSONEachRow\n'
                               '{"a":1}\n\n{"a":2,"s":"x"}\n', async_insert=0)
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(h["X-ClickHouse-Summary"])["written_rows"], "2")
        self.assertEqual(self.rows(), "[(1,'dflt',2),(2,'x',4)]")
        # the column list of the INSERT is the structure; the data after FORMAT in the URL, then the body
        st, body, _ = self.s.q("INSERT INTO `db`.`t` (s, a) SELECT * FROM input() FORMAT CSV\n\"q\",5", b'"r",6\n')
        self.assertEqual(st, 200, body)
        self.assertEqual(self.rows(), "[(1,'dflt',2),(2,'x',4),(5,'q',10),(6,'r',12)]")

    def test_input_with_structure_and_params(self):
        sql = ("INSERT INTO {d:Identifier}.t (a, s) SELECT a * 10, concat(s, {sfx:String}) "
               "FROM input('a UInt64, s String') FORMAT JSONEachRow")
        data = b"".join(b'{"a":%d,"s":"v\\t\\\\%d"}\n' % (i, i) for i in range(1, 20001))
        st, body, h = self.s.q(sql, data, param_d="db", param_sfx="!")
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(h["X-ClickHouse-Summary"])["written_rows"], "20000")
        self.assertEqual(self.s.value("SELECT count(), sum(a), "
                                      "countIf(s = concat('v\\t\\\\', toString(intDiv(a, 10)), '!')) FROM db.t"),
                         "20000\t2000100000\t20000")

    def test_deadline_guard(self):
        data = b'{"a":1}\n{"a":2}\n'
        st, body, h = self.s.q(self.DEADLINE.format(ms=946684800000), data, async_insert=0)   # 2000-01-01: past
        self.assertEqual((st, h.get("X-ClickHouse-Exception-Code")), (500, "395"), body)
        self.assertIn(b"sluice: attempt deadline passed", body)
        self.assertEqual(self.s.value("SELECT count() FROM db.t"), "0")
        st, body, _ = self.s.q(self.DEADLINE.format(ms=4102444800000), data, async_insert=0)  # 2100: future
        self.assertEqual(st, 200, body)
        self.assertEqual(self.rows(), "[(1,'dflt',2),(2,'dflt',4)]")

    def test_a_violated_check_is_reported_and_stores_nothing(self):
        # chDB's streaming insert drops such a block silently; the server must say 469.
        st, body, _ = self.s.q("CREATE TABLE db.c (n UInt32, s String DEFAULT 'd', CONSTRAINT c CHECK n < 10) "
                               "ENGINE = MergeTree ORDER BY n")
        self.assertEqual(st, 200, body)
        st, body, h = self.s.q("INSERT INTO db.c FORMAT JSONEachRow", b'{"n":1}\n{"n":50}\n', async_insert=0)
        self.assertEqual((st, h.get("X-ClickHouse-Exception-Code")), (500, "469"), body)
        self.assertEqual(self.s.value("SELECT count() FROM db.c"), "0")
        st, body, h = self.s.q("INSERT INTO db.c FORMAT JSONEachRow", b'{"n":1}\n\n{"n":2,"s":"x"}\n',
                               async_insert=0)
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(h["X-ClickHouse-Summary"])["written_rows"], "2")
        self.assertEqual(self.s.value("SELECT groupArray((n, s)) FROM (SELECT * FROM db.c ORDER BY n)"),
                         "[(1,'d'),(2,'x')]")

    def test_an_insert_over_the_partition_limit_is_reported_and_stores_nothing(self):
        # chDB's streaming insert drops such a block silently and counts its rows as written.
        st, body, _ = self.s.q("CREATE TABLE db.p (n UInt32) ENGINE = MergeTree PARTITION BY n ORDER BY n")
        self.assertEqual(st, 200, body)
        data = b"".join(b'{"n":%d}\n' % i for i in range(150))
        st, body, h = self.s.q("INSERT INTO db.p FORMAT JSONEachRow", data, async_insert=0)
        self.assertEqual((st, h.get("X-ClickHouse-Exception-Code")), (500, "252"), body)
        self.assertEqual(self.s.value("SELECT count() FROM db.p"), "0")
        st, body, h = self.s.q("INSERT INTO db.p FORMAT JSONEachRow", data[:data.index(b'{"n":100}')],
                               async_insert=0)
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(h["X-ClickHouse-Summary"])["written_rows"], "100")
        self.assertEqual(self.s.value("SELECT count() FROM db.p"), "100")

    def test_a_plain_insert_sent_again_is_deduplicated_by_its_rows(self):
        st, body, _ = self.s.q("CREATE TABLE db.d (n UInt32) ENGINE = MergeTree ORDER BY n "
                               "SETTINGS non_replicated_deduplication_window = 10")
        self.assertEqual(st, 200, body)
        for _ in range(2):
            st, body, _ = self.s.q("INSERT INTO db.d FORMAT JSONEachRow", b'{"n":1}\n{"n":2}\n',
                                   async_insert=0, deduplicate_insert="enable")
            self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT count() FROM db.d"), "2")
        st, body, _ = self.s.q("INSERT INTO db.d FORMAT JSONEachRow", b'{"n":1}\n{"n":2}\n',
                               async_insert=0, deduplicate_insert="disable")
        self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT count() FROM db.d"), "4")

    def test_data_that_is_not_utf8_is_inserted_as_sent(self):
        st, body, _ = self.s.q("CREATE TABLE db.b (n UInt32, s String) ENGINE = MergeTree ORDER BY n")
        self.assertEqual(st, 200, body)
        for sql in ("INSERT INTO db.b FORMAT JSONEachRow",
                    "INSERT INTO db.b SELECT * FROM input() FORMAT JSONEachRow"):
            st, body, _ = self.s.q(sql, b'{"n":1,"s":"\xff\x00\x01"}\n', async_insert=0)
            self.assertEqual(st, 200, (sql, body))
        self.assertEqual(self.s.value("SELECT groupArray(hex(s)) FROM db.b"), "['FF0001','FF0001']")

    def test_settings_apply_to_insert_select(self):
        st, body, _ = self.s.q("INSERT INTO db.t SELECT a, toString(getSetting('max_execution_time')) "
                               "FROM input('a UInt64') FORMAT JSONEachRow", b'{"a":1}\n', max_execution_time=7)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT s FROM db.t"), "7")
        for _ in range(2):
            st, body, _ = self.s.q(self.DEADLINE.format(ms=4102444800000), b'{"a":9}\n',
                                   insert_deduplication_token="tok-9", async_insert=0)
            self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT count() FROM db.t WHERE a = 9"), "1")

    def test_errors_and_unsupported_shapes_never_answer_200(self):
        cases = [
            # INSERT ... SELECT without input() followed by data: the data would be ignored
            ("INSERT INTO db.t SELECT 1, 'x' FORMAT JSONEachRow", b'{"a":1}\n', 501, "48"),
            ("INSERT INTO db.t SELECT * FROM input() UNION ALL SELECT * FROM input() FORMAT JSONEachRow",
             b'{"a":1}\n', 501, "48"),
            ("INSERT INTO FUNCTION null('a UInt64') SELECT * FROM input() FORMAT JSONEachRow",
             b'{"a":1}\n', 501, "48"),
            ("INSERT INTO db.t (COLUMNS('a')) SELECT * FROM input() FORMAT JSONEachRow", b'{"a":1}\n', 501, "48"),
            ("INSERT INTO db.t (zz) SELECT * FROM input() FORMAT JSONEachRow", b'{"a":1}\n', 500, "16"),
            ("INSERT INTO db.nope SELECT * FROM input() FORMAT JSONEachRow", b'{"a":1}\n', 404, "60"),
            ("INSERT INTO db.t SELECT * FROM input() FORMAT JSONEachRow", b'{"a":"x"}\n', 400, None),
        ]
        for sql, data, status, code in cases:
            st, body, h = self.s.q(sql, data, async_insert=0)
            self.assertEqual(st, status, (sql, body))
            if code:
                self.assertEqual(h["X-ClickHouse-Exception-Code"], code, (sql, body))
        st, body, _ = self.s.q("INSERT INTO db.t SELECT * FROM input()\n")  # no FORMAT: no data format
        self.assertNotEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT count() FROM db.t"), "0")
        st, body, _ = self.s.q("INSERT INTO db.t SELECT number, 'n' FROM numbers(3)")  # no data: a plain query
        self.assertEqual(st, 200, body)
        self.assertEqual(self.s.value("SELECT count() FROM db.t"), "3")

    def test_slow_input_insert_is_killed_before_it_runs(self):
        ins = SlowInsert(self.s.port, self.DEADLINE.format(ms=4102444800000), query_id="slow-in")
        ins.send(b'{"a":1}\n')
        count = "SELECT count() FROM system.processes WHERE query_id = 'slow-in'"
        self.assertTrue(wait_until(lambda: self.s.value(count) == "1"))
        self.assertEqual(self.s.q("KILL QUERY WHERE query_id = 'slow-in' SYNC")[0], 200)
        self.assertEqual(ins.response()[:2], (500, 394))
        self.assertEqual(self.s.value("SELECT count() FROM db.t"), "0")


if __name__ == "__main__":
    unittest.main()
