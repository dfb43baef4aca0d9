"""The Ping messages as ping_wire writes and reads them, held to protoc's own code for probe.proto:
the same bytes for the same values, the same values from any bytes both accept, and nothing accepted
that protobuf refuses. An agent of a version that used protobuf's classes and one of this version
answer each other (tests/test_probe_agent.py calls the agent with protoc's stubs, as such a prober)."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nodehealth.pingmesh import ping_wire

U64 = st.integers(0, (1 << 64) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)


@pytest.fixture(scope="module")
def reference(protoc_probe):
    return protoc_probe[0]


def test_the_contract_is_probe_proto(reference):
    """Each message's fields, by number, name and type, are those ping_wire writes and reads: editing
    probe.proto without this module fails here."""
    from google.protobuf.descriptor import FieldDescriptor as F
    fields = {m: [(f.number, f.name, f.type) for f in getattr(reference, m).DESCRIPTOR.fields]
              for m in ("PingRequest", "PingReply")}
    assert fields == {
        "PingRequest": [(1, "seq", F.TYPE_UINT64), (2, "send_time_ns", F.TYPE_INT64), (3, "source", F.TYPE_STRING),
                        (4, "padding", F.TYPE_BYTES)],
        "PingReply": [(1, "seq", F.TYPE_UINT64), (2, "send_time_ns", F.TYPE_INT64), (3, "node", F.TYPE_STRING)]}
    assert list(ping_wire.PingRequest._fields) == [f for _, f, _ in fields["PingRequest"]]
    assert list(ping_wire.PingReply._fields) == [f for _, f, _ in fields["PingReply"]]
    assert reference.DESCRIPTOR.package == "nodehealth.probe.v1"  # the method's path on the wire


@settings(max_examples=300, deadline=None)
@given(seq=U64, t=I64, source=st.text(max_size=40), padding=st.binary(max_size=300))
@example(seq=0, t=0, source="", padding=b"")  # every field at its default: no bytes at all
@example(seq=(1 << 64) - 1, t=-1, source="n\u00e9ud-7", padding=b"\0" * 200)
def test_the_same_values_make_the_same_bytes_both_ways(reference, seq, t, source, padding):
    request = reference.PingRequest(seq=seq, send_time_ns=t, source=source, padding=padding)
    ours = ping_wire.encode_request(seq, t, source, padding)
    assert ours == request.SerializeToString()
    assert ping_wire.decode_request(ours) == (seq, t, source, padding)
    reply = reference.PingReply(seq=seq, send_time_ns=t, node=source)
    assert ping_wire.encode_reply(seq, t, source) == reply.SerializeToString()
    assert ping_wire.decode_reply(reply.SerializeToString()) == (seq, t, source)


def fields():
    """A message's fields of any number and wire type, well formed or not: protobuf's reading decides."""
    varint = st.integers(0, (1 << 70)).map(lambda v: bytes(_varint(v)))
    key = st.tuples(st.integers(0, 6), st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7])).map(
        lambda nk: bytes(_varint(nk[0] << 3 | nk[1])))
    body = st.one_of(varint, st.binary(max_size=12), st.binary(max_size=8).map(lambda b: bytes(_varint(len(b))) + b),
                     st.text(max_size=6).map(lambda s: bytes(_varint(len(s.encode()))) + s.encode()),
                     st.just(b"\x02\xff\xfe"))  # a length-2 field that is no UTF-8
    return st.lists(st.tuples(key, body).map(lambda kb: kb[0] + kb[1]), max_size=6).map(b"".join)


def _varint(v: int) -> bytearray:
    out = bytearray()
    ping_wire._varint(out, v)
    return out


@settings(max_examples=1500, deadline=None)
@given(data=st.one_of(fields(), st.binary(max_size=40)))
@example(data=b"\x08" + b"\xff" * 9 + b"\x7f")  # a ten-byte varint past 64 bits: its low 64 kept
@example(data=b"\x08" + b"\xff" * 10 + b"\x01")  # eleven bytes: refused
@example(data=b"\x1a\x02\xff\xfe")  # source that is no UTF-8
@example(data=b"\x08\x01\x08\x02")  # a field twice: the last one counts
@example(data=b"\x0a\x01x\x18\x05")  # seq as bytes and source as a varint: both unknown, skipped
@example(data=b"\x2a\x03abc\x30\x07")  # fields 5 and 6 of a newer version, skipped
def test_any_bytes_read_as_protobuf_reads_them(reference, data):
    """Whatever ping_wire accepts protobuf accepts with the same values; what protobuf refuses ping_wire
    refuses. Only groups (wire types 3 and 4, deprecated before proto3) and more than MAX_FIELDS fields
    are refused here where protobuf may take them."""
    from google.protobuf.message import DecodeError
    for ours, theirs, names in ((ping_wire.decode_request, reference.PingRequest, ping_wire.PingRequest._fields),
                                (ping_wire.decode_reply, reference.PingReply, ping_wire.PingReply._fields)):
        try:
            expected = theirs.FromString(data)
        except DecodeError:
            expected = None
        try:
            got = ours(data)
        except ping_wire.MessageError as e:
            assert expected is None or "wire type" in str(e) or "fields" in str(e), (data, expected, e)
            continue
        assert expected is not None, (data, got)
        assert got == tuple(getattr(expected, f) for f in names), data


def test_a_peers_junk_is_read_no_further_than_a_few_fields(reference):
    """64 KiB of two-byte fields took 35 ms to read: a Ping of more than MAX_FIELDS fields is refused at
    the first one past it (protobuf would take it; no agent sends one)."""
    junk = b"\x28\x00" * 32768  # field 5, a varint 0, again and again
    assert reference.PingRequest.FromString(junk) is not None
    with pytest.raises(ping_wire.MessageError, match="more than 16 fields"):
        ping_wire.decode_request(junk)
    padded = ping_wire.encode_request(7, -1, "node-a", b"\0" * 65000) + b"\x28\x00" * 12  # 16 fields
    assert ping_wire.decode_request(padded).seq == 7
