#!/usr/bin/env python3
"""Tests for stack/chdb_server.py (stdlib only; run with the chDB venv python).

Each test class starts a private server on a free 127.0.0.1 port over a temp data dir,
talks to it with http.client (raw sockets for chunked / truncated bodies) and stops it with SIGTERM.
Run:  "$(scripts/install-chdb.sh)" stack/test_chdb_server.py -v
"""
import http.client
import json
import os
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
    def __init__(self, path, port=None):
        self.path, self.port = path, port or free_port()
        self.proc = subprocess.Popen([sys.executable, SERVER, "--path", path, "--port", str(self.port)],
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


if __name__ == "__main__":
    unittest.main()
