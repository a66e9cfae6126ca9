"""Wire protocol: one message = [header JSON | one Arrow IPC stream per named table].

WHY this shape: the header is small, human-readable JSON (never pickle: nothing from the wire is
ever unpickled or eval'd) that the broker can route on without touching payload bytes; each table
is a self-describing Arrow IPC stream the receiver maps zero-copy from the ZeroMQ frame.
`decode` is the one gate every received message passes: it checks size caps, version, kind, the
table list against the frame count, the payload hash and every Arrow stream, and raises a
`ProtocolError` naming what is wrong, so a malformed message is counted and dropped instead of
crashing a broker or worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum

import pyarrow as pa

from sparkgnn.messenger import hashing
from sparkgnn.messenger.errors import MessengerError

# Version rule: adding an optional header field keeps the version (receivers ignore fields they
# do not know, and a sender must not rely on a peer having read one); a new kind, a removed or
# renamed field or a changed meaning bumps it, and peers of different versions refuse each other.
PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024


class Kind(str, Enum):
    """Message kinds. The first six are the ZeroMQ guide's; the rest are the control plane that
    keeps payloads off the broker (see broker.py)."""

    READY = "READY"  # worker -> broker: I serve at <data endpoint> with <slots>
    HEARTBEAT = "HEARTBEAT"  # both ways (Paranoid Pirate); dealer pings, broker answers with
    # live_workers and back (its worker endpoint): the liveness probe
    TASK = "TASK"  # dealer -> worker (direct): run op on these tables
    RESULT = "RESULT"  # worker -> dealer (direct)
    ERROR = "ERROR"  # worker -> dealer: the task was refused (handler raised, bad frames)
    DISCONNECT = "DISCONNECT"  # worker -> broker on clean exit; broker -> worker on shutdown
    LEASE = "LEASE"  # dealer -> broker: assign a worker to batch <token>
    ASSIGN = "ASSIGN"  # broker -> dealer: batch <token> goes to worker <data endpoint>
    BUSY = "BUSY"  # broker -> dealer: queue full, retry after <retry_after> s
    DONE = "DONE"  # worker -> broker: lease <id> finished, slot free
    RELEASE = "RELEASE"  # dealer -> broker: I will not use lease <id> (or token) after all
    STATS = "STATS"  # dealer -> broker -> dealer: metrics snapshot


class ProtocolError(MessengerError, ValueError):
    """A message violates the wire protocol (version, kind, size, hash, truncated Arrow...)."""


class MessageTooLarge(ProtocolError):
    """A message is over the receiver's size cap. Carries the sizes and, when the header frame
    itself was readable, the header, so a worker can answer the sender's batch with an ERROR
    instead of dropping it unanswered."""

    def __init__(self, message: str, size: int, limit: int, header: dict | None = None):
        super().__init__(message)
        self.size, self.limit, self.header = size, limit, header


Handler = Callable[[dict, dict], tuple]
"""What a worker runs per TASK: handler(header, tables) -> (result header fields, result tables).
Tables are `dict[str, pyarrow.Table]`."""

_KINDS = {k.value for k in Kind}
# Header keys the protocol owns: encode() sets them, handlers cannot override them.
RESERVED = ("v", "kind", "tables", "rows", "hash")


def _nbytes(frame) -> int:
    """A frame's size in bytes. WHY the type checks first: `hasattr` on a zmq.Frame goes through
    pyzmq's option lookup (__getattr__) and costs microseconds per frame on every message."""
    if isinstance(frame, bytes):
        return len(frame)
    if isinstance(frame, pa.Buffer):
        return frame.size
    if isinstance(frame, memoryview) or hasattr(type(frame), "nbytes"):
        return frame.nbytes
    return len(frame)


def serialize_table(table: pa.Table) -> pa.Buffer:
    """One Arrow IPC stream for `table`, written into an exactly sized buffer.

    WHY the mock pass: it sizes the stream without copying data, so the real write is a single
    memcpy into a buffer that never reallocates (faster than a growing BufferOutputStream;
    messenger/README.md)."""
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, table.schema) as writer:
        writer.write_table(table)
    out = pa.allocate_buffer(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(out), table.schema) as writer:
        writer.write_table(table)
    return out


def encode_header(header: Mapping) -> bytes:
    try:
        data = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"header is not plain JSON: {exc}") from None
    if len(data) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {len(data)} bytes > cap {MAX_HEADER_BYTES}")
    return data


def encode(
    header: Mapping, tables: Mapping[str, pa.Table] | None = None, *, hash_algorithm: str = hashing.DEFAULT
) -> list:
    """Frames for one message: [header JSON, IPC stream of each table in `tables` order].

    The header gets `v`, `kind` (validated), `tables` (names in frame order), `rows` per table and
    `hash` over the payload frames. Payload frames are pyarrow Buffers: send them with
    copy=False."""
    tables = dict(tables or {})
    kind = header.get("kind")
    kind = kind.value if isinstance(kind, Kind) else kind
    if kind not in _KINDS:
        raise ProtocolError(f"unknown kind {kind!r}")
    for name, table in tables.items():
        if not isinstance(name, str) or not isinstance(table, pa.Table):
            raise ProtocolError(f"tables must map str -> pyarrow.Table, got {name!r}: {type(table).__name__}")
    payload = [serialize_table(t) for t in tables.values()]
    return [encode_header(stamp(header, kind, tables, payload, hash_algorithm))] + payload


def stamp(
    header: Mapping, kind: str, tables: Mapping[str, pa.Table], payload: Sequence, hash_algorithm: str = hashing.DEFAULT
) -> dict:
    """The header with the protocol-owned fields filled in for these payload frames."""
    out = dict(header)
    out.update(v=PROTOCOL_VERSION, kind=kind, tables=list(tables), rows={n: t.num_rows for n, t in tables.items()})
    out["hash"] = hashing.digest(payload, hash_algorithm) if payload else None
    return out


def _parse_header(frame) -> dict:
    raw = bytes(frame) if not isinstance(frame, bytes) else frame
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header frame is {len(raw)} bytes > cap {MAX_HEADER_BYTES}")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"header is not JSON ({len(raw)} bytes, starts {raw[:16]!r})") from None
    except RecursionError:  # "[[[[..." within the byte cap: refused, never a traceback
        raise ProtocolError(f"header nests too deeply ({len(raw)} bytes, starts {raw[:16]!r})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header is JSON {type(header).__name__}, not an object")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r} != {PROTOCOL_VERSION}")
    if header.get("kind") not in _KINDS:
        raise ProtocolError(f"unknown kind {header.get('kind')!r}")
    return header


def peek_header(frames: Sequence, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict:
    """Validate size + header only (no payload): what a router needs to route a message."""
    if not frames:
        raise ProtocolError("empty message")
    total = sum(_nbytes(f) for f in frames)
    if total > max_bytes:
        raise MessageTooLarge(
            f"oversize message: {total} bytes > cap {max_bytes}", total, max_bytes, _header_or_none(frames[0])
        )
    return _parse_header(frames[0])


def _header_or_none(frame) -> dict | None:
    """The header of an oversize message, when it is valid on its own (it is capped at
    MAX_HEADER_BYTES, so reading it costs little): who to answer."""
    try:
        return _parse_header(frame)
    except ProtocolError:
        return None


def frame_buffer(frame) -> pa.Buffer:
    """Zero-copy view of a zmq.Frame / bytes / memoryview as a pyarrow Buffer."""
    if isinstance(frame, pa.Buffer):
        return frame
    buf = getattr(frame, "buffer", None)
    return pa.py_buffer(buf if buf is not None else frame)


def _table_names(header: dict, payload_frames: int) -> list[str]:
    names = header.get("tables") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolError(f"header 'tables' must be a list of names, got {names!r}")
    if len(set(names)) != len(names):
        raise ProtocolError(f"duplicate table names {names!r}")
    if len(names) != payload_frames:
        raise ProtocolError(
            f"header names {len(names)} tables but the message has "
            f"{payload_frames} payload frames (truncated or padded message)"
        )
    return names


def _check_hash(header: dict, buffers: list[pa.Buffer]) -> None:
    if not buffers:
        return
    claimed = header.get("hash")
    if not isinstance(claimed, str) or ":" not in claimed:
        raise ProtocolError(f"payload hash missing or malformed: {claimed!r}")
    algorithm = claimed.split(":", 1)[0]
    if algorithm not in hashing.HASHERS:
        raise ProtocolError(f"unknown payload hash algorithm {algorithm!r}")
    actual = hashing.digest(buffers, algorithm)
    if actual != claimed:
        # never the computed digest: echoed, it would let a peer probe bytes it cannot read
        raise ProtocolError(f"payload hash mismatch: the payload does not hash to the header's {claimed}")


def check_payload_hash(header: dict, buffers: list) -> None:
    """ProtocolError unless `buffers` (payload frames as pa.Buffers) hash to the header's `hash`:
    for a receiver that reads a payload of its own layout instead of Arrow tables."""
    _check_hash(header, buffers)


def _read_table(name: str, buf: pa.Buffer) -> pa.Table:
    try:
        table = pa.ipc.open_stream(buf).read_all()
        # Structural validation always; full (offsets, O(n)) only where offsets exist, because
        # a crafted stream with bad offsets would otherwise read out of bounds later.
        table.validate(full=any(_has_offsets(f.type) for f in table.schema))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ProtocolError(
            f"table {name!r}: truncated or invalid Arrow IPC stream ({buf.size} bytes): {exc}"
        ) from None
    return table


def _has_offsets(t: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(t):
        return _has_offsets(t.value_type)
    return not (pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_null(t))


def decode(frames: Sequence, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> tuple[dict, dict]:
    """(header, tables) of a received message, or ProtocolError naming what is wrong."""
    header = peek_header(frames, max_bytes)
    if header.get("shm") is not None:
        raise ProtocolError("message refers to shared memory; this receiver takes frames only")
    return decode_payload(header, [frame_buffer(f) for f in frames[1:]], max_bytes)


def decode_payload(header: dict, buffers: list, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> tuple[dict, dict]:
    """Validate `buffers` (payload frames, or views of a shared memory segment) against the
    already peeked `header` and read the tables zero-copy."""
    total = sum(b.size for b in buffers)
    if total > max_bytes:
        raise MessageTooLarge(f"oversize message: {total} payload bytes > cap {max_bytes}", total, max_bytes, header)
    names = _table_names(header, len(buffers))
    _check_hash(header, buffers)
    rows = header.get("rows") or {}
    if names and not isinstance(rows, dict):
        raise ProtocolError(f"header 'rows' must map table -> row count, got {rows!r}")
    tables = {}
    for name, buf in zip(names, buffers, strict=True):
        table = _read_table(name, buf)
        if rows.get(name) != table.num_rows:
            raise ProtocolError(f"table {name!r} has {table.num_rows} rows, header says {rows.get(name)!r}")
        tables[name] = table
    return header, tables


def control(kind: Kind, **fields) -> list[bytes]:
    """A payload-free control message (one frame)."""
    return [
        encode_header({**fields, "v": PROTOCOL_VERSION, "kind": kind.value, "tables": [], "rows": {}, "hash": None})
    ]
