#!/usr/bin/env python3
"""chdb_server.py — a small ClickHouse-HTTP-interface server around chDB (ClickHouse 26.9 in-process).

Data flow:
  HTTP client (Rust `clickhouse` crate without compression, curl, ...)
    -> ThreadingHTTPServer on 127.0.0.1:--port, one thread per connection
    -> per request: parse URL params / multipart form / body into (query, settings, params, database)
    -> open ONE chDB connection for this request on the shared data dir (--path),
       `USE <database>`, `SET <setting> = '<value>'` for every settings param
    -> INSERT with data:  conn.send_insert(head, format); body chunks -> insert_append(); insert_done()
       (data is never put inline after FORMAT: chDB cuts inline data at the first blank line)
       anything else:     conn.query(sql, output_format, params=...)  (chDB substitutes {name:Type})
    -> response: 200 + result bytes, or ClickHouse-style error (status by error code,
       X-ClickHouse-Exception-Code header, body "Code: N. DB::Exception: ...").
  A base chDB connection stays open for the whole life of the process (the engine shuts down when
  its last connection closes). SIGTERM/SIGINT stop the server promptly (chDB itself ignores SIGTERM).

Usage: python chdb_server.py --path DIR [--port 18123] [--host 127.0.0.1]
Known gaps: `query_id` is echoed but chDB assigns its own ids internally; no HTTP compression;
results are built in memory (no streaming of SELECT output); no sessions.
"""
import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import chdb
from chdb import state as chdb_state

CHUNK = 1 << 20           # bytes handed to insert_append at a time
HEAD_PEEK = 1 << 20       # how much of a query-less body we inspect for an INSERT head
VERSION = chdb.__version__     # replaced by the engine version (SELECT version()) at startup
# URL parameters handled by the HTTP layer; every other one is applied as a ClickHouse setting.
HTTP_ONLY = {"query", "database", "default_format", "query_id", "user", "password", "quota_key",
             "session_id", "session_timeout", "session_check", "compress", "decompress",
             "buffer_size", "wait_end_of_query", "stacktrace", "role", "client_protocol_version"}
STATUS_BY_NAME = {
    400: "BAD_ARGUMENTS CANNOT_COMPILE_REGEXP CANNOT_PARSE_TEXT CANNOT_PARSE_ESCAPE_SEQUENCE "
         "CANNOT_PARSE_QUOTED_STRING CANNOT_PARSE_DATE CANNOT_PARSE_DATETIME CANNOT_PARSE_NUMBER "
         "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING CANNOT_PARSE_IPV4 CANNOT_PARSE_IPV6 "
         "CANNOT_PARSE_INPUT_ASSERTION_FAILED CANNOT_PARSE_UUID DUPLICATE_COLUMN ILLEGAL_COLUMN "
         "UNKNOWN_ELEMENT_IN_AST UNKNOWN_TYPE_OF_AST_NODE THERE_IS_NO_COLUMN TOO_DEEP_AST TOO_BIG_AST "
         "UNEXPECTED_AST_STRUCTURE SYNTAX_ERROR INCORRECT_DATA TYPE_MISMATCH "
         "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    404: "UNKNOWN_TABLE UNKNOWN_FUNCTION UNKNOWN_IDENTIFIER UNKNOWN_TYPE UNKNOWN_STORAGE UNKNOWN_DATABASE "
         "UNKNOWN_SETTING UNKNOWN_DIRECTION_OF_SORTING UNKNOWN_AGGREGATE_FUNCTION UNKNOWN_FORMAT "
         "UNKNOWN_DATABASE_ENGINE UNKNOWN_TYPE_OF_QUERY UNKNOWN_ROLE",
    401: "REQUIRED_PASSWORD", 403: "UNKNOWN_USER WRONG_PASSWORD AUTHENTICATION_FAILED "
    "SET_NON_GRANTED_ROLE ACCESS_DENIED", 413: "QUERY_IS_TOO_LARGE", 501: "NOT_IMPLEMENTED",
    503: "SOCKET_TIMEOUT CANNOT_OPEN_FILE CANNOT_SCHEDULE_TASK", 411: "HTTP_LENGTH_REQUIRED",
    408: "TIMEOUT_EXCEEDED", 415: "UNSUPPORTED_MEDIA_TYPE",
}
STATUS_BY_CODE = {}       # filled at startup via errorCodeToName()
CODE_BY_NAME = {}
CONFIG_XML = """<clickhouse>
  <query_log><database>system</database><table>query_log</table>
    <flush_interval_milliseconds>1000</flush_interval_milliseconds></query_log>
  <part_log><database>system</database><table>part_log</table>
    <flush_interval_milliseconds>1000</flush_interval_milliseconds></part_log>
</clickhouse>
"""


class CHError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def to_ch_error(exc):
    """Turn a chDB exception into (code, 'Code: N. DB::Exception: ...') like clickhouse-server."""
    text = str(exc)
    m = re.search(r"Code: (\d+)\. DB::Exception: ", text)
    if not m:
        return CHError(1001, f"Code: 1001. DB::Exception: {text}. (STD_EXCEPTION)")
    code = int(m.group(1))
    msg = text[m.start():].rstrip()
    msg = re.sub(r"\s*\(version [^()]*(\([^()]*\))?\)$", "", msg)
    return CHError(code, f"{msg} (version {VERSION} (official build))")


def err(name, text):
    code = CODE_BY_NAME.get(name, 1001)
    return CHError(code, f"Code: {code}. DB::Exception: {text}. ({name}) (version {VERSION} (official build))")


# ---------------------------------------------------------------- SQL scanning
def scan(sql):
    """Yield (start, end, kind, depth) tokens of top-level-relevant SQL; kind: word|quote|brace|other."""
    i, n, depth = 0, len(sql), 0
    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
        elif sql.startswith("--", i) or c == "#":
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c in "'\"`":
            j = i + 1
            while j < n and sql[j] != c:
                j += 2 if sql[j] == "\\" else 1
            yield i, min(j + 1, n), "quote", depth
            i = j + 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            yield i, j, "word", depth
            i = j
        elif c == "{":
            j = sql.find("}", i)
            j = n if j < 0 else j + 1
            yield i, j, "brace", depth
            i = j
        else:
            depth += (c == "(") - (c == ")")
            yield i, i + 1, "other", depth
            i += 1


def split_insert(sql):
    """For 'INSERT ... FORMAT f <data>' / 'INSERT ... VALUES <data>' return (head, format, data_offset).

    Returns None for anything else (including INSERT ... SELECT)."""
    toks = scan(sql)
    first = next(toks, None)
    if not first or sql[first[0]:first[1]].upper() != "INSERT":
        return None
    for s, e, kind, depth in toks:
        if kind != "word" or depth != 0:
            continue
        w = sql[s:e].upper()
        if w == "VALUES":
            return sql[:s], "Values", e
        if w in ("SELECT", "WITH") :
            return None
        if w == "FORMAT":
            nxt = next(toks, None)
            if not nxt or nxt[2] != "word":
                raise err("SYNTAX_ERROR", "Syntax error: expected format name after FORMAT")
            d = nxt[1]
            while d < len(sql) and sql[d] in " \t\f":
                d += 1
            if sql.startswith("\r", d):
                d += 1
            if sql.startswith("\n", d):
                d += 1
            return sql[:s], sql[nxt[0]:nxt[1]], d
    return None


def output_format(sql):
    """The format named by a top-level trailing FORMAT clause of a query, if any."""
    fmt, prev = None, None
    for s, e, kind, depth in scan(sql):
        word = sql[s:e]
        if prev == "FORMAT" and kind == "word":
            fmt = word
        prev = word.upper() if kind == "word" and depth == 0 else None
    return fmt


def unescape_param(v):
    """ClickHouse HTTP param values use TSV escaping."""
    table = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "b": "\b", "f": "\f", "\\": "\\", "'": "'", '"': '"'}
    return re.sub(r"\\(.)", lambda m: table.get(m.group(1), m.group(1)), v)


def quote_ident(v):
    return "`" + v.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_str(v):
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def substitute(sql, params):
    """Replace {name:Type} placeholders ourselves (used for INSERT heads, which chDB can't bind)."""
    out, last = [], 0
    for s, e, kind, _ in scan(sql):
        if kind != "brace":
            continue
        m = re.fullmatch(r"\{\s*([A-Za-z_]\w*)\s*:\s*(.+?)\s*\}", sql[s:e], re.S)
        if not m:
            continue
        name, typ = m.groups()
        if name not in params:
            raise err("UNKNOWN_QUERY_PARAMETER", f"Substitution `{name}` is not set")
        raw = unescape_param(params[name])
        if typ == "Identifier":
            lit = quote_ident(raw)
        elif re.fullmatch(r"U?Int\d+", typ):
            if not re.fullmatch(r"[+-]?\d+", raw):
                raise err("BAD_QUERY_PARAMETER", f"Value {raw} cannot be parsed as {typ} for query parameter '{name}'")
            lit = raw
        elif typ == "String":
            lit = quote_str(raw)
        else:
            lit = f"CAST({quote_str(raw)} AS {typ})"
        out += [sql[last:s], lit]
        last = e
    return "".join(out) + sql[last:]


# ---------------------------------------------------------------- request bodies
class Body:
    """Reads a request body (Content-Length or chunked); remembers whether it was read completely."""

    def __init__(self, rfile, headers):
        self.rfile = rfile
        self.chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self.left = int(headers.get("Content-Length") or 0) if not self.chunked else 0
        self.done = not self.chunked and self.left == 0
        self.pending = b""

    def _raw(self):
        """Next piece of body bytes, or b'' at the end."""
        if self.done:
            return b""
        if not self.chunked:
            data = self.rfile.read(min(self.left, CHUNK))
            if not data:
                raise ConnectionError("client closed the connection mid-body")
            self.left -= len(data)
            self.done = self.left == 0
            return data
        line = self.rfile.readline(65537)
        if not line.endswith(b"\n"):
            raise ConnectionError("client closed the connection mid-body")
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass                              # trailers
            self.done = True
            return b""
        data = self.rfile.read(size)
        if len(data) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
            raise ConnectionError("client closed the connection mid-chunk")
        return data

    def chunks(self):
        """Yield pieces of about CHUNK bytes (small chunked pieces are coalesced)."""
        buf, self.pending = [self.pending] if self.pending else [], b""
        size = sum(map(len, buf))
        while True:
            data = self._raw()
            if not data:
                break
            buf.append(data)
            size += len(data)
            if size >= CHUNK:
                yield b"".join(buf)
                buf, size = [], 0
        if size:
            yield b"".join(buf)

    def peek(self, limit):
        """Read up to about `limit` bytes and keep them to be yielded again by chunks()."""
        buf = [self.pending]
        while sum(map(len, buf)) < limit and not self.done:
            buf.append(self._raw())
        self.pending = b"".join(buf)
        return self.pending

    def read_all(self):
        return b"".join(self.chunks())


def parse_multipart(body, content_type):
    """Fields of a multipart/form-data body (the Rust crate sends `query` + `param_*` this way)."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise err("BAD_ARGUMENTS", "multipart/form-data without boundary")
    fields = {}
    for part in body.split(b"--" + m.group(1).encode())[1:]:
        if part.startswith(b"--"):
            break
        head, _, value = part.partition(b"\r\n\r\n")
        name = re.search(rb'name="([^"]*)"', head)
        if name:
            fields[name.group(1).decode()] = value[:-2].decode() if value.endswith(b"\r\n") else value.decode()
    return fields


# ---------------------------------------------------------------- HTTP handler
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "chdb_server"
    # Headers and body go out in separate writes; with Nagle on, the body
    # waits for the client's delayed ACK (40 ms per request).
    disable_nagle_algorithm = True
    db_path = None

    def log_message(self, fmt, *args):
        if os.environ.get("CHDB_SERVER_LOG"):
            sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self.handle_request()

    def do_POST(self):
        self.handle_request()

    def handle_request(self):
        url = urlsplit(self.path)
        body = Body(self.rfile, self.headers)
        qid = None
        try:
            if url.path in ("/ping", "/replicas_status") or (url.path == "/" and not url.query
                                                                and body.done):
                body.read_all()
                return self.reply(200, b"Ok.\n", [("Content-Type", "text/html; charset=UTF-8")])
            if url.path != "/":
                body.read_all()
                return self.reply(404, f"There is no handle {url.path}\n".encode())
            args = dict(parse_qsl(url.query, keep_blank_values=True))
            ctype = self.headers.get("Content-Type", "")
            if ctype.startswith("multipart/form-data"):
                args.update(parse_multipart(body.read_all(), ctype))
            qid = args.get("query_id") or self.headers.get("X-ClickHouse-Query-Id") or str(uuid.uuid4())
            self.run_query(args, body, qid)
        except CHError as e:
            if not body.done:
                self.close_connection = True      # unread body: cannot reuse the connection
            hdrs = [("X-ClickHouse-Exception-Code", str(e.code)), ("Content-Type", "text/plain; charset=UTF-8")]
            if qid:
                hdrs.append(("X-ClickHouse-Query-Id", qid))
            self.reply(STATUS_BY_CODE.get(e.code, 500), (e.message + "\n").encode(), hdrs)
        except (ConnectionError, OSError, ValueError) as e:
            self.close_connection = True          # broken request/connection: nothing was committed
            self.log_error("request aborted: %r", e)

    def run_query(self, args, body, qid):
        params = {k[6:]: v for k, v in args.items() if k.startswith("param_")}
        settings = [(k, v) for k, v in args.items() if k not in HTTP_ONLY and not k.startswith("param_")]
        database = args.get("database") or self.headers.get("X-ClickHouse-Database")
        default_fmt = args.get("default_format") or self.headers.get("X-ClickHouse-Format") or "TabSeparated"
        query = args.get("query")
        insert, data_prefix = None, b""
        if query is None:                          # the body is the query (maybe an INSERT with data)
            raw = body.peek(HEAD_PEEK)
            text = raw.decode("latin-1")           # 1 byte = 1 char, so offsets are byte offsets
            sp = split_insert(text)
            if sp:
                insert = (text[:len(sp[0])].encode("latin-1").decode("utf-8"), sp[1])
                body.pending = raw[sp[2]:]
            else:
                query = body.read_all().decode("utf-8")
        else:
            sp = split_insert(query)
            if sp:
                insert, data_prefix = (sp[0], sp[1]), query[sp[2]:].encode()
            else:
                extra = body.read_all()
                if extra:
                    query = query + "\n" + extra.decode("utf-8")
        if insert:
            insert = (insert[0] if not params else substitute(insert[0], params), insert[1])

        conn = chdb_state.connect(self.db_path)
        t0 = time.time()
        try:
            if database:
                self.chdb(conn, f"USE {quote_ident(database)}")
            for k, v in settings:
                if not re.fullmatch(r"[A-Za-z_]\w*", k):
                    raise err("UNKNOWN_SETTING", f"Unknown setting '{k}'")
                self.chdb(conn, f"SET {k} = {quote_str(v)}")
            if insert:
                written, fmt, out = self.do_insert(conn, insert[0], insert[1], data_prefix, body), default_fmt, b""
                summary_rows, result_rows = written, 0
            else:
                fmt = output_format(query) or default_fmt
                res = self.chdb(conn, query, fmt, params)
                out, summary_rows, result_rows = res.bytes(), res.rows_written(), 0
        finally:
            conn.close()
        summary = {"read_rows": "0", "read_bytes": "0", "written_rows": str(summary_rows),
                   "written_bytes": "0", "total_rows_to_read": "0", "result_rows": str(result_rows),
                   "result_bytes": str(len(out)), "elapsed_ns": str(int((time.time() - t0) * 1e9))}
        self.reply(200, out, [("X-ClickHouse-Query-Id", qid), ("X-ClickHouse-Format", fmt),
                              ("X-ClickHouse-Timezone", "UTC"), ("X-ClickHouse-Summary", json.dumps(summary)),
                              ("Content-Type", content_type(fmt))])

    @staticmethod
    def chdb(conn, sql, fmt="TabSeparated", params=None):
        try:
            return conn._conn.query(sql, fmt, params=params or {})
        except Exception as e:  # noqa: BLE001 - chDB raises RuntimeError/ChdbError with CH text
            raise to_ch_error(e) from None

    @staticmethod
    def do_insert(conn, head, fmt, prefix, body):
        """Stream the body into chDB's insert API; cancel (never commit) if the body is incomplete."""
        try:
            ins = conn.send_insert(head, fmt)
        except Exception as e:  # noqa: BLE001
            raise to_ch_error(e) from None
        try:
            if prefix.strip():
                ins.append(prefix)
            for chunk in body.chunks():
                ins.append(chunk)
            return ins.finish().rows_written
        except Exception as e:  # noqa: BLE001
            try:
                ins.cancel()
            except Exception:  # noqa: BLE001
                pass
            if isinstance(e, (ConnectionError, OSError)):
                raise
            raise to_ch_error(e) from None


def content_type(fmt):
    f = fmt.lower()
    if f.startswith("json"):
        return "application/json; charset=UTF-8"
    if f.startswith(("tabseparated", "tsv", "csv", "pretty", "values", "vertical", "markdown")):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path", required=True, help="persistent chDB data directory")
    ap.add_argument("--port", type=int, default=18123)
    ap.add_argument("--host", default="127.0.0.1")
    a = ap.parse_args()
    path = os.path.abspath(a.path)
    os.makedirs(path, exist_ok=True)
    cfg = os.path.join(path, "sluice-chdb-config.xml")
    with open(cfg, "w") as f:
        f.write(CONFIG_XML)
    Handler.db_path = path
    base = chdb_state.connect(f"{path}?config-file={cfg}")   # keeps the engine alive
    global VERSION
    VERSION = base.query("SELECT version()", "TSV").bytes().decode().strip()
    for line in base.query("SELECT number, errorCodeToName(number) FROM numbers(2000) "
                           "WHERE errorCodeToName(number) != ''", "TSV").bytes().decode().splitlines():
        code, name = line.split("\t")
        CODE_BY_NAME[name] = int(code)
    for status, names in STATUS_BY_NAME.items():
        for name in names.split():
            if name in CODE_BY_NAME:
                STATUS_BY_CODE[CODE_BY_NAME[name]] = status

    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True

    def stop(signum, _frame):
        threading.Thread(target=server.shutdown, daemon=True).start()
        threading.Timer(5.0, lambda: os._exit(0)).start()   # don't hang on a busy engine

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"chdb_server (ClickHouse {VERSION}, chdb {chdb.__version__}) listening on http://{a.host}:{a.port} path={path}", flush=True)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    base.close()
    os._exit(0)


if __name__ == "__main__":
    main()
