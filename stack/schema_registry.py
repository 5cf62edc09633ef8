#!/usr/bin/env python3
"""A schema registry for the local stack: the part of the Confluent Schema
Registry REST API that producers and consumers use, on 127.0.0.1.

No Confluent-compatible registry can be installed here, so this one stands
in for it in tests, the lab and the demo. Point SCHEMA_REGISTRY_URL at a
real registry to use that instead.

Endpoints (JSON in and out, `application/vnd.schemaregistry.v1+json`):
  POST /subjects/{subject}/versions     register (or find) a schema -> {"id"}
  POST /subjects/{subject}              look a schema up -> {subject, id, version, schema}
  GET  /schemas/ids/{id}                the schema with that id
  GET  /schemas/ids/{id}/versions       the subjects and versions that use it
  GET  /subjects                        every subject
  GET  /subjects/{subject}/versions     its versions
  GET  /subjects/{subject}/versions/{version|latest}
  GET  /config, GET /config/{subject}   {"compatibilityLevel": "NONE"}
  DELETE /subjects/{subject}            soft delete (tests start afresh)
`schemaType` is AVRO (the default, left out of answers as the real one
does), PROTOBUF or JSON; `references` ([{name, subject, version}]) are
stored and must name a registered version. Ids are global: one schema
(type, text, references) has one id in every subject. Errors are
{"error_code", "message"} with the real registry's codes (40401 subject
not found, 40402 version not found, 40403 schema not found, 42201 invalid
schema, 40101 unauthorized).

State lives in one sqlite file (--db), so a restart keeps every id.
--basic-auth USER:PASSWORD requires HTTP basic auth on every request.
"""

import argparse
import base64
import json
import re
import sqlite3
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
TYPES = ("AVRO", "PROTOBUF", "JSON")


class Problem(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Store:
    """Schemas and subject versions in sqlite; one lock serializes requests."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(
            """
            CREATE TABLE IF NOT EXISTS schemas (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                type TEXT NOT NULL, schema TEXT NOT NULL, refs TEXT NOT NULL,
                canonical TEXT NOT NULL UNIQUE);
            CREATE TABLE IF NOT EXISTS versions (
                subject TEXT NOT NULL, version INTEGER NOT NULL, id INTEGER NOT NULL,
                deleted INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (subject, version));
            """
        )
        self.lock = threading.RLock()

    @staticmethod
    def canonical(kind, schema, refs):
        """One key per schema: JSON schemas compare as parsed JSON (key order
        and white space do not matter), Protobuf as text without surrounding
        white space."""
        if kind in ("AVRO", "JSON"):
            try:
                text = json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))
            except ValueError as e:
                raise Problem(422, 42201, f"Invalid schema: not JSON: {e}")
        else:
            text = schema.strip()
        return json.dumps([kind, text, refs], sort_keys=True)

    def check_refs(self, refs):
        for r in refs:
            if not isinstance(r, dict) or not {"name", "subject", "version"} <= r.keys():
                raise Problem(422, 42201, f"Invalid schema: bad reference {r!r}")
            self.version(r["subject"], r["version"])

    def register(self, subject, kind, schema, refs):
        canonical = self.canonical(kind, schema, refs)
        with self.lock:
            self.check_refs(refs)
            row = self.db.execute("SELECT id FROM schemas WHERE canonical = ?", (canonical,)).fetchone()
            if row:
                sid = row[0]
            else:
                sid = self.db.execute(
                    "INSERT INTO schemas (type, schema, refs, canonical) VALUES (?, ?, ?, ?)",
                    (kind, schema, json.dumps(refs), canonical),
                ).lastrowid
            live = self.db.execute(
                "SELECT version FROM versions WHERE subject = ? AND id = ? AND deleted = 0",
                (subject, sid),
            ).fetchone()
            if not live:
                (top,) = self.db.execute(
                    "SELECT COALESCE(MAX(version), 0) FROM versions WHERE subject = ?", (subject,)
                ).fetchone()
                self.db.execute(
                    "INSERT INTO versions (subject, version, id) VALUES (?, ?, ?)",
                    (subject, top + 1, sid),
                )
            return sid

    def lookup(self, subject, kind, schema, refs):
        self.subject_exists(subject)
        canonical = self.canonical(kind, schema, refs)
        row = self.db.execute(
            "SELECT v.version, s.id FROM versions v JOIN schemas s ON s.id = v.id "
            "WHERE v.subject = ? AND v.deleted = 0 AND s.canonical = ?",
            (subject, canonical),
        ).fetchone()
        if not row:
            raise Problem(404, 40403, "Schema not found")
        return self.answer(subject, row[0], row[1])

    def schema(self, sid):
        row = self.db.execute("SELECT type, schema, refs FROM schemas WHERE id = ?", (sid,)).fetchone()
        if not row:
            raise Problem(404, 40403, "Schema not found")
        out = {"schema": row[1]}
        if row[0] != "AVRO":
            out["schemaType"] = row[0]
        refs = json.loads(row[2])
        if refs:
            out["references"] = refs
        return out

    def subject_exists(self, subject):
        if not self.db.execute(
            "SELECT 1 FROM versions WHERE subject = ? AND deleted = 0", (subject,)
        ).fetchone():
            raise Problem(404, 40401, f"Subject '{subject}' not found.")

    def versions(self, subject):
        self.subject_exists(subject)
        rows = self.db.execute(
            "SELECT version FROM versions WHERE subject = ? AND deleted = 0 ORDER BY version",
            (subject,),
        )
        return [v for (v,) in rows]

    def version(self, subject, version):
        versions = self.versions(subject)
        if version in ("latest", -1, "-1"):
            v = versions[-1]
        else:
            try:
                v = int(version)
            except ValueError:
                raise Problem(422, 42202, f"Invalid version {version!r}")
            if v not in versions:
                raise Problem(404, 40402, f"Version {v} not found.")
        (sid,) = self.db.execute(
            "SELECT id FROM versions WHERE subject = ? AND version = ?", (subject, v)
        ).fetchone()
        return self.answer(subject, v, sid)

    def answer(self, subject, version, sid):
        return {"subject": subject, "version": version, "id": sid, **self.schema(sid)}

    def subjects(self):
        rows = self.db.execute("SELECT DISTINCT subject FROM versions WHERE deleted = 0 ORDER BY subject")
        return [s for (s,) in rows]

    def uses(self, sid):
        self.schema(sid)
        rows = self.db.execute(
            "SELECT subject, version FROM versions WHERE id = ? AND deleted = 0 ORDER BY subject, version",
            (sid,),
        )
        return [{"subject": s, "version": v} for s, v in rows]

    def delete(self, subject):
        versions = self.versions(subject)
        with self.lock:
            self.db.execute("UPDATE versions SET deleted = 1 WHERE subject = ?", (subject,))
        return versions


def parse_schema_body(body):
    try:
        req = json.loads(body or b"{}")
    except ValueError:
        raise Problem(422, 42201, "Invalid request: not JSON")
    if not isinstance(req, dict) or not isinstance(req.get("schema"), str):
        raise Problem(422, 42201, "Invalid schema: no 'schema' string")
    kind = (req.get("schemaType") or "AVRO").upper()
    if kind not in TYPES:
        raise Problem(422, 42201, f"Invalid schema type {kind}")
    refs = req.get("references") or []
    if not isinstance(refs, list):
        raise Problem(422, 42201, "Invalid schema: 'references' is not a list")
    return kind, req["schema"], refs


class Handler(BaseHTTPRequestHandler):
    store = None
    auth = None
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("schema-registry: " + (fmt % args) + "\n")

    def reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self, method):
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.auth and self.headers.get("Authorization") != self.auth:
                raise Problem(401, 40101, "Unauthorized")
            url = urllib.parse.urlsplit(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/") if p]
            with self.store.lock:
                answer = self.route(method, parts, body)
            self.reply(200, answer)
        except Problem as p:
            self.reply(p.status, {"error_code": p.code, "message": p.message})
        except Exception as e:  # a bug here must not look like a registry answer
            self.reply(500, {"error_code": 50001, "message": f"Internal error: {e}"})

    def route(self, method, parts, body):
        s = self.store
        match method, parts:
            case "GET", ["subjects"]:
                return s.subjects()
            case "GET", ["subjects", subject, "versions"]:
                return s.versions(subject)
            case "GET", ["subjects", subject, "versions", version]:
                return s.version(subject, version)
            case "GET", ["subjects", subject, "versions", version, "schema"]:
                return json.loads(s.version(subject, version)["schema"])
            case "POST", ["subjects", subject, "versions"]:
                return {"id": s.register(subject, *parse_schema_body(body))}
            case "POST", ["subjects", subject]:
                return s.lookup(subject, *parse_schema_body(body))
            case "DELETE", ["subjects", subject]:
                return s.delete(subject)
            case "GET", ["schemas", "ids", sid]:
                return s.schema(int_id(sid))
            case "GET", ["schemas", "ids", sid, "versions"]:
                return s.uses(int_id(sid))
            case "GET", ["schemas", "types"]:
                return list(TYPES)
            case "GET", ["config"] | ["config", _]:
                return {"compatibilityLevel": "NONE"}
            case "GET", []:
                return {}
        raise Problem(404, 404, f"HTTP 404 Not Found: {method} /{'/'.join(parts)}")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")


def int_id(s):
    if not re.fullmatch(r"\d+", s):
        raise Problem(404, 40403, "Schema not found")
    return int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="the sqlite file that keeps the schemas")
    ap.add_argument("--port", type=int, default=18081)
    ap.add_argument("--basic-auth", help="USER:PASSWORD every request must carry")
    a = ap.parse_args()
    Handler.store = Store(a.db)
    if a.basic_auth:
        Handler.auth = "Basic " + base64.b64encode(a.basic_auth.encode()).decode()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    print(f"schema-registry: listening on http://127.0.0.1:{a.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
