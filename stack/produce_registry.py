#!/usr/bin/env python3
"""Produces `shop.Order` records with the official Confluent clients
(confluent-kafka's AvroSerializer or ProtobufSerializer, which register the
schema), as a service in front of sluice would. Run with the clients' venv
(SLUICE_CLIENTS_PYTHON); the tests of `sluice run` on registry routes call
it.

Record i: id i, payload "p<i>", at 2024-01-01T00:00:00Z + i ms, note null
when i % 3 == 0 else "n<i>"; Avro adds amount = i / 100 as decimal(12, 2).
Version 2 of each schema adds a field `channel` ("app") that the tests'
tables lack: schema evolution.
"""

import argparse
import decimal
import json
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2

BASE_MS = 1_704_067_200_000


def avro_schema(version):
    fields = [
        {"name": "id", "type": "long"},
        {"name": "payload", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]
    if version == 2:
        fields.append({"name": "channel", "type": "string", "default": "web"})
    return json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": fields})


def proto_class(version):
    fd = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto",
        package="shop",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"],
    )
    m = fd.message_type.add(name="Order")
    F = descriptor_pb2.FieldDescriptorProto
    opt = F.LABEL_OPTIONAL
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=opt)
    m.field.add(name="payload", number=2, type=F.TYPE_STRING, label=opt)
    m.field.add(name="at", number=3, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=opt)
    m.field.add(name="note", number=4, type=F.TYPE_MESSAGE, type_name=".google.protobuf.StringValue", label=opt)
    if version == 2:
        m.field.add(name="channel", number=5, type=F.TYPE_STRING, label=opt)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--format", choices=["avro", "protobuf"], required=True)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--version", type=int, choices=[1, 2], default=1)
    ap.add_argument("--partition", type=int, default=0)
    a = ap.parse_args()

    client = SchemaRegistryClient({"url": a.registry})
    ctx = SerializationContext(a.topic, MessageField.VALUE)
    if a.format == "avro":
        serialize = AvroSerializer(client, avro_schema(a.version))

        def record(i):
            r = {
                "id": i,
                "payload": f"p{i}",
                "amount": decimal.Decimal(i).scaleb(-2),
                "at": BASE_MS + i,
                "note": None if i % 3 == 0 else f"n{i}",
            }
            if a.version == 2:
                r["channel"] = "app"
            return serialize(r, ctx)

    else:
        Order = proto_class(a.version)
        serialize = ProtobufSerializer(Order, client, {"use.deprecated.format": False})

        def record(i):
            o = Order(id=i, payload=f"p{i}")
            o.at.FromMilliseconds(BASE_MS + i)
            if i % 3 != 0:
                o.note.value = f"n{i}"
            if a.version == 2:
                o.channel = "app"
            return serialize(o, ctx)

    failed = []
    p = Producer({"bootstrap.servers": a.brokers, "enable.idempotence": True, "linger.ms": 5})
    for i in range(a.start, a.start + a.n):
        p.produce(a.topic, record(i), partition=a.partition, on_delivery=lambda e, m: e and failed.append(e))
        p.poll(0)
    left = p.flush(60)
    if failed or left:
        sys.exit(f"not delivered: {len(failed)} failed, {left} unconfirmed; first: {failed[:1]}")
    print(client.get_latest_version(f"{a.topic}-value").schema_id)


if __name__ == "__main__":
    main()
