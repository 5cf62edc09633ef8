#!/usr/bin/env python3
"""formats.py — what `make bench-formats` runs: the same 200 B records as JSON, Avro and Protobuf
through `sluice run` (exactly-once), CPU per record and peak RSS side by side.

Data flow: the data set of run.py's `200b` size (N records, ~BENCH_MB MB of JSON)
  -> three topics: the JSON text; the same values through the official Confluent AvroSerializer
     and ProtobufSerializer (which register their schemas in SCHEMA_REGISTRY_URL)
  -> for each: a fresh table (run.py's), `sluice run --config` reading it (format json / avro /
     protobuf), watched from /proc until count() == N (run.py's run_sink), then checked
  -> a Markdown table on stdout and docs/bench/formats.json.
Run with the clients' venv (SLUICE_CLIENTS_PYTHON: confluent-kafka with fastavro and protobuf).
Env: BENCH_MB (default 40), BENCH_BIN (dir holding `sluice`), KAFKA_BROKERS, CLICKHOUSE_URL,
SCHEMA_REGISTRY_URL. Exit status 1 when a case did not land exactly.
"""
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("BENCH_MB", "40")
import run as bench  # noqa: E402  (the data set, produce, tables, run_sink)

from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: E402
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2  # noqa: E402

REGISTRY = os.environ["SCHEMA_REGISTRY_URL"]
FIELDS = [  # (name, Avro type, Protobuf type)
    ("event_id", "long", "TYPE_UINT64"), ("user_id", "long", "TYPE_UINT32"),
    ("session_id", "string", "TYPE_STRING"), ("event", "string", "TYPE_STRING"),
    ("path", "string", "TYPE_STRING"), ("country", "string", "TYPE_STRING"),
    ("device", "string", "TYPE_STRING"), ("duration_ms", "int", "TYPE_UINT32"),
    ("price", "double", "TYPE_DOUBLE"),
]
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def values(text):
    """One record's values, with `ts` as milliseconds since the epoch (UTC)."""
    v = json.loads(text)
    ts = datetime.datetime.strptime(v["ts"], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
    v["ts"] = (ts - EPOCH) // datetime.timedelta(milliseconds=1)
    return v


def avro_serializer(client):
    fields = [{"name": n, "type": t} for n, t, _ in FIELDS]
    fields.append({"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}})
    schema = json.dumps({"type": "record", "name": "Event", "namespace": "bench", "fields": fields})
    s = AvroSerializer(client, schema, conf={"auto.register.schemas": True})

    def encode(v, ctx):
        v = dict(v, ts=EPOCH + datetime.timedelta(milliseconds=v["ts"]))
        return s(v, ctx)
    return encode


def proto_serializer(client):
    fd = descriptor_pb2.FileDescriptorProto(name="bench/event.proto", package="bench", syntax="proto3",
                                            dependency=["google/protobuf/timestamp.proto"])
    m = fd.message_type.add(name="Event")
    F = descriptor_pb2.FieldDescriptorProto
    for i, (name, _, t) in enumerate(FIELDS, 1):
        m.field.add(name=name, number=i, type=getattr(F, t), label=F.LABEL_OPTIONAL)
    m.field.add(name="ts", number=len(FIELDS) + 1, type=F.TYPE_MESSAGE,
                type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    Event = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))
    s = ProtobufSerializer(Event, client, {"use.deprecated.format": False})

    def encode(v, ctx):
        e = Event(**{n: v[n] for n, _, _ in FIELDS})
        e.ts.FromMilliseconds(v["ts"])
        return s(e, ctx)
    return encode


def case(ds, fmt):
    table = f"bench.formats_{fmt}_{bench.RUN}"
    group = f"bench-formats-{fmt}-{bench.RUN}"
    bench.create_table(table, "200b")
    path = bench.sluice_config(ds, "exactly-once", table, group)
    with open(path) as f:
        cfg = f.read().replace('[[route]]\n', f'[schema_registry]\nurl = "{REGISTRY}"\n[[route]]\n')
    with open(path, "w") as f:
        f.write(cfg + f'format = "{fmt}"\n')
    return bench.run_sink(ds, f"sluice_{fmt}", [f"{bench.BIN}/sluice", "run", "--config", path],
                          table, True)


def main():
    os.makedirs(bench.WORK, exist_ok=True)
    n = int(bench.MB * 1e6 / 200) // bench.PARTS * bench.PARTS
    texts = [bench.record("200b", i) for i in range(n)]
    client = SchemaRegistryClient({"url": REGISTRY})
    encoders = {"json": None, "avro": avro_serializer(client), "protobuf": proto_serializer(client)}
    results, failed = {}, []
    for fmt, encode in encoders.items():
        topic = f"bench_formats_{fmt}_{bench.RUN}"
        ctx = SerializationContext(topic, MessageField.VALUE)
        data = texts if encode is None else [encode(values(t), ctx) for t in texts]
        ds = {"size": "200b", "topic": topic, "records": n, "bytes": sum(map(len, data))}
        bench.produce(topic, data)
        r = case(ds, fmt)
        results[fmt] = r
        ok = r["verify"]["ok"]
        print(f"{fmt:<9} {n} records {ds['bytes'] / n:6.1f} B/record  {r['records_per_s']:>9,} rec/s  "
              f"cpu {r['cpu_seconds']} s  {r['us_per_record']} us/record  peak {r['peak_rss_mb']} MB  "
              f"{'ok' if ok else 'FAILED ' + str(r['verify'])}", flush=True)
        if not ok:
            failed.append(fmt)
    j = results["json"]
    print("\n| format | bytes/record | records/s | CPU µs/record | × JSON | peak RSS MB | × JSON |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for fmt, r in results.items():
        print(f"| {fmt} | {r['bytes'] / r['records']:.0f} | {r['records_per_s']:,} | {r['us_per_record']} | "
              f"{r['us_per_record'] / j['us_per_record']:.2f} | {r['peak_rss_mb']} | "
              f"{r['peak_rss_mb'] / j['peak_rss_mb']:.2f} |")
    os.makedirs(bench.OUT, exist_ok=True)
    with open(os.path.join(bench.OUT, "formats.json"), "w") as f:
        json.dump({"run": bench.RUN, "cpus": os.cpu_count(), "load_end": os.getloadavg(), "records": n,
                   "cases": {k: {x: v[x] for x in ("bytes", "records_per_s", "cpu_seconds", "us_per_record",
                                                   "peak_rss_mb", "verify")} for k, v in results.items()}},
                  f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
