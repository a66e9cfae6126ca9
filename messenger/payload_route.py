"""How a batch's payload travels from the dealer to its worker, and a result back.

- same host (the worker advertises this host's id and shared memory; batch >= shm_min_bytes):
  the Arrow streams are written once into a reused shared memory segment (shm.py) and the TASK
  is one header frame naming it; the dealer also offers a reply segment sized from the op's
  largest result so far, which the worker writes its result into.
- otherwise, or once /dev/shm failed (full, another namespace: the worker answered
  ShmUnavailable): header + one Arrow IPC frame per table, encoded once per batch.
Either encoding is reused, copy=False, by every retry; only the small header changes.

A mixin of MessengerTransport (dealer.py), which sets the state annotated below in its __init__.
"""

from __future__ import annotations

from sparkgnn.messenger import shm
from sparkgnn.messenger.batches import Batch
from sparkgnn.messenger.protocol import Kind, ProtocolError, encode_header, serialize_table, stamp


def nbytes(frame) -> int:
    return frame.size if hasattr(frame, "size") and not isinstance(frame, (bytes, bytearray)) else len(frame)


class PayloadRoute:
    # set by MessengerTransport.__init__
    max_message_bytes: int
    shm_min_bytes: int  # below this, mapping a segment costs more than a copy
    counts: dict
    _pool: shm.SegmentPool | None  # None: shared memory is off or unsupported here
    _shm_ok: bool  # False once writing a segment failed: frames from then on
    _host: str
    _no_shm: set[str]  # workers that could not map our segments
    _result_sizes: dict  # op -> largest result seen: sizes the reply segments

    def _frames_for(self, batch: Batch, assign: dict, data: str, lease) -> tuple[list, bool]:
        """The TASK frames for the worker `data` the broker ASSIGNed this attempt to, and whether
        the shared memory route was chosen."""
        use_shm = (
            self._pool is not None
            and self._shm_ok
            and bool(assign.get("shm"))
            and batch.nbytes >= self.shm_min_bytes
            and assign.get("host") == self._host
            and data not in self._no_shm
        )
        try:
            frames = self._task_frames(batch, use_shm, lease)
        except OSError as exc:  # /dev/shm full or unavailable: frames from now on
            self._shm_ok = False
            frames = self._task_frames(batch, False, lease)
            batch.history.append(f"shared memory unavailable ({exc}); using frames")
        return frames, use_shm

    def _shm_pool(self) -> shm.SegmentPool:
        """The segment pool, for the shared memory route, which is only taken when there is one."""
        assert self._pool is not None, "shared memory route taken without a segment pool"
        return self._pool

    def _task_frames(self, batch: Batch, use_shm: bool, lease) -> list:
        """The TASK for this attempt: header naming the shm segment, or header + payload frames.
        Each encoding is made once per batch and reused by retries."""
        extra = dict(token=batch.token, lease=lease, attempt=batch.tries, max_result_bytes=self.max_message_bytes)
        if use_shm:
            if batch.segment is None:
                tables = batch.tables
                assert tables is not None  # dropped only when the batch ends, and then nothing is sent
                pool = self._shm_pool()
                segment = pool.acquire(batch.nbytes)
                try:
                    parts, views = segment.write_tables(tables.values())
                    stamped = stamp(batch.header, Kind.TASK.value, tables, views)
                    del views
                except BaseException:
                    pool.release(segment, reusable=False)
                    raise
                # the key proves to the worker that this dealer made the segment (shm.py)
                stamped["shm"] = {"name": segment.name, "parts": parts, "key": segment.key}
                batch.segment, batch.shm_header = segment, stamped
            assert batch.shm_header is not None  # written together with batch.segment
            reply = self._reply_offer(batch, lease)
            if reply is not None:
                extra["reply_shm"] = reply
            return [encode_header(dict(batch.shm_header, **extra))]
        if batch.framed is None:
            tables = batch.tables
            assert tables is not None  # dropped only when the batch ends, and then nothing is sent
            payload = [serialize_table(t) for t in tables.values()]
            batch.framed = (stamp(batch.header, Kind.TASK.value, tables, payload), payload)
        stamped, payload = batch.framed
        return [encode_header(dict(stamped, **extra))] + payload

    def _reply_offer(self, batch: Batch, lease) -> dict | None:
        """A segment for the worker to write the result into, sized from the largest result this
        op returned so far (the first result of an op comes back as frames)."""
        size = self._result_sizes.get(batch.header.get("op"), 0)
        if size < self.shm_min_bytes:
            return None
        try:
            segment = self._shm_pool().acquire(size)
        except OSError:
            return None
        batch.replies[lease] = segment
        return {"name": segment.name, "size": segment.size, "key": segment.key}

    def _reply_buffers(self, batch: Batch, header: dict, nframes: int) -> list:
        """Copy a result out of the reply segment this dealer offered for that lease."""
        segment = batch.replies.get(header.get("lease"))
        ref = header["shm"]
        if nframes != 1 or segment is None or not isinstance(ref, dict) or ref.get("name") != segment.name:
            raise ProtocolError(f"result names a shared memory segment this dealer did not offer: {ref!r}")
        try:
            buffers = segment.copy_parts(ref.get("parts"))
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        self.counts["results_shm"] = self.counts.get("results_shm", 0) + 1
        return buffers

    def _drop_payload(self, batch: Batch, reusable: bool) -> None:
        """Return the batch's segment to the pool (or retire it) and drop its encodings."""
        if batch.segment is not None:
            self._shm_pool().release(batch.segment, reusable)
            if not reusable:
                self.counts["shm_retired"] = self.counts.get("shm_retired", 0) + 1
        for segment in batch.replies.values():
            # reply segments are private copies' sources; only a second sender could still write
            self._shm_pool().release(segment, batch.tries == 1)
        batch.replies = {}
        batch.segment = batch.shm_header = batch.framed = batch.tables = None
