"""The Ping service's two messages in protobuf's wire format, written and read here (probe.proto is
their contract; tests/test_ping_wire.py holds this module to protoc's code for it).

Protobuf's Python runtime and the generated classes cost a probe agent 2.7 MiB of resident memory
(2.2 MiB its own) to carry three numbers and two strings; gRPC itself takes any bytes. The bytes are
the same as protobuf's (fields in number order, defaults left out), and the reading follows its rules:
unknown fields (a newer agent's) are skipped, a field that comes twice keeps its last value, a string
must be UTF-8; anything else that does not parse is a MessageError, which the peer's Ping pays for.
One rule is ours: at most MAX_FIELDS fields. A message has four; 64 KiB of two-byte fields took 35 ms
of Python to read, 25 times what gRPC spends on a whole Ping, where protobuf's C reads it in microseconds.
"""
from __future__ import annotations

from typing import NamedTuple

METHOD = "/nodehealth.probe.v1.Probe/Ping"  # on the wire: probe.proto keeps its first package name
MAX_FIELDS = 16  # a Ping's four, a newer version's few more, and a field sent twice
_U64 = (1 << 64) - 1
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5  # the wire types a message may carry (groups are long gone)


class MessageError(ValueError):
    pass


class PingRequest(NamedTuple):
    seq: int = 0  # uint64: the prober's sequence number, echoed
    send_time_ns: int = 0  # int64: the prober's monotonic clock at send, echoed
    source: str = ""  # the prober's node name
    padding: bytes = b""  # the payload's size (pingmesh.payload_bytes)


class PingReply(NamedTuple):
    seq: int = 0
    send_time_ns: int = 0
    node: str = ""  # the answering node: a reply from the wrong node is not an answer


def encode_request(seq: int, send_time_ns: int, source: str, padding: bytes = b"") -> bytes:
    return _encode(seq, send_time_ns, source.encode(), padding)


def encode_reply(seq: int, send_time_ns: int, node: str) -> bytes:
    return _encode(seq, send_time_ns, node.encode(), b"")


def decode_request(data: bytes) -> PingRequest:
    seq, send_time_ns, source, padding = _decode(data)
    return PingRequest(seq, send_time_ns, source, bytes(padding))


def decode_reply(data: bytes) -> PingReply:
    """Fields 1-3 as in a request (a reply's field 3 is the answering node); a field 4 would be one the
    reply does not have, skipped as unknown."""
    seq, send_time_ns, node, _ = _decode(data)
    return PingReply(seq, send_time_ns, node)


def _encode(seq: int, send_time_ns: int, text: bytes, padding: bytes) -> bytes:
    """Fields 1 (uint64), 2 (int64), 3 (string) and 4 (bytes), each left out at its default."""
    out = bytearray()
    if seq:
        out.append(0x08)
        _varint(out, seq & _U64)
    if send_time_ns:
        out.append(0x10)
        _varint(out, send_time_ns & _U64)  # a negative int64 takes ten bytes, as in protobuf
    for tag, value in ((0x1A, text), (0x22, padding)):
        if value:
            out.append(tag)
            _varint(out, len(value))
            out += value
    return bytes(out)


def _varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _decode(data: bytes) -> tuple[int, int, str, memoryview]:
    """Fields 1 to 4 by the types probe.proto gives them; a known field number of another wire type is
    skipped as unknown, as protobuf does. Field 3 is a string each time it comes."""
    view = memoryview(data)
    seq = send_time_ns = 0
    text, padding = "", view[:0]
    at, end, fields = 0, len(view), 0
    while at < end:
        fields += 1
        if fields > MAX_FIELDS:
            raise MessageError(f"more than {MAX_FIELDS} fields")
        key, at = _read_varint(view, at, 5)
        number, kind = key >> 3, key & 7
        if not 0 < number < 1 << 29:  # a key is a 32-bit varint, the field number 29 bits of it
            raise MessageError(f"field number {number}")
        if kind == VARINT:
            value, at = _read_varint(view, at)
            if number == 1:
                seq = value
            elif number == 2:
                send_time_ns = value - (1 << 64) if value >> 63 else value
        elif kind == LENGTH:
            size, at = _read_varint(view, at)
            if size > end - at:
                raise MessageError("a field runs past the end of the message")
            if number == 3:
                text = _text(view[at:at + size])
            elif number == 4:
                padding = view[at:at + size]
            at += size
        elif kind in (FIXED64, FIXED32):
            at += 8 if kind == FIXED64 else 4
            if at > end:
                raise MessageError("a field runs past the end of the message")
        else:
            raise MessageError(f"wire type {kind} (field {number})")
    return seq, send_time_ns, text, padding


def _read_varint(view: memoryview, at: int, most: int = 10) -> tuple[int, int]:
    """A varint of at most `most` bytes, kept to its low 64 bits as protobuf keeps it."""
    value = shift = 0
    for i in range(at, min(at + most, len(view))):
        byte = view[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _U64, i + 1
        shift += 7
    raise MessageError(f"a varint runs past the end of the message or {most} bytes")


def _text(raw: memoryview) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise MessageError("field 3 is not UTF-8") from None
