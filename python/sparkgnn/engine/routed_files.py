"""One routed-rows file of the files exchange (engine.exchange): what partition p sends partition q
in one step, stored as two files so that the vectors are one contiguous block on disk.

- `from=p.arrow` (Arrow IPC): the rows' scalar columns (k, pt, kind, id, aux, w) and `vbytes`, the
  length of each row's vector; its schema metadata names the vector file.
- `from=p.<token>.vec`: the vectors' bytes, row after row, nothing else.

WHY two files: a reader that memory-maps the vector file gets every vector of the file as one
[rows, width] float32 matrix backed by the page cache (RoutedFile.matrix), not by the task's own
memory. The DL step multiplies it in place (dl/csr.py keeps a CSR block per source file), so a
partition's mirror payloads (most of a task's working set on a large graph; docs/ARCHITECTURE.md,
"Batch inference") do not count against the task's memory budget, and the planner need not raise
P (and the replication factor with it) to hold them. In one Arrow IPC file the vectors are split
into one buffer per record batch, which a sender must write in slices (a gather of every payload
it routes to a partition would be one more copy of them) and a reader could only use one slice at
a time.

Commit protocol: the writer writes both under hidden or unique names and renames the .arrow file
last; that rename is the commit (the .arrow file names the .vec file it goes with, so a retried
attempt's files never mix with an earlier attempt's). Readers check that the vector file holds
exactly the bytes the rows declare.
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from sparkgnn.engine.routing import ROW_SCHEMA
from sparkgnn.errors import SparkGNNError
from sparkgnn.files import join

VECTOR_FILE_KEY = b"sparkgnn.vectors"
FILE_SCHEMA = pa.schema([field for field in ROW_SCHEMA if field.name != "v"] + [pa.field("vbytes", pa.int32())])
FLOAT_BYTES = 4


class RoutedFileError(SparkGNNError, RuntimeError):
    """A routed-rows file is missing, damaged or does not match its vector file."""


def rows_path(directory: str, source: int) -> str:
    return join(directory, f"from={source}.arrow")


class RoutedFileWriter:
    """Writes the rows one partition sends one destination (see the module); commit() publishes them."""

    def __init__(self, fs: pafs.FileSystem, directory: str, source: int):
        token = uuid.uuid4().hex
        self._fs = fs
        self._vector_name = f"from={source}.{token}.vec"
        self._final = rows_path(directory, source)
        self._rows_temp = join(directory, f".from={source}.arrow.tmp-{token}")
        self._vectors_temp = join(directory, f".{self._vector_name}.tmp")
        self._vectors_final = join(directory, self._vector_name)
        self._rows_sink = fs.open_output_stream(self._rows_temp)
        self._vectors_sink = fs.open_output_stream(self._vectors_temp)
        schema = FILE_SCHEMA.with_metadata({VECTOR_FILE_KEY: self._vector_name.encode()})
        self._writer = pa.ipc.new_file(self._rows_sink, schema)
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Append routed rows (ROW_SCHEMA)."""
        vectors = batch.column("v")
        offsets = np.frombuffer(vectors.buffers()[1], dtype=np.int32, count=len(vectors) + 1, offset=vectors.offset * 4)
        data = vectors.buffers()[2]
        if len(vectors):
            self._vectors_sink.write(data[int(offsets[0]) : int(offsets[-1])])
        columns = [batch.column(name) for name in FILE_SCHEMA.names[:-1]]
        lengths = pa.array(np.diff(offsets).astype(np.int32, copy=False))
        self._writer.write_batch(pa.RecordBatch.from_arrays(columns + [lengths], schema=FILE_SCHEMA))
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()
        self._rows_sink.close()
        self._vectors_sink.close()

    def commit(self) -> int:
        """Publish the files (the .arrow rename last); returns their bytes."""
        self._fs.move(self._vectors_temp, self._vectors_final)
        self._fs.move(self._rows_temp, self._final)
        return sum(info.size for info in self._fs.get_file_info([self._final, self._vectors_final]))

    def abort(self) -> None:
        for path in (self._rows_temp, self._vectors_temp):
            try:
                self._fs.delete_file(path)
            except OSError:
                pass


class RoutedFile:
    """A committed routed-rows file, opened for reading (memory-mapped on a local disk)."""

    def __init__(self, fs: pafs.FileSystem, path: str):
        local = isinstance(fs, pafs.LocalFileSystem)
        self.path = path
        try:
            self._reader = pa.ipc.open_file(pa.memory_map(path) if local else fs.open_input_file(path))
            metadata = self._reader.schema.metadata or {}
            if self._reader.schema.remove_metadata() != FILE_SCHEMA or VECTOR_FILE_KEY not in metadata:
                raise RoutedFileError(f"{path} does not hold routed rows (schema {self._reader.schema})")
            vector_path = join(path.rsplit("/", 1)[0], metadata[VECTOR_FILE_KEY].decode())
            self._vectors = pa.memory_map(vector_path) if local else fs.open_input_file(vector_path)
            # read once: every later pass (columns, vectors, the matrix) reuses these views
            self._batches = [self._reader.get_batch(i) for i in range(self._reader.num_record_batches)]
        except (FileNotFoundError, pa.ArrowInvalid, OSError) as exc:
            raise RoutedFileError(f"{path}: {exc}") from exc
        self._lengths = [batch.column("vbytes").to_numpy() for batch in self._batches]
        declared = sum(int(lengths.sum(dtype=np.int64)) for lengths in self._lengths)
        if declared != self._vectors.size():
            raise RoutedFileError(
                f"{path} declares {declared} bytes of vectors but its vector file holds {self._vectors.size()}"
            )
        self.num_rows = sum(len(lengths) for lengths in self._lengths)

    def _vector_bytes(self, start: int, length: int) -> pa.Buffer:
        """Bytes start..start+length of the vector file (a view when memory-mapped)."""
        self._vectors.seek(start)
        return self._vectors.read_buffer(length)

    def batches(self):
        """The rows as ROW_SCHEMA batches, their vectors views of the vector file."""
        start = 0
        for batch, lengths in zip(self._batches, self._lengths, strict=True):
            offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            size = int(offsets[-1])
            data = self._vector_bytes(start, size) if size else pa.py_buffer(b"")
            start += size
            vectors = pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), data])
            columns = [batch.column(name) for name in FILE_SCHEMA.names[:-1]]
            yield pa.RecordBatch.from_arrays(columns + [vectors], schema=ROW_SCHEMA)

    def column(self, name: str) -> np.ndarray:
        """One scalar column over the whole file."""
        parts = [batch.column(name).to_numpy() for batch in self._batches]
        return np.concatenate(parts) if parts else np.zeros(0, FILE_SCHEMA.field(name).type.to_pandas_dtype())

    def matrix(self) -> np.ndarray | None:
        """Every vector of the file as one [rows, width] float32 view of the vector file, when all
        rows carry vectors of one width (else None). Memory-mapped: its pages belong to the page
        cache, which the kernel can drop and re-read, not to the task."""
        if not self.num_rows:
            return None
        lengths = np.concatenate(self._lengths)
        width_bytes = int(lengths[0])
        if width_bytes <= 0 or width_bytes % FLOAT_BYTES or not (lengths == width_bytes).all():
            return None
        data = self._vector_bytes(0, self._vectors.size())
        return np.frombuffer(data, dtype=np.float32).reshape(self.num_rows, width_bytes // FLOAT_BYTES)
