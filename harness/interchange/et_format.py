"""The Chakra execution trace (ET) format: its message classes and its files.

The messages are those of Chakra's schema, ``schema/protobuf/et_def.proto`` of the MLCommons
Chakra repository (https://github.com/mlcommons/chakra, read at commit 21585d8; its README
states the MIT license, its LICENSE.md file holds the Apache License 2.0 text; the schema is
the interchange format's specification). They are declared here field by field as a
``FileDescriptorProto`` and turned into classes by protobuf's own runtime (``descriptor_pool``,
``message_factory``), so installing the harness needs no ``protoc`` step and no generated
module. The pool is private: Chakra's own generated ``et_def_pb2`` (same package name) can be
imported in the same process.

A trace is one file per rank (``<prefix>.<rank>.et``, as ASTRA-sim's
``--workload-configuration=<prefix>`` expects): one ``GlobalMetadata`` message, then the
``Node`` messages, each preceded by its length as a varint (as Chakra's ``protolib``
``encodeMessage``/``decodeMessage`` write and read them). Gzip-compressed files are read too.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from harness.errors import HarnessError
from harness.results import atomic

PACKAGE = "ChakraProtoMsg"
# Chakra's project version whose et_def.proto the classes follow; written as GlobalMetadata.version.
SCHEMA_VERSION = "1.0.0"

NODE_TYPES = (
    "INVALID_NODE",
    "METADATA_NODE",
    "MEM_LOAD_NODE",
    "MEM_STORE_NODE",
    "COMP_NODE",
    "COMM_SEND_NODE",
    "COMM_RECV_NODE",
    "COMM_COLL_NODE",
)
COLLECTIVE_COMM_TYPES = (
    "ALL_REDUCE",
    "REDUCE",
    "ALL_GATHER",
    "GATHER",
    "SCATTER",
    "BROADCAST",
    "ALL_TO_ALL",
    "REDUCE_SCATTER",
    "REDUCE_SCATTER_BLOCK",
    "BARRIER",
)
# Numbers of the enums' values (their position in the schema).
NODE_TYPE = {name: i for i, name in enumerate(NODE_TYPES)}
COMM_TYPE = {name: i for i, name in enumerate(COLLECTIVE_COMM_TYPES)}

_F = descriptor_pb2.FieldDescriptorProto
# AttributeProto's oneof ``value``: each scalar kind at field 3 + 2i, the list of it at 4 + 2i.
_ATTRIBUTE_KINDS = (
    ("double", _F.TYPE_DOUBLE),
    ("float", _F.TYPE_FLOAT),
    ("int32", _F.TYPE_INT32),
    ("int64", _F.TYPE_INT64),
    ("uint32", _F.TYPE_UINT32),
    ("uint64", _F.TYPE_UINT64),
    ("sint32", _F.TYPE_SINT32),
    ("sint64", _F.TYPE_SINT64),
    ("fixed32", _F.TYPE_FIXED32),
    ("fixed64", _F.TYPE_FIXED64),
    ("sfixed32", _F.TYPE_SFIXED32),
    ("sfixed64", _F.TYPE_SFIXED64),
    ("bool", _F.TYPE_BOOL),
    ("string", _F.TYPE_STRING),
    ("bytes", _F.TYPE_BYTES),
)


def _list_name(kind: str) -> str:
    return {
        "uint32": "Uint32",
        "uint64": "Uint64",
        "sint32": "Sint32",
        "sint64": "Sint64",
        "sfixed32": "Sfixed32",
        "sfixed64": "Sfixed64",
    }.get(kind, kind.capitalize()) + "List"


def _field(
    message: Any,
    name: str,
    number: int,
    kind: int,
    repeated: bool = False,
    type_name: str = "",
    oneof: int | None = None,
) -> None:
    f = message.field.add(
        name=name, number=number, type=kind, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    )
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def _schema() -> descriptor_pb2.FileDescriptorProto:
    """et_def.proto's definitions, as protoc would describe them."""
    file = descriptor_pb2.FileDescriptorProto(name="chakra/et_def.proto", package=PACKAGE, syntax="proto3")
    attribute = file.message_type.add(name="AttributeProto")
    _field(attribute, "name", 1, _F.TYPE_STRING)
    _field(attribute, "doc_string", 2, _F.TYPE_STRING)
    attribute.oneof_decl.add(name="value")
    for i, (kind, wire) in enumerate(_ATTRIBUTE_KINDS):
        _field(attribute, f"{kind}_val", 3 + 2 * i, wire, oneof=0)
        _field(attribute, f"{kind}_list", 4 + 2 * i, _F.TYPE_MESSAGE, type_name=_list_name(kind), oneof=0)
    for kind, wire in _ATTRIBUTE_KINDS:
        _field(file.message_type.add(name=_list_name(kind)), "values", 1, wire, repeated=True)
    metadata = file.message_type.add(name="GlobalMetadata")
    _field(metadata, "version", 1, _F.TYPE_STRING)
    _field(metadata, "attr", 2, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")
    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_COMM_TYPES)):
        enum = file.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    node = file.message_type.add(name="Node")
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    _field(node, "type", 3, _F.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, repeated=True)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, repeated=True)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")
    io = file.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io, name, number, _F.TYPE_STRING)
    tensor = file.message_type.add(name="Tensor")
    for number, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"), start=1):
        _field(tensor, name, number, _F.TYPE_UINT64)
    _field(tensor, "device", 6, _F.TYPE_STRING)
    return file


def _classes() -> dict[str, type]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_schema())
    described = pool.FindFileByName("chakra/et_def.proto")
    get = getattr(message_factory, "GetMessageClass", None)
    if get is None:  # protobuf before 4.21
        factory = message_factory.MessageFactory(pool)
        get = factory.GetPrototype
    return {name: get(d) for name, d in described.message_types_by_name.items()}


_CLASSES = _classes()
AttributeProto = _CLASSES["AttributeProto"]
GlobalMetadata = _CLASSES["GlobalMetadata"]
Node = _CLASSES["Node"]
IOInfo = _CLASSES["IOInfo"]
StringList = _CLASSES["StringList"]
Int64List = _CLASSES["Int64List"]


class TraceFormatError(HarnessError, ValueError):
    """A file that is not a readable Chakra ET (the message says which file and where)."""


# --- attributes -------------------------------------------------------------------------------


def attribute(name: str, value: Any, kind: str | None = None) -> Any:
    """An ``AttributeProto`` named ``name``: ``kind`` picks the field (``int64``, ``int32``,
    ``uint64``, ``double``, ``bool``, ``string``); by default from the value's Python type."""
    if kind is None:
        kind = (
            "bool"
            if isinstance(value, bool)
            else "int64"
            if isinstance(value, int)
            else "double"
            if isinstance(value, float)
            else "string"
        )
    return AttributeProto(name=name, **{f"{kind}_val": value})


def attr_value(attr: Any) -> Any:
    """The value an ``AttributeProto`` holds, whichever field of its oneof (a list as a list)."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    return list(value.values) if which.endswith("_list") else value


def attrs_of(message: Any) -> dict[str, Any]:
    """``{name: value}`` of a node's (or the metadata's) attributes; the first of a repeated name wins."""
    out: dict[str, Any] = {}
    for attr in message.attr:
        out.setdefault(attr.name, attr_value(attr))
    return out


# --- files ------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def encode(messages: Iterable[Any]) -> bytes:
    """The messages, each preceded by its length as a varint (protolib's ``encodeMessage``)."""
    parts = []
    for message in messages:
        data = message.SerializeToString()
        parts += [_varint(len(data)), data]
    return b"".join(parts)


def _messages(data: bytes, where: str) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        size, shift, start = 0, 0, pos
        while True:
            if pos >= len(data):
                raise TraceFormatError(f"{where}: the file ends inside a message's length (byte {start})")
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 64:
                raise TraceFormatError(f"{where}: a message length of more than 10 bytes at byte {start}")
        if size == 0:  # protolib's reader stops at a zero length
            return
        if pos + size > len(data):
            raise TraceFormatError(f"{where}: a message of {size} bytes at byte {start} runs past the end of the file")
        yield data[pos : pos + size]
        pos += size


def read_trace(path: str | Path) -> tuple[Any, list[Any]]:
    """(the ``GlobalMetadata``, the ``Node`` messages) of one ET file."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    chunks = _messages(data, str(path))
    metadata = GlobalMetadata()
    nodes = []
    try:
        first = next(chunks, None)
        if first is None:
            raise TraceFormatError(f"{path}: empty: a Chakra ET starts with its GlobalMetadata")
        metadata.ParseFromString(first)
        for chunk in chunks:
            node = Node()
            node.ParseFromString(chunk)
            nodes.append(node)
    except TraceFormatError:
        raise
    except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError and kin: not this schema's messages)
        raise TraceFormatError(f"{path}: not a Chakra ET (message {len(nodes) + 1} does not decode: {exc})") from None
    return metadata, nodes


def write_trace(path: str | Path, metadata: Any, nodes: Iterable[Any]) -> Path:
    """Write one ET file (replacing it atomically)."""
    return atomic.write_bytes(path, encode([metadata, *nodes]))
