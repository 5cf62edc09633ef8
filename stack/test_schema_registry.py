#!/usr/bin/env python3
"""Tests of stack/schema_registry.py with the official Confluent clients
(confluent-kafka's SchemaRegistryClient, AvroSerializer, ProtobufSerializer
and their deserializers), unchanged: run with the clients' venv
(SLUICE_CLIENTS_PYTHON). Each test starts its own registry on a free port
with a fresh database; `make test` runs them all.
"""

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema_registry.py")
PYTHON = os.environ.get("SLUICE_CHDB_PYTHON", sys.executable)

ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """One registry process on a free port, over `db`."""

    def __init__(self, db, auth=None):
        self.port = free_port()
        args = [PYTHON, SERVER, "--db", db, "--port", str(self.port)]
        if auth:
            args += ["--basic-auth", auth]
        self.proc = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(self.url + "/", timeout=1)
                return
            except urllib.error.HTTPError:
                return  # it answers (401 with auth)
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the registry did not start")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def order_proto(pool):
    """shop.Order in a pool of its own: id, a Timestamp (a well-known type the
    serializer does not register) and a status enum."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto",
        package="shop",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    e = fd.enum_type.add(name="Status")
    e.value.add(name="NEW", number=0)
    e.value.add(name="PAID", number=1)
    m = fd.message_type.add(name="Order")
    F = descriptor_pb2.FieldDescriptorProto
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(
        name="at", number=2, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
        label=F.LABEL_OPTIONAL,
    )
    m.field.add(name="status", number=3, type=F.TYPE_ENUM, type_name=".shop.Status", label=F.LABEL_OPTIONAL)
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


class SchemaRegistryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.db = os.path.join(self.dir.name, "registry.db")
        self.registry = Registry(self.db)
        self.client = SchemaRegistryClient({"url": self.registry.url})

    def tearDown(self):
        self.registry.stop()
        self.dir.cleanup()

    def test_avro_round_trips_through_the_official_serializers(self):
        ctx = SerializationContext("orders", MessageField.VALUE)
        data = AvroSerializer(self.client, ORDER)({"id": 7, "at": 1_700_000_000_123, "note": "x"}, ctx)
        self.assertEqual(data[0], 0, "magic byte")
        sid = int.from_bytes(data[1:5], "big")
        self.assertEqual(self.client.get_latest_version("orders-value").schema_id, sid)
        # A fresh client, as a consumer elsewhere would have.
        fresh = SchemaRegistryClient({"url": self.registry.url})
        got = AvroDeserializer(fresh)(data, ctx)
        self.assertEqual((got["id"], got["note"]), (7, "x"))
        self.assertEqual(int(got["at"].timestamp() * 1000), 1_700_000_000_123)

    def test_protobuf_round_trips_through_the_official_serializers(self):
        Order = order_proto(descriptor_pool.DescriptorPool())
        ctx = SerializationContext("porders", MessageField.VALUE)
        o = Order(id=9, status=1)
        o.at.FromMilliseconds(1_700_000_000_123)
        data = ProtobufSerializer(Order, self.client, {"use.deprecated.format": False})(o, ctx)
        self.assertEqual((data[0], data[5]), (0, 0), "magic byte, then message index [0]")
        got = ProtobufDeserializer(Order, {"use.deprecated.format": False})(data, ctx)
        self.assertEqual(got, o)
        schema = self.client.get_schema(int.from_bytes(data[1:5], "big"))
        self.assertEqual(schema.schema_type, "PROTOBUF")

    def test_one_schema_has_one_id_in_every_subject_and_versions_count(self):
        a = self.client.register_schema("a-value", Schema(ORDER, "AVRO"))
        b = self.client.register_schema("b-value", Schema(ORDER, "AVRO"))
        self.assertEqual(a, b)
        again = self.client.register_schema("a-value", Schema(json.dumps(json.loads(ORDER), indent=2), "AVRO"))
        self.assertEqual(again, a, "white space does not make a new schema")
        v2 = json.loads(ORDER)
        v2["fields"].append({"name": "qty", "type": "int", "default": 1})
        c = self.client.register_schema("a-value", Schema(json.dumps(v2), "AVRO"))
        self.assertNotEqual(c, a)
        self.assertEqual(self.client.get_versions("a-value"), [1, 2])
        self.assertEqual(self.client.get_version("a-value", 1).schema_id, a)
        self.assertEqual(self.client.lookup_schema("a-value", Schema(json.dumps(v2), "AVRO")).version, 2)
        self.assertEqual(sorted(self.client.get_subjects()), ["a-value", "b-value"])

    def test_references_must_name_a_registered_version(self):
        common = 'syntax = "proto3"; package common; message Money { int64 units = 1; }'
        order = 'syntax = "proto3"; package shop; import "common/money.proto"; message Order { common.Money total = 1; }'
        self.client.register_schema("common/money.proto", Schema(common, "PROTOBUF"))
        ref = SchemaReference("common/money.proto", "common/money.proto", 1)
        sid = self.client.register_schema("orders-value", Schema(order, "PROTOBUF", [ref]))
        got = self.client.get_schema(sid)
        self.assertEqual([(r.name, r.subject, r.version) for r in got.references], [("common/money.proto",) * 2 + (1,)])
        bad = SchemaReference("x.proto", "nope", 1)
        with self.assertRaises(SchemaRegistryError) as e:
            self.client.register_schema("orders-value", Schema(order, "PROTOBUF", [bad]))
        self.assertEqual(e.exception.error_code, 40401)

    def test_unknown_ids_and_subjects_have_the_real_error_codes(self):
        with self.assertRaises(SchemaRegistryError) as e:
            self.client.get_schema(4242)
        self.assertEqual((e.exception.http_status_code, e.exception.error_code), (404, 40403))
        with self.assertRaises(SchemaRegistryError) as e:
            self.client.get_latest_version("nothing-value")
        self.assertEqual(e.exception.error_code, 40401)
        with self.assertRaises(SchemaRegistryError) as e:
            self.client.register_schema("x-value", Schema("{not json", "AVRO"))
        self.assertEqual(e.exception.error_code, 42201)

    def test_ids_survive_a_restart(self):
        sid = self.client.register_schema("orders-value", Schema(ORDER, "AVRO"))
        self.registry.stop()
        self.registry = Registry(self.db)
        fresh = SchemaRegistryClient({"url": self.registry.url})
        self.assertEqual(fresh.get_schema(sid).schema_str, ORDER)
        self.assertEqual(fresh.register_schema("orders-value", Schema(ORDER, "AVRO")), sid)

    def test_basic_auth_is_required_when_set(self):
        self.registry.stop()
        self.registry = Registry(self.db, auth="sluice:s3cret")
        url = self.registry.url
        with self.assertRaises(SchemaRegistryError) as e:
            SchemaRegistryClient({"url": url}).get_subjects()
        self.assertEqual(e.exception.http_status_code, 401)
        ok = SchemaRegistryClient({"url": url, "basic.auth.user.info": "sluice:s3cret"})
        self.assertEqual(ok.get_subjects(), [])
        req = urllib.request.Request(url + "/subjects")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"sluice:wrong").decode())
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        self.assertEqual(e.exception.code, 401)


if __name__ == "__main__":
    unittest.main(verbosity=2)
