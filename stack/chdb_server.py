#!/usr/bin/env python3
"""chdb_server.py — a small ClickHouse-HTTP-interface server around chDB (ClickHouse 26.9 in-process).

Data flow:
  HTTP client (Rust `clickhouse` crate without compression, curl, ...)
    -> ThreadingHTTPServer on 127.0.0.1:--port, one thread per connection
    -> per request: parse URL params / multipart form into (query, settings, params, database);
       the query id is the `query_id` param, else the X-ClickHouse-Query-Id header, else a uuid
    -> register the query in PROCESSES (the server's process list) BEFORE its body is read, so an
       INSERT whose data is still arriving is "running"; a second query with the same id gets
       Code 216 QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING unless replace_running_query=1 (then the old
       one is cancelled and waited for, at most replace_running_query_max_wait_ms)
    -> read the query: the `query` param + "\n" + body, or the body alone (as clickhouse-server)
    -> open ONE chDB connection for this request on the shared data dir (--path),
       `USE <database>`, one `SET <setting> = '<value>', ...` for every --profile setting and every
       settings param (as a user's settings profile, which the query's own settings override)
    -> then one of:
       INSERT ... FORMAT f <data>:  the whole data is read (the cancel flag checked after it), then
           `INSERT ... SELECT * FROM file('<temporary file holding the data>', f, '<structure of t>')`
           runs: one statement, whose errors the engine reports
           (chDB's streaming insert API drops a block that fails when written, a violated CHECK or
           more partitions than max_partitions_per_insert_block, and answers success); data is
           never put inline after FORMAT (chDB cuts inline data at the first blank line)
       INSERT INTO t [(cols)] SELECT ... input([structure]) ... FORMAT f <data>:  the whole data is
           read, then the same statement runs, with now() and now64() fixed at the moment its head
           arrived (in ClickHouse they are the query's start time, and the query starts with its
           head; nowInBlock() stays the moment the data is processed) and input(...) replaced by
           file('<a temporary file holding the data>', f, '<structure>').
           Without a structure it is built from system.columns of t, as ClickHouse does: the
           insertable columns (ordinary and DEFAULT, in table order, with their DEFAULT
           expressions) or the INSERT's column list.
       KILL QUERY WHERE <cond> [SYNC|ASYNC] [TEST] [FORMAT f]:  handled here (see below)
       anything else:  conn.query(sql, output_format, params=...)  (chDB substitutes {name:Type})
    -> the query leaves PROCESSES, then the response: 200 + result bytes, or a ClickHouse-style
       error (status by error code, X-ClickHouse-Exception-Code header, body "Code: N. DB::Exception: ...").
  A base chDB connection stays open for the whole life of the process (the engine shuts down when
  its last connection closes). SIGTERM/SIGINT stop the server promptly (chDB itself ignores SIGTERM).

Process list (system.processes, KILL QUERY):
  chDB's own process list does not know the HTTP query ids, so every table reference
  `system.processes` (any case, backquoted or not; also SHOW PROCESSLIST) is rewritten into
  `(SELECT * FROM format(JSONEachRow, '<the columns of the real system.processes>', {__procs:String}))`
  with one JSON row per running query of this server (query_id, query, user 'default', elapsed,
  is_cancelled, is_initial_query 1, current_database, address, port, interface, http_method, ...;
  the other columns hold their type's default). WHERE, ORDER BY etc. run in the engine. The
  querying request is in the list itself, as in ClickHouse.
  KILL QUERY selects its victims with `SELECT query_id, user, query FROM <that subquery> WHERE
  <cond>` (never itself), marks them cancelled, and answers kill_status/query_id/user/query rows:
  'waiting' (ASYNC), 'finished' (SYNC, once each victim left the list; the wait is bounded to
  30 s, a victim still running then is reported 'waiting'), 'unknown_status' (TEST), 'finished'
  for an id that ended before it could be cancelled.
  A cancelled query whose request thread is still reading the body is woken by shutting down the
  read side of its socket; an INSERT then never runs its statement and answers Code 394
  QUERY_WAS_CANCELLED, and the connection is closed after the answer.

Parallel parsing: chDB parses an insert's body in one stream; ClickHouse, with
  input_format_parallel_parsing on (the default), cuts it into segments of at least
  min_chunk_bytes_for_parallel_parsing bytes and counts `(at row N)` from each segment's first row
  (ClickHouse #34203). An insert's error naming a row is rewritten to that count (JSONEachRow).

Limits of the emulation:
  - A query running inside chDB (SELECTs, DDL, an INSERT once its body is read) cannot be
    interrupted: after a KILL it runs to its normal end (and
    answers as it would have); KILL ... SYNC waits for that end. An INSERT is never left running
    after KILL ... SYNC returned 'finished', so it cannot commit later.
  - The process list shows only this server's HTTP queries (no internal or background queries);
    read_rows, memory_usage, ProfileEvents etc. are 0/empty. `processes` reached through
    `USE system` is not rewritten. Under readonly=1 a query over system.processes fails with
    READONLY, since format() is a table function.
  - An INSERT's data is read whole before its statement runs (into a temporary file the
    statement reads with file()); only one input() per query.
  - INSERT shapes that cannot be run faithfully fail loudly with Code 48 NOT_IMPLEMENTED (never a
    200 for data that was not stored): an INSERT ... SELECT with data but no input(), input()
    without a structure into a table function or with a column-list matcher, two input() calls.
  - `query_id` is not chDB's internal id (system.query_log shows chDB's own ids); no HTTP
    compression; results are built in memory (no streaming of SELECT output); no sessions.

Usage: python chdb_server.py --path DIR [--port 18123] [--host 127.0.0.1] [--profile NAME=VALUE]...
       [--clock-file PATH]   (now() and now64() moved by the ms in PATH, read per statement)
"""
import argparse
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import chdb
from chdb import state as chdb_state

CHUNK = 1 << 20           # bytes handed to insert_append at a time
HEAD_PEEK = 1 << 20       # how much of a query-less body we inspect for an INSERT head
KILL_SYNC_WAIT = 30.0     # how long KILL QUERY ... SYNC waits for its victims to end
# The columns of system.processes as the emulated process list shows them: replaced at startup by
# the real table's columns (the engine's own system.processes, which never sees HTTP query ids).
PROCS_STRUCTURE = ("is_initial_query UInt8, user String, query_id String, address IPv6, port UInt16, "
                   "initial_user String, initial_query_id String, elapsed Float64, is_cancelled UInt8, "
                   "query String, query_kind String, current_database String")
PROCS_COLUMNS = {c.split()[0] for c in PROCS_STRUCTURE.split(", ")}
KILL_STRUCTURE = "kill_status String, query_id String, user String, query String"
VERSION = chdb.__version__     # replaced by the engine version (SELECT version()) at startup
# Settings of every query, applied before the request's own (`--profile`), as a user's
# settings profile is in ClickHouse.
PROFILE = []

# A file holding how far (ms) this server's clock is from the machine's (`--clock-file`): read
# on every statement, so a test can step the server's clock while clients run.
CLOCK_FILE = None


def clock_offset():
    """How far (ms) this server's clock is from the machine's (CLOCK_FILE)."""
    if CLOCK_FILE is None:
        return 0
    try:
        with open(CLOCK_FILE) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def now_at_start(sql, started_ms):
    """`sql` with now() and now64(...) fixed at `started_ms` (plus the clock offset): in ClickHouse
    they are the query's start time, and an INSERT's query starts when its head arrives, while this
    server runs an INSERT ... SELECT ... input() only once the whole body is read."""
    ms = started_ms + clock_offset()
    sql = re.sub(r"\bnow64\s*\([^()]*\)", f"fromUnixTimestamp64Milli(toInt64({ms}))", sql)
    return re.sub(r"\bnow\s*\(\s*\)", f"toDateTime({ms // 1000})", sql)


def shift_clock(sql):
    """`sql` with now(), now64(...) and nowInBlock() moved by the offset in CLOCK_FILE, if any."""
    off = clock_offset()
    if off == 0:
        return sql
    sql = re.sub(r"\bnowInBlock\s*\(\s*\)", f"addSeconds(nowInBlock(), {int(off / 1000)})", sql)
    sql = re.sub(r"\bnow64\s*\(([^()]*)\)", lambda m: f"addMilliseconds(now64({m.group(1)}), {off})", sql)
    return re.sub(r"\bnow\s*\(\s*\)", f"addSeconds(now(), {int(off / 1000)})", sql)

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
  <!-- A cluster for Distributed tables. chDB has no native-protocol server: a query that reaches
       its shard fails loudly (connection refused), never silently. -->
  <remote_servers><sluice_test><shard><replica><host>127.0.0.1</host><port>1</port></replica>
    </shard></sluice_test></remote_servers>
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


def word_at(sql, tok):
    """The upper-cased text of a word token, else None."""
    return sql[tok[0]:tok[1]].upper() if tok is not None and tok[2] == "word" else None


def is_char(sql, tok, char):
    return tok is not None and tok[2] == "other" and sql[tok[0]:tok[1]] == char


def ident_at(sql, tok):
    """The name an identifier token stands for (a word, `quoted` or "quoted"), else None."""
    if tok is None:
        return None
    s, e, kind, _ = tok
    if kind == "word":
        return sql[s:e]
    if kind == "quote" and sql[s] in "`\"" and e - s >= 2 and sql[e - 1] == sql[s]:
        q = sql[s]
        return unescape_param(sql[s + 1:e - 1].replace(q + q, "\\" + q))
    return None


def data_start(sql, fmt_tok):
    """Where the data after `FORMAT <name>` begins: past blanks and one line break."""
    d = fmt_tok[1]
    while d < len(sql) and sql[d] in " \t\f":
        d += 1
    if sql.startswith("\r", d):
        d += 1
    if sql.startswith("\n", d):
        d += 1
    return d


class InsertPlan:
    """An INSERT that carries data. kind 'data': INSERT ... FORMAT f <data> / VALUES <data>, where
    `head` is the statement before FORMAT/VALUES. kind 'input': INSERT ... SELECT ... input(...) ...
    FORMAT f <data>, where `head` is the statement before FORMAT, `select_at` where its SELECT/WITH
    begins and `call` the (start, end, arg_start, arg_end) offsets of input(...)."""

    def __init__(self, kind, sql, head_end, fmt, data_at, select_at=None, call=None):
        self.kind, self.sql, self.fmt, self.data_at = kind, sql, fmt, data_at
        self.head = sql[:head_end]
        self.select_at, self.call = select_at, call

    @property
    def shown(self):
        """The query text without its data, as system.processes shows it."""
        return self.sql[:self.data_at].rstrip()


def parse_insert(sql):
    """The InsertPlan of an INSERT statement followed by data; None for any other statement (an INSERT
    ... SELECT without input() and without data runs as a plain query). Raises for INSERT shapes this
    server cannot run faithfully, rather than letting chDB ignore their data."""
    toks = scan(sql)
    if word_at(sql, next(toks, None)) != "INSERT":
        return None
    select_at, fmt_tok, fmt_at, prev = None, None, None, None
    calls, after_input = [], None          # calls: [start, end, arg_start, arg_end, depth] of input(...)
    for tok in toks:
        s, e, kind, depth = tok
        w = word_at(sql, tok)
        if after_input is not None:        # the token after the word `input`
            if is_char(sql, tok, "("):
                calls.append([after_input[0], None, e, None, after_input[1]])
            after_input = None
        if calls and calls[-1][1] is None and is_char(sql, tok, ")") and depth == calls[-1][4]:
            calls[-1][1], calls[-1][3] = e, s
        if depth == 0 and select_at is None:
            if w == "VALUES":
                return InsertPlan("data", sql, s, "Values", e)
            if w == "INFILE" and prev == "FROM":
                raise err("UNKNOWN_TYPE_OF_QUERY", "Query has infile and was send directly to server")
            if w in ("SELECT", "WITH"):
                select_at = s
            elif w == "FORMAT":
                fmt_tok = next(toks, None)
                if word_at(sql, fmt_tok) is None:
                    raise err("SYNTAX_ERROR", "Syntax error: expected format name after FORMAT")
                return InsertPlan("data", sql, s, sql[fmt_tok[0]:fmt_tok[1]], data_start(sql, fmt_tok))
        elif select_at is not None:
            if w == "INPUT":
                after_input = (s, depth)
            elif depth == 0 and w == "FORMAT":
                fmt_at, fmt_tok = s, next(toks, None)
                if word_at(sql, fmt_tok) is None:
                    raise err("SYNTAX_ERROR", "Syntax error: expected format name after FORMAT")
                break
        prev = w
    if select_at is None:
        return None
    if len(calls) > 1:
        raise err("NOT_IMPLEMENTED", "The chDB test stack runs INSERT ... SELECT with one input() call only")
    if calls and calls[0][1] is None:
        return None                        # unbalanced parentheses: let the engine report it
    if fmt_tok is None:
        if calls:
            raise err("INVALID_USAGE_OF_INPUT",
                      "input() over HTTP needs a FORMAT clause naming the format of the data")
        return None
    data_at = data_start(sql, fmt_tok)
    if calls:
        return InsertPlan("input", sql, fmt_at, sql[fmt_tok[0]:fmt_tok[1]], data_at, select_at, calls[0][:4])
    if sql[data_at:].strip():
        raise err("NOT_IMPLEMENTED", "The chDB test stack cannot run INSERT ... SELECT followed by data "
                                     "without input() (the data would be ignored)")
    return None


def insert_target(head):
    """(database or None, table, [columns] or None) of `INSERT INTO [TABLE] [db.]t [(c1, c2)] ...`."""
    toks = list(scan(head))
    at = lambda i: toks[i] if i < len(toks) else None  # noqa: E731
    i = 1
    for kw in ("INTO", "TABLE"):
        if word_at(head, at(i)) == kw:
            i += 1
    if word_at(head, at(i)) == "FUNCTION":
        raise err("NOT_IMPLEMENTED", "The chDB test stack cannot take the structure of input() from a "
                                     "table function: give input() a structure")
    db, table = None, ident_at(head, at(i))
    if is_char(head, at(i + 1), "."):
        db, table, i = table, ident_at(head, at(i + 2)), i + 2
    if table is None:
        raise err("SYNTAX_ERROR", "Syntax error: expected a table name after INSERT INTO")
    i += 1
    if not is_char(head, at(i), "("):
        return db, table, None
    columns, name, want_name = [], [], True
    for tok in toks[i + 1:]:
        if want_name:
            if ident_at(head, tok) is None:
                break
            name.append(ident_at(head, tok))
            want_name = False
        elif is_char(head, tok, "."):          # a nested column: n.a
            want_name = True
        elif is_char(head, tok, ",") or is_char(head, tok, ")"):
            columns.append(".".join(name))
            if is_char(head, tok, ")"):
                return db, table, columns
            name, want_name = [], True
        else:
            break
    raise err("NOT_IMPLEMENTED", "The chDB test stack takes the structure of input() from a column list "
                                 "of plain names only: give input() a structure")


def parse_kill(sql):
    """(condition, sync, test, format) of `KILL QUERY WHERE <cond> [SYNC|ASYNC] [TEST] [FORMAT f]`;
    None for any other statement."""
    toks = scan(sql)
    if word_at(sql, next(toks, None)) != "KILL" or word_at(sql, next(toks, None)) != "QUERY":
        return None
    toks = list(toks)
    while toks and is_char(sql, toks[-1], ";"):
        toks.pop()
    if toks and word_at(sql, toks[0]) == "ON":
        raise err("NOT_IMPLEMENTED", "The chDB test stack has no cluster: KILL QUERY ON CLUSTER is not supported")
    if not toks or word_at(sql, toks[0]) != "WHERE":
        raise err("SYNTAX_ERROR", "Syntax error: expected WHERE after KILL QUERY")
    fmt = None
    if len(toks) >= 3 and toks[-2][3] == 0 and word_at(sql, toks[-2]) == "FORMAT" and toks[-1][2] == "word":
        fmt = sql[toks[-1][0]:toks[-1][1]]
        toks = toks[:-2]
    modifiers = []
    while len(toks) > 2 and toks[-1][3] == 0 and word_at(sql, toks[-1]) in ("SYNC", "ASYNC", "TEST"):
        modifiers.insert(0, word_at(sql, toks.pop()))
    if len(toks) < 2:
        raise err("SYNTAX_ERROR", "Syntax error: expected a condition after KILL QUERY WHERE")
    sync = test = False
    for m in modifiers:                    # as ClickHouse's parser: the last of SYNC/ASYNC wins
        if m == "TEST":
            test = True
        else:
            sync = m == "SYNC"
    return sql[toks[1][0]:toks[-1][1]], sync, test, fmt


def show_processlist(sql):
    """SHOW PROCESSLIST is SELECT * FROM system.processes, as in ClickHouse."""
    toks = scan(sql)
    if word_at(sql, next(toks, None)) == "SHOW":
        tok = next(toks, None)
        if word_at(sql, tok) == "PROCESSLIST":
            return "SELECT * FROM system.processes" + sql[tok[1]:]
    return sql


def procs_subquery():
    return f"(SELECT * FROM format(JSONEachRow, {quote_str(PROCS_STRUCTURE)}, {{__procs:String}}))"


def rewrite_processes(sql):
    """Replace every table reference `system.processes` by a subquery over the {__procs:String}
    parameter (the server's process list). Returns (sql, number of references replaced)."""
    if "processes" not in sql.lower():
        return sql, 0
    toks = list(scan(sql))
    at = lambda i: toks[i] if 0 <= i < len(toks) else None  # noqa: E731
    out, last, n = [], 0, 0
    for i in range(len(toks) - 2):
        first, dot, second = toks[i:i + 3]
        if (first[0] >= last and (ident_at(sql, first) or "").lower() == "system" and is_char(sql, dot, ".")
                and (ident_at(sql, second) or "").lower() == "processes"
                and not is_char(sql, at(i - 1), ".") and not is_char(sql, at(i + 3), ".")):
            out += [sql[last:first[0]], procs_subquery()]
            last, n = second[1], n + 1
    return "".join(out) + sql[last:], n


def query_kind(sql):
    """system.processes.query_kind of a statement (the common kinds)."""
    w = word_at(sql, next(scan(sql), None)) or ""
    kinds = {"WITH": "Select", "DESC": "Describe", "TRUNCATE": "Drop", "KILL": "KillQuery"}
    if w in kinds:
        return kinds[w]
    return w.capitalize() if w in ("SELECT", "INSERT", "CREATE", "DROP", "ALTER", "SYSTEM", "SHOW", "DESCRIBE",
                                   "EXISTS", "OPTIMIZE", "RENAME", "SET", "USE", "EXPLAIN") else ""


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


def tsv_escape(v):
    """Escape a query parameter value as ClickHouse (and chDB) expect it: TSV escaping."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


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


# ---------------------------------------------------------------- process list
class Process:
    """One query the server is running, as system.processes shows it."""

    def __init__(self, query_id, database, method, address, user_agent, interrupt):
        self.query_id, self.database, self.method = query_id, database, method
        self.address, self.user_agent = address, user_agent
        self.query, self.kind = "", ""
        self.started = time.monotonic()
        self.started_ms = int(time.time() * 1000)   # when its head arrived: what now() means in it
        self.cancelled = False
        self.interrupted = False           # its socket's read side was shut down
        self._interrupt = interrupt

    def cancel(self):
        """Mark the query cancelled and wake its thread if it is blocked reading the body."""
        self.cancelled = True
        if not self.interrupted:
            self.interrupted = True
            try:
                self._interrupt()
            except OSError:
                pass

    def check(self):
        """Raise QUERY_WAS_CANCELLED once the query has been killed."""
        if self.cancelled:
            raise err("QUERY_WAS_CANCELLED", "Query was cancelled")

    def row(self, now, columns):
        host, port = self.address[:2]
        host = host if ":" in host else "::ffff:" + host
        row = {"is_initial_query": 1, "user": "default", "query_id": self.query_id, "address": host,
               "port": port, "initial_user": "default", "initial_query_id": self.query_id,
               "initial_address": host, "initial_port": port, "interface": "HTTP",
               "http_method": self.method, "http_user_agent": self.user_agent,
               "elapsed": round(now - self.started, 6), "is_cancelled": int(self.cancelled),
               "query": self.query, "query_kind": self.kind, "current_database": self.database}
        return {k: v for k, v in row.items() if k in columns}


class ProcessList:
    """The queries running right now, by query_id (thread-safe)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._procs = {}

    def add(self, proc, replace=False, max_wait=5.0):
        """Register a query; a running query with the same id is refused, or with `replace`
        cancelled and waited for (at most max_wait seconds), as replace_running_query does."""
        with self._cv:
            old = self._procs.get(proc.query_id)
            if old is not None:
                if not replace:
                    raise err("QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING",
                              f"Query with id = {proc.query_id} is already running")
                old.cancel()
                self._cv.notify_all()
                if not self._cv.wait_for(lambda: proc.query_id not in self._procs, max_wait):
                    raise err("QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING",
                              f"Query with id = {proc.query_id} is already running and can't be stopped")
            self._procs[proc.query_id] = proc

    def remove(self, proc):
        with self._cv:
            if self._procs.get(proc.query_id) is proc:
                del self._procs[proc.query_id]
                self._cv.notify_all()

    def cancel(self, query_id):
        """Cancel a running query; False if it is not running (any more)."""
        with self._cv:
            proc = self._procs.get(query_id)
            if proc is None:
                return False
            proc.cancel()
            self._cv.notify_all()
            return True

    def wait_gone(self, ids, timeout, waiter):
        """Wait until none of `ids` is running (or `waiter` itself is cancelled); the ids still running."""
        with self._cv:
            self._cv.wait_for(lambda: waiter.cancelled or not any(i in self._procs for i in ids), timeout)
            return {i for i in ids if i in self._procs}

    def json_rows(self):
        """The list as JSONEachRow rows of system.processes."""
        now = time.monotonic()
        with self._cv:
            rows = [p.row(now, PROCS_COLUMNS) for p in self._procs.values()]
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


PROCESSES = ProcessList()


# ---------------------------------------------------------------- request bodies
class Body:
    """Reads a request body (Content-Length or chunked); remembers whether it was read completely."""

    def __init__(self, rfile, headers):
        self.rfile = rfile
        self.chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self.left = int(headers.get("Content-Length") or 0) if not self.chunked else 0
        self.done = not self.chunked and self.left == 0
        self.pending = b""
        self.check = lambda: None          # called before every read: raises once the query is killed
        self.kept = None                   # a list: chunks() keeps what it yields there

    def _raw(self):
        """Next piece of body bytes, or b'' at the end."""
        if self.done:
            return b""
        self.check()
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
                yield self._keep(b"".join(buf))
                buf, size = [], 0
        if size:
            yield self._keep(b"".join(buf))

    def _keep(self, chunk):
        if self.kept is not None:
            self.kept.append(chunk)
        return chunk

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
        qid = proc = None
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
            proc = self.register(args, qid)
            body.check = proc.check
            try:
                response = self.run_query(args, body, proc)
            finally:
                PROCESSES.remove(proc)             # the response is decided: the query is over
        except CHError as e:
            response = self.error_response(e, qid, body)
        except (ConnectionError, OSError, ValueError) as e:
            if proc is None or not proc.cancelled:
                self.close_connection = True      # broken request/connection: nothing was committed
                self.log_error("request aborted: %r", e)
                return None
            response = self.error_response(err("QUERY_WAS_CANCELLED", "Query was cancelled"), qid, body)
        if proc is not None and proc.interrupted:
            self.close_connection = True          # its socket can no longer be read
        try:
            return self.reply(*response)
        except OSError as e:
            self.close_connection = True
            self.log_error("cannot send the response: %r", e)
            return None

    def error_response(self, e, qid, body):
        if not body.done:
            self.close_connection = True          # unread body: cannot reuse the connection
        hdrs = [("X-ClickHouse-Exception-Code", str(e.code)), ("Content-Type", "text/plain; charset=UTF-8")]
        if qid:
            hdrs.append(("X-ClickHouse-Query-Id", qid))
        return STATUS_BY_CODE.get(e.code, 500), (e.message + "\n").encode(), hdrs

    def database(self, args):
        return args.get("database") or self.headers.get("X-ClickHouse-Database")

    def register(self, args, qid):
        """Put the query in the process list (before its body is read: INSERT data is part of it)."""
        def interrupt():
            self.connection.shutdown(socket.SHUT_RD)

        proc = Process(qid, self.database(args) or "default", self.command, self.client_address,
                       self.headers.get("User-Agent", ""), interrupt)
        replace = args.get("replace_running_query", "0").strip().lower() in ("1", "true")
        wait_ms = args.get("replace_running_query_max_wait_ms", "5000").strip()
        PROCESSES.add(proc, replace, int(wait_ms) / 1000 if wait_ms.isdigit() else 5.0)
        return proc

    def read_query(self, args, body):
        """(InsertPlan or None, data already read for the insert, query text when there is no plan).

        As clickhouse-server, the query is the `query` param, a line break and the body, or the body
        alone; the data of an INSERT stay in `body` to be streamed."""
        query = args.get("query")
        if query is None:
            raw = body.peek(HEAD_PEEK)
            plan = parse_insert(raw.decode("latin-1"))   # 1 byte = 1 char, so offsets are byte offsets
            if plan is None:
                return None, b"", body.read_all().decode("utf-8")
            body.pending = raw[plan.data_at:]
            return parse_insert(raw[:plan.data_at].decode("utf-8")), b"", None
        plan = parse_insert(query)
        if plan is not None:
            tail = query[plan.data_at:]
            return plan, (tail + "\n").encode() if tail.strip() else b"", None
        extra = body.read_all()
        if not extra:
            return None, b"", query
        query = query + "\n" + extra.decode("utf-8")
        plan = parse_insert(query)                 # e.g. the FORMAT clause came in the body
        return (None, b"", query) if plan is None else (plan, query[plan.data_at:].encode(), None)

    def run_query(self, args, body, proc):
        params = {k[6:]: v for k, v in args.items() if k.startswith("param_")}
        settings = [(k, v) for k, v in args.items() if k not in HTTP_ONLY and not k.startswith("param_")]
        database = self.database(args)
        default_fmt = args.get("default_format") or self.headers.get("X-ClickHouse-Format") or "TabSeparated"
        plan, data_prefix, query = self.read_query(args, body)
        proc.query = plan.shown if plan else query
        proc.kind = query_kind(proc.query)

        conn = chdb_state.connect(self.db_path)
        t0 = time.time()
        fmt, out, written = default_fmt, b"", 0
        try:
            if database:
                self.chdb(conn, f"USE {quote_ident(database)}")
            merged = dict(PROFILE)
            merged.update(settings)            # the request's own over the profile's
            for k in merged:
                if not re.fullmatch(r"[A-Za-z_]\w*", k):
                    raise err("UNKNOWN_SETTING", f"Unknown setting '{k}'")
            if merged:                         # one statement: a request may carry dozens
                self.chdb(conn, "SET " + ", ".join(f"{k} = {quote_str(v)}" for k, v in merged.items()))
            if plan is not None and plan.kind == "data":
                head = substitute(plan.head, params) if params else plan.head
                written = self.do_insert_checked(conn, head, plan.fmt, data_prefix, body, params, proc)
            elif plan is not None:
                written = self.do_insert_select(conn, plan, data_prefix, body, params, proc)
            elif (kill := parse_kill(query)) is not None:
                cond, sync, test, kill_fmt = kill
                fmt = kill_fmt or default_fmt
                out = self.do_kill(conn, proc, cond, sync, test, fmt, params)
            else:
                fmt = output_format(query) or default_fmt
                res = self.run_sql(conn, show_processlist(query), fmt, params)
                out, written = res.bytes(), res.rows_written()
        finally:
            conn.close()
        summary = {"read_rows": "0", "read_bytes": "0", "written_rows": str(written),
                   "written_bytes": "0", "total_rows_to_read": "0", "result_rows": "0",
                   "result_bytes": str(len(out)), "elapsed_ns": str(int((time.time() - t0) * 1e9))}
        return 200, out, [("X-ClickHouse-Query-Id", proc.query_id), ("X-ClickHouse-Format", fmt),
                          ("X-ClickHouse-Timezone", "UTC"), ("X-ClickHouse-Summary", json.dumps(summary)),
                          ("Content-Type", content_type(fmt))]

    @staticmethod
    def chdb(conn, sql, fmt="TabSeparated", params=None):
        try:
            return conn._conn.query(shift_clock(sql), fmt, params=params or {})
        except Exception as e:  # noqa: BLE001 - chDB raises RuntimeError/ChdbError with CH text
            raise to_ch_error(e) from None

    def run_sql(self, conn, sql, fmt, params):
        """Run a statement in chDB, with system.processes standing for this server's process list."""
        sql, refs = rewrite_processes(sql)
        if refs:
            params = {**params, "__procs": tsv_escape(PROCESSES.json_rows())}
        return self.chdb(conn, sql, fmt, params)

    def do_insert_select(self, conn, plan, prefix, body, params, proc):
        """INSERT ... SELECT ... input(...) ... FORMAT f: read all the data, then run the statement with
        input(...) replaced by file('<a temporary file holding the data>', f, '<structure>')."""
        start, end, arg_start, arg_end = plan.call
        head = plan.sql[:plan.select_at]
        structure = plan.sql[arg_start:arg_end].strip() or quote_str(
            self.input_structure(conn, substitute(head, params) if params else head))
        def sql_from(path):
            sql = plan.head[:start] + f"file({quote_str(path)}, {plan.fmt}, {structure})" + plan.head[end:]
            return now_at_start(sql, proc.started_ms)
        return self.run_with_data(conn, sql_from, plan.fmt, prefix, body, params, proc)

    def run_with_data(self, conn, sql_from, fmt, prefix, body, params, proc):
        """Runs `sql_from(source)`, where `source` is a table function reading the whole request data
        (any bytes) from a temporary file; the rows written."""
        data = prefix + body.read_all()
        proc.check()
        fd, path = tempfile.mkstemp(prefix="chdb_input_", suffix=".data")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return self.run_sql(conn, sql_from(path), "TabSeparated", params).rows_written()
        except CHError as e:
            raise self.as_parsed_in_parallel(conn, fmt, data, e) from None
        finally:
            os.unlink(path)

    def as_parsed_in_parallel(self, conn, fmt, data, e):
        """The error `e` of an insert of `data` as ClickHouse reports it when it parses in parallel
        (`input_format_parallel_parsing`, on by default): the body is cut into segments of at least
        `min_chunk_bytes_for_parallel_parsing` bytes at row ends, and `(at row N)` counts from the
        first row of N's segment (ClickHouse #34203). chDB parses the whole body in one stream."""
        m = re.search(r"\(at row (\d+)\)", e.message)
        if not m or not fmt.startswith("JSONEachRow"):
            return e
        res = self.chdb(conn, "SELECT getSetting('input_format_parallel_parsing'), "
                              "getSetting('min_chunk_bytes_for_parallel_parsing')")
        parallel, min_chunk = res.bytes().decode().split()
        if parallel in ("0", "false"):
            return e
        row, first, size = int(m.group(1)), 1, 0
        for i, line in enumerate(data.split(b"\n")[:row], 1):
            if size >= int(min_chunk):
                first, size = i, 0
            size += len(line) + 1
        shown = e.message[:m.start()] + f"(at row {row - first + 1})" + e.message[m.end():]
        return CHError(e.code, shown)

    def do_insert_checked(self, conn, head, fmt, prefix, body, params, proc):
        """INSERT ... FORMAT f <data> as one statement, `head SELECT * FROM file('<the data>', f,
        '<structure>')`, whose errors the engine reports. chDB's streaming insert API drops a block
        that fails when it is written (a violated CHECK, more partitions than
        max_partitions_per_insert_block) without reporting it: insert_done() answers success and
        counts the rows, none stored."""
        structure = quote_str(self.input_structure(conn, head))
        # A plain INSERT is deduplicated by its blocks' hashes (when deduplicate_insert allows); an
        # INSERT SELECT only when its SELECT is "stable": this one reads the data as sent.
        self.chdb(conn, "SET deduplicate_insert_select = 'enable_even_for_bad_queries'")
        def sql_from(path):
            return f"{head} SELECT * FROM file({quote_str(path)}, {fmt}, {structure})"
        return self.run_with_data(conn, sql_from, fmt, prefix, body, params, proc)

    def input_structure(self, conn, head):
        """The structure input() takes from the insertion table of `head` (the INSERT before its
        SELECT or FORMAT), as ClickHouse does: its insertable columns (ordinary and DEFAULT, with
        their DEFAULT expressions) in table order, or the columns of the INSERT's column list."""
        db, table, columns = insert_target(head)
        where = "currentDatabase()" if db is None else "{__db:String}"
        res = self.chdb(conn, "SELECT database, name, type, default_kind, default_expression FROM system.columns "
                              f"WHERE database = {where} AND table = {{__table:String}} ORDER BY position",
                        "JSONEachRow", {"__db": tsv_escape(db or ""), "__table": tsv_escape(table)})
        found = [json.loads(line) for line in res.bytes().splitlines()]
        ref = (quote_ident(db) + "." if db is not None else "") + quote_ident(table)
        if not found:
            self.chdb(conn, f"DESCRIBE TABLE {ref}")      # raises the engine's own error
            raise err("UNKNOWN_TABLE", f"Table {ref} has no columns")
        if columns is None:
            chosen = [c for c in found if c["default_kind"] in ("", "DEFAULT")]
        else:
            by_name = {c["name"]: c for c in found}
            missing = [c for c in columns if c not in by_name]
            if missing:
                raise err("NO_SUCH_COLUMN_IN_TABLE", f"No such column {missing[0]} in table "
                                                     f"{found[0]['database']}.{table}")
            chosen = [by_name[c] for c in columns]
        return ", ".join(f"{quote_ident(c['name'])} {c['type']}"
                         + (f" DEFAULT {c['default_expression']}" if c["default_kind"] == "DEFAULT" else "")
                         for c in chosen)

    def do_kill(self, conn, proc, cond, sync, test, fmt, params):
        """KILL QUERY WHERE cond: the rows ClickHouse answers (kill_status, query_id, user, query)."""
        found = self.run_sql(conn, f"SELECT query_id, user, query FROM system.processes WHERE {cond}",
                             "JSONEachRow", params)
        victims = [v for v in map(json.loads, found.bytes().splitlines()) if v["query_id"] != proc.query_id]
        if not victims:
            return b""                             # ClickHouse sends no result at all then
        ids = [v["query_id"] for v in victims]
        if test:
            status = dict.fromkeys(ids, "unknown_status")
        else:
            status = {i: "waiting" if PROCESSES.cancel(i) else "finished" for i in ids}
            if sync:
                left = PROCESSES.wait_gone([i for i in ids if status[i] == "waiting"], KILL_SYNC_WAIT, proc)
                proc.check()                       # KILL QUERY can be killed too
                status = {i: "waiting" if i in left else "finished" for i in ids}
        rows = "".join(json.dumps({"kill_status": status[v["query_id"]], **v}, ensure_ascii=False) + "\n"
                       for v in victims)
        res = self.chdb(conn, f"SELECT * FROM format(JSONEachRow, {quote_str(KILL_STRUCTURE)}, {{__kill:String}})",
                        fmt, {"__kill": tsv_escape(rows)})
        return res.bytes()


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
    ap.add_argument("--profile", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting of every query, under the request's own (a user's settings profile)")
    ap.add_argument("--clock-file", metavar="PATH",
                    help="a file holding an offset in ms that now() and now64() are moved by, read per statement")
    a = ap.parse_args()
    PROFILE.extend(tuple(s.split("=", 1)) for s in a.profile)
    global CLOCK_FILE
    CLOCK_FILE = a.clock_file
    path = os.path.abspath(a.path)
    os.makedirs(path, exist_ok=True)
    cfg = os.path.join(path, "sluice-chdb-config.xml")
    with open(cfg, "w") as f:
        f.write(CONFIG_XML)
    Handler.db_path = path
    base = chdb_state.connect(f"{path}?config-file={cfg}")   # keeps the engine alive
    global VERSION, PROCS_STRUCTURE, PROCS_COLUMNS
    VERSION = base.query("SELECT version()", "TSV").bytes().decode().strip()
    for line in base.query("SELECT number, errorCodeToName(number) FROM numbers(2000) "
                           "WHERE errorCodeToName(number) != ''", "TSV").bytes().decode().splitlines():
        code, name = line.split("\t")
        CODE_BY_NAME[name] = int(code)
    cols = [json.loads(line) for line in base.query(
        "SELECT name, type FROM system.columns WHERE database = 'system' AND table = 'processes' "
        "AND default_kind = '' ORDER BY position", "JSONEachRow").bytes().splitlines()]
    if cols:
        PROCS_STRUCTURE = ", ".join(f"{quote_ident(c['name'])} {c['type']}" for c in cols)
        PROCS_COLUMNS = {c["name"] for c in cols}
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
