"""Same-host payload route: the dealer writes a batch's Arrow IPC streams into a POSIX shared
memory segment it reuses, and the TASK header names the segment and byte ranges instead of
carrying payload frames. The worker maps the segment read-only and reads the tables zero-copy.

WHY: over ipc:// every payload byte is copied into the kernel and out again and each 34 MB
message needs fresh receive memory; through shared memory a batch costs one memcpy on the dealer
(the Arrow serialization it needs anyway, into warm reused pages) and none on the worker. Fresh
segments would not help: their first-touch page faults cost as much as the copies saved
(messenger/README.md), so segments are reused, which needs three guards:
- a worker whose handler still references the input after answering (a cache of zero-copy
  views) cannot close its mapping; it says `shm_pinned` in the RESULT and the dealer retires that
  segment (unlinks it; the worker's mapping keeps the bytes alive and unchanged) instead of
  overwriting data someone still reads;
- a batch that was sent more than once (retry, requeue) retires its segment too: a slow first
  worker may still be reading it;
- segment names carry the dealer's pid; segments of dead dealers are swept on the next start
  (and by LocalCluster.stop), so a crashed Spark task does not leak /dev/shm.
The route is used only when the worker advertises the same host id (hostname + boot id) and
shm support; a worker that cannot open a segment answers a retryable ERROR (ShmUnavailable) and
the dealer falls back to frames for that worker. Linux only; elsewhere frames are used.

Ownership, not names: a worker opens a segment with its own uid, so a peer that could make it
map any `sparkgnn-*` segment by name could read (and, through `reply_shm`, overwrite) another
job's payloads. Each segment therefore carries a capability: 32 random bytes its creator writes
into the segment's first bytes (after a magic) when it makes it, and sends in the TASK header
next to the name (`"key"`). The worker maps the segment and compares the two (constant time)
before it reads, hashes or writes a single payload byte; a mismatch is refused with a line that
names the segment and nothing computed from its bytes. WHY a capability and not the peer's
uid (SO_PEERCRED): the data port is TCP loopback by default, where no peer credential exists,
and the key needs no platform support: segments are created 0600, so only the creating uid
(which may read them anyway) can learn a key; other users cannot, and TASKs travel from the
dealer straight to the worker (never through the broker). Tables start after the key's block
(`HEADER_BYTES`), so no part can cover or overwrite it.
"""

from __future__ import annotations

import hmac
import mmap
import os
import re
import socket

import numpy as np
import pyarrow as pa

from sparkgnn.messenger.watchdog import pid_alive

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^sparkgnn-(\d+)-([0-9a-f]{12})-(\d+)$")
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
MAGIC = b"sgnnshm1"
KEY_BYTES = 32
HEADER_BYTES = 64  # magic + key, padded: tables start here (8-byte aligned)


class ShmUnavailable(OSError):
    """The segment named by a task cannot be opened here (other host, namespace or user)."""


class ShmRefused(ValueError):
    """The task named a segment whose capability key it does not hold (not its own segment)."""


def check_key(key) -> bytes:
    """The capability key a header carries (hex) as bytes; ValueError unless 64 hex digits."""
    if not isinstance(key, str) or len(key) != 2 * KEY_BYTES or re.fullmatch(r"[0-9a-f]+", key) is None:
        raise ValueError(f"shared memory key must be {2 * KEY_BYTES} lowercase hex digits")
    return bytes.fromhex(key)


def supported() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) and hasattr(os, "ftruncate")


def host_id() -> str:
    """Hostname + kernel boot id: equal ids mean the same /dev/shm is (very likely) shared."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def sweep_stale() -> int:
    """Unlink segments whose creating process is gone; returns how many."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        m = _NAME.match(name)
        if m and not pid_alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass
    return removed


class Segment:
    """One writable, reusable shared memory segment owned by a dealer."""

    def __init__(self, name: str, size: int):
        self.name, self.size = name, size
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # Reserve the pages now: a sparse segment on a full tmpfs (Docker's default /dev/shm
            # is 64 MB) would SIGBUS on write instead of raising ENOSPC here.
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self._key = os.urandom(KEY_BYTES)  # the capability (module doc): only this creator knows it
        self._mm[: len(MAGIC) + KEY_BYTES] = MAGIC + self._key

    @property
    def key(self) -> str:
        """The capability a TASK sends with this segment's name (hex)."""
        return self._key.hex()

    def write_tables(self, tables) -> tuple[list, list[pa.Buffer]]:
        return write_tables(self._mm, tables)

    def copy_parts(self, parts) -> list[pa.Buffer]:
        """Private copies of byte ranges (a reply written here by a worker): the caller keeps
        the tables as long as it likes and the segment is free for the next batch at once."""
        out = []
        for offset, length in check_parts(parts, self.size):
            dest = np.empty(length, dtype=np.uint8)
            view = memoryview(self._mm)[offset : offset + length]
            dest[:] = np.frombuffer(view, dtype=np.uint8)
            view.release()
            out.append(pa.py_buffer(dest))
        return out

    def destroy(self) -> None:
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except OSError:
            pass
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with it


def write_tables(mm: mmap.mmap, tables) -> tuple[list, list[pa.Buffer]]:
    """Serialize each table as an Arrow IPC stream into `mm` after the key block, back to back
    (8-byte aligned). Returns ([[offset, length], ...], views of the written bytes for hashing)."""
    parts, views, offset = [], [], HEADER_BYTES
    for table, n in zip(tables, stream_sizes(tables), strict=True):
        if offset + n > len(mm):
            raise ValueError(f"tables need more than the segment's {len(mm)} bytes")
        dest = pa.py_buffer(memoryview(mm)[offset : offset + n])
        with pa.ipc.new_stream(pa.FixedSizeBufferWriter(dest), table.schema) as w:
            w.write_table(table)
        parts.append([offset, n])
        views.append(dest)
        offset += (n + 7) // 8 * 8
    return parts, views


def aligned_size(sizes) -> int:
    return sum((n + 7) // 8 * 8 for n in sizes)


def check_parts(parts, size: int) -> list:
    """`parts` as [[offset, length], ...] inside the segment's table area (after the key block);
    ValueError naming the bad part otherwise."""
    if not isinstance(parts, list):
        raise ValueError(f"shm parts must be a list of [offset, length], got {parts!r}")
    for part in parts:
        if (
            not isinstance(part, list)
            or len(part) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in part)
        ):
            raise ValueError(f"bad shm part {part!r}")
        offset, length = part
        if offset < HEADER_BYTES or length < 0 or offset + length > size:
            raise ValueError(f"shm part {part!r} outside segment of {size} bytes")
    return parts


def stream_sizes(tables) -> list[int]:
    out = []
    for table in tables:
        mock = pa.MockOutputStream()
        with pa.ipc.new_stream(mock, table.schema) as w:
            w.write_table(table)
        out.append(mock.size())
    return out


class SegmentPool:
    """A dealer's segments: acquire one big enough, release it for reuse or retire it."""

    def __init__(self, client: str, max_free: int = 8):
        self.client = client
        self.max_free = max_free  # bounds /dev/shm use: window in flight + this many idle
        self._free: list[Segment] = []
        self._n = 0
        self.retired = 0
        sweep_stale()

    def acquire(self, nbytes: int) -> Segment:
        for i, seg in enumerate(self._free):
            if seg.size >= nbytes + HEADER_BYTES:
                return self._free.pop(i)
        self._n += 1
        size = max(nbytes + HEADER_BYTES, 1 << 20)
        size = (size + (1 << 20) - 1) >> 20 << 20  # whole MiB, so a similar batch fits next time
        return Segment(f"sparkgnn-{os.getpid()}-{self.client}-{self._n}", size)

    def release(self, seg: Segment, reusable: bool) -> None:
        if reusable and len(self._free) < self.max_free:
            self._free.append(seg)
        else:
            self.retired += 0 if reusable else 1
            seg.destroy()

    def close(self) -> None:
        for seg in self._free:
            seg.destroy()
        self._free.clear()


class Mapping:
    """A worker's view of a dealer's segment for one task: read-only, or writable for a reply.
    Opened only when `key` (the hex capability from the task header) matches the one the
    segment's creator wrote into it (module doc); else ShmRefused, before any payload byte is
    read."""

    def __init__(self, name, max_bytes: int, *, key, writable: bool = False):
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"bad shared memory segment name {name!r}")
        expected = check_key(key)
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR if writable else os.O_RDONLY)
        except OSError as exc:
            raise ShmUnavailable(f"cannot open shared memory segment {name!r}: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            if not HEADER_BYTES < size <= max_bytes + (1 << 20):
                raise ValueError(f"segment {name!r} is {size} bytes, cap {max_bytes}")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self._mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=prot)
        finally:
            os.close(fd)
        held = self._mm[: len(MAGIC) + KEY_BYTES]
        if not hmac.compare_digest(held, MAGIC + expected):
            self._mm.close()
            raise ShmRefused(
                f"shared memory segment {name!r} is not this task's: the key sent with it does not "
                f"match (a task may name only segments its own dealer created for it)"
            )
        self.name, self.size = name, size

    def views(self, parts) -> list[pa.Buffer]:
        whole = pa.py_buffer(self._mm)
        return [whole.slice(offset, length) for offset, length in check_parts(parts, self.size)]

    def write_tables(self, tables) -> tuple[list, list[pa.Buffer]]:
        return write_tables(self._mm, tables)

    def close(self) -> bool:
        """Unmap; False when something still references the data (the segment is pinned)."""
        try:
            self._mm.close()
            return True
        except BufferError:
            return False
