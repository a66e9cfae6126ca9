"""How routed rows travel from one layer step to the next: Spark's shuffle, or Arrow IPC files in
the work dir that the tasks write and read themselves.

Why files: through Spark a layer's routed rows cross the Python -> JVM pipe (Arrow -> UnsafeRow),
the shuffle write and fetch, and the JVM -> Python pipe (UnsafeRow -> Arrow) again, with the Python
phases waiting on it (rows_in, the back-pressure inside scatter). Written by the task that computed
them as Arrow IPC, the same rows cost one write and nothing to read (memory-mapped from the page
cache, placed by id straight into the DL step's buffers). The measured gain is in
docs/ARCHITECTURE.md ("Batch inference"). Spark still schedules every step (one task per partition,
retried on failure) and still moves the rows wherever a step needs SQL: edge_join's join and PE
precomputation's per-layer DataFrames use the shuffle. The features reach the first step through
files too, from a scan job whose tasks read the graph's vertex files (FileExchange.scan_features);
its files are kept beside the prepared layout of that graph and P, so later jobs skip the scan
(keep_features, FileExchange.reuse_features).

On-disk layout of one run: `<work>/runs/<key>/step=<i>/to=<q>/from=<p>.arrow` (engine.run_dir:
the key hashes graph, model and plan). Every task writes one file per destination partition
(empty when it routes nothing there) under a hidden temporary name and renames it, so a retried or
speculative attempt replaces its files whole and a reader can tell a finished step (P files for
its partition) from a broken one; once every partition reported, the driver commits the step
(its marker, written last). A step's files are deleted once the next step has committed, and the
whole run directory when the job ends, unless it failed because something was lost (an executor,
a worker): then its committed steps stay for the rerun to resume from (engine.failures). Nothing
else is touched.

The choice is a registry (EXCHANGES); "auto" picks files where every executor sees the work dir
as a local disk (a local or local-cluster master and a local work dir), the shuffle elsewhere.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from sparkgnn.engine.materialise import MATERIALISERS, is_local_master
from sparkgnn.engine.routed_files import RoutedFile, RoutedFileError, RoutedFileWriter, rows_path
from sparkgnn.engine.routing import FILES_SCHEMA_DDL
from sparkgnn.engine.run_dir import RunDir
from sparkgnn.engine.spark_compat import driver_is_here
from sparkgnn.errors import SparkGNNError
from sparkgnn.files import filesystem, is_local, join, parquet_batches


class ExchangeError(SparkGNNError, RuntimeError):
    """A step's routed rows are missing or damaged (the previous step did not finish a partition)."""


def summary_row(part: int, rows: int, num_bytes: int) -> pa.RecordBatch:
    """What a task that wrote files hands Spark: one row (pt, rows, bytes), FILES_SCHEMA_DDL."""
    return pa.RecordBatch.from_arrays(
        [pa.array([part], pa.int32()), pa.array([rows], pa.int64()), pa.array([num_bytes], pa.int64())],
        names=["pt", "rows", "bytes"],
    )


def _by_destination(batch: pa.RecordBatch, partitions: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(destination, rows) pieces of a routed batch; most batches name one destination."""
    pt = batch.column("pt").to_numpy()
    low, high = (int(pt.min()), int(pt.max())) if len(pt) else (0, 0)
    if low < 0 or high >= partitions:
        raise ExchangeError(
            f"a routed row names partition {low if low < 0 else high}, outside 0..{partitions - 1}: "
            "only routed rows travel through files (edge_join's unrouted payloads need the shuffle)"
        )
    if low == high:
        yield low, batch
        return
    order = np.argsort(pt, kind="stable")
    counts = np.bincount(pt, minlength=partitions)
    ordered = batch.take(pa.array(order))
    start = 0
    for destination, count in enumerate(counts):
        if count:
            yield destination, ordered.slice(start, int(count))
            start += int(count)


def write_routed(step_dir: str, part: int, partitions: int, batches) -> Iterator[pa.RecordBatch]:
    """Task side: write partition `part`'s routed output batches into one routed-rows file per
    destination under `step_dir` (engine.routed_files); yields one summary row (pt, rows, bytes)."""
    fs, directory = filesystem(step_dir)
    writers: list[RoutedFileWriter] = []
    try:
        for q in range(partitions):  # the driver made the directories (FileExchange.paths)
            writers.append(RoutedFileWriter(fs, join(directory, f"to={q}"), part))
        for batch in batches:
            for destination, piece in _by_destination(batch, partitions):
                writers[destination].write(piece)
        for writer in writers:
            writer.close()
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    written = sum(writer.commit() for writer in writers)
    yield summary_row(part, sum(writer.rows for writer in writers), written)


def routed_files(step_dir: str, part: int, partitions: int) -> Iterator[RoutedFile]:
    """Task side: the P routed-rows files addressed to `part` by the previous step, source by
    source (memory-mapped on a local disk)."""
    fs, directory = filesystem(step_dir)
    for source in range(partitions):
        path = rows_path(join(directory, f"to={part}"), source)
        try:
            yield RoutedFile(fs, path)
        except RoutedFileError as exc:
            raise ExchangeError(
                f"routed rows from partition {source} to partition {part} are missing or damaged ({exc}); "
                "the previous step did not finish that partition"
            ) from exc


SCAN_BATCH_ROWS = 32768


def scan_vertex_files(step_dir: str, files: list[str], partitions: int, keys, reader: int, column: str = "x"):
    """Task side of the feature scan: reader `reader` of P reads the vertex files files[reader::P]
    (id and the feature column, batch by batch) and writes every vertex's own row (kind OWN, x
    packed) to its owner's file. Ownership is Spark's pmod(hash(id), P), computed in numpy."""
    from sparkgnn.arrowvec import pack_binary, to_numpy_matrix
    from sparkgnn.engine.routing import OWN, make_rows, owner_partition

    def rows():
        for path in files[reader::partitions]:
            for batch in parquet_batches(path, ["id", column], SCAN_BATCH_ROWS):
                ids = batch.column("id").to_numpy().astype(np.int64, copy=False)
                vectors = pack_binary(to_numpy_matrix(batch.column(column)))
                yield make_rows(keys, owner_partition(ids, partitions), OWN, ids, vectors)

    yield from write_routed(step_dir, reader, partitions, rows())


def control_rows(spark, partitions: int, tasks: int | None = None):
    """P control rows (pt) in `tasks` Spark partitions (default P: one per task; range slices, no
    shuffle): what a job whose tasks read and write files themselves runs over. With fewer tasks
    than partitions, task j serves a contiguous run of partitions one after another (the memory
    rule's concurrent tasks, planner.partitions)."""
    tasks = partitions if tasks is None else max(1, min(int(tasks), partitions))
    return spark.range(0, partitions, 1, tasks).selectExpr("cast(id as int) as pt")


def control_partitions(batches) -> list[int]:
    """The partitions a files-exchange task serves, in order, from its control rows (pt)."""
    parts = [int(p) for batch in batches for p in batch.column("pt").to_pylist()]
    if not parts or len(set(parts)) != len(parts):
        raise ExchangeError(f"a step task received control rows {parts[:5]}; expected distinct partitions")
    return parts


def control_partition(batches) -> int:
    """The partition a files-exchange task serves, from its one control row (pt)."""
    parts = control_partitions(batches)
    if len(parts) != 1:
        raise ExchangeError(f"a step task received control rows {parts[:5]}; expected exactly one partition")
    return parts[0]


def check_reports(reports, partitions: int | None = None) -> tuple[int, int]:
    """Every partition reported exactly once (and all of them, when `partitions` is given);
    returns (rows, bytes) summed over the reports."""
    parts = [int(r["pt"]) for r in reports]
    if len(parts) != len(set(parts)):
        raise ExchangeError(f"partitions {sorted(p for p in set(parts) if parts.count(p) > 1)} reported twice")
    if partitions is not None and sorted(parts) != list(range(partitions)):
        missing = sorted(set(range(partitions)) - set(parts))
        raise ExchangeError(f"partitions {missing[:10]} did not report their routed rows")
    return sum(int(r["rows"]) for r in reports), sum(int(r["bytes"]) for r in reports)


class ShuffleExchange:
    """Rows travel through Spark: each step's output is routed by key by the next step and
    materialised in between (engine.materialise: localCheckpoint in local mode, Parquet in the
    run directory on a cluster), so lineage stays one step long and each step is timed on its own."""

    name = "shuffle"

    def __init__(
        self,
        work_dir: str | None = None,
        partitions: int | None = None,
        tasks: int | None = None,
        materialise: str = "local",
    ):
        self.work_dir = work_dir
        self.materialiser = MATERIALISERS.lookup(materialise)()
        self.run: RunDir | None = None

    @property
    def durable(self) -> bool:
        """Whether committed steps survive executor loss and a rerun can resume from them."""
        return self.materialiser.durable and self.run is not None

    def start(self, key: str) -> None:
        if self.materialiser.durable:
            if self.work_dir is None:
                raise SparkGNNError("a reliable materialisation needs a work dir to keep each step in")
            self.run = RunDir(self.work_dir, key)

    def resume(self, spark, index: int):
        """The rows step `index` committed in an earlier run (None when this exchange keeps none)."""
        marker = self.run.marker(index) if self.durable and self.run is not None else None
        return None if marker is None else self.materialiser.read(spark, self.run, index, marker)

    def paths(self, index: int, last: bool) -> tuple[str | None, str | None]:
        return None, None

    def output_schema(self, index: int, last: bool, schema: str) -> str:
        return schema

    def scan_features(self, spark, files: list[str], keys, column: str = "x", keep_in: str | None = None):
        """None: Spark itself reads x and routes it to the owners (executor._initial_rows)."""
        return None

    def reuse_features(self, keep_in: str, keys) -> bool:
        """False: the shuffle path reads x through Spark every run (nothing to reuse)."""
        return False

    def materialise(self, spark, out, index: int):
        """(rows for the next step, bytes written to files: None)."""
        rows = self.materialiser.write(spark, out, self.run, index)
        if self.durable and self.run is not None and index > 0:
            self.run.drop_step(index - 1)
        return rows, None

    def close(self, keep: bool = False) -> bool:
        """Delete the run's kept steps unless `keep` (a failed job a rerun can resume); returns
        whether anything was kept."""
        return self.run.close(keep) if self.run is not None else False


class FileExchange:
    """Rows travel through Arrow files in the run directory (see the module)."""

    name = "files"
    durable = True  # the files are on a disk every executor shares

    def __init__(self, work_dir: str, partitions: int, tasks: int | None = None, materialise: str = "local"):
        self.work_dir = work_dir
        self.partitions = partitions
        self.tasks = tasks  # concurrent step tasks (control_rows); None: one task per partition
        self.scanned = False  # the first step reads the feature scan's files (scan_features)
        self.features: str | None = None  # where they are when kept beside the prepared layout
        self.run: RunDir | None = None

    def start(self, key: str) -> None:
        self.run = RunDir(self.work_dir, key)

    def _run(self) -> RunDir:
        if self.run is None:  # used without start(): a private run nothing resumes
            self.start(uuid.uuid4().hex)
        assert self.run is not None
        return self.run

    @property
    def run_dir(self) -> str:
        return self._run().path

    def step_dir(self, index: int) -> str:
        """Step i's output (the feature scan's is step -1)."""
        return self._run().step_dir(index)

    def _make_step(self, index: int) -> str:
        directory = self._run().make_step(index)
        fs, inner = filesystem(directory)
        for q in range(self.partitions):
            fs.create_dir(join(inner, f"to={q}"), recursive=True)
        return directory

    def resume(self, spark, index: int):
        """Read step `index`'s committed files in the next step (no DataFrame: the tasks read them)."""
        if self._run().marker(index) is None:
            return None
        self.scanned = True  # the next step reads files, not Spark's rows
        return RESUMED_FROM_FILES

    def scan_features(
        self, spark, files: list[str], keys, column: str = "x", keep_in: str | None = None
    ) -> tuple[int, int]:
        """Run the feature scan as its own Spark job over P control rows (reader i reads
        files[i::P], scan_vertex_files) instead of Spark reading x as array<float>, shuffling it
        to the owners and handing it to Python: the first step then reads files like every other.
        The readers run in the steps' `tasks` tasks (control_rows), a task serving its run of
        readers one after another: a Python task has a fixed cost, which P tasks on fewer cores
        pay P / cores times over for nothing. Returns (rows, bytes) written.
        `keep_in` (the prepared layout's folder of the graph and P the scan is for): the scanned
        files are then kept there for later jobs (keep_features), not deleted with the run."""
        directory = self._make_step(-1)
        task = functools.partial(
            _scan_task, directory, list(files), self.partitions, tuple(int(k) for k in keys), column
        )
        written = check_reports(self.control(spark).mapInArrow(task, FILES_SCHEMA_DDL).collect(), self.partitions)
        self.scanned = True
        if keep_in is not None and column == "x":
            self.features = keep_features(directory, keep_in, self.partitions, keys, written)
        return written

    def reuse_features(self, keep_in: str, keys) -> bool:
        """Whether an earlier job kept the scanned features of this graph, P and routing `keys` in
        `keep_in` (the prepared layout's folder; keep_features): the first step then reads them
        there, and no feature scan runs."""
        kept = kept_features(keep_in, self.partitions, keys)
        if kept is not None:
            self.features, self.scanned = kept, True
        return kept is not None

    def paths(self, index: int, last: bool) -> tuple[str | None, str | None]:
        """(directory the step reads from, directory it writes to): the first step reads Spark's
        rows (the feature scan), the last step writes the job's output. The driver creates the
        directories a step writes into; tasks never do, so a task Spark has not yet killed when a
        failed job closes the exchange cannot recreate what close() removed."""
        writes = None if last else self._make_step(index)
        if index == 0 and self.features is not None:
            return self.features, writes
        reads = self.step_dir(index - 1) if index > 0 or self.scanned else None
        return reads, writes

    def control(self, spark):
        """What a step that reads files runs over (control_rows: `tasks` tasks over P partitions)."""
        return control_rows(spark, self.partitions, self.tasks)

    def output_schema(self, index: int, last: bool, schema: str) -> str:
        return schema if last else FILES_SCHEMA_DDL

    def materialise(self, spark, out, index: int):
        rows, written = check_reports(out.collect(), self.partitions)
        run = self._run()
        run.commit(index, {"exchange": self.name, "partitions": self.partitions, "rows": rows, "bytes": written})
        run.drop_step(index - 1)
        return None, written

    def close(self, keep: bool = False) -> bool:
        return self._run().close(keep)


# What FileExchange.resume returns: the next step reads the committed files, not a DataFrame.
RESUMED_FROM_FILES = "files"


#: The feature scan's files kept beside a prepared layout (`<prep>/<fingerprint>/P=<n>/features/`),
#: and the record inside that folder saying what they are.
FEATURES_DIR = "features"
FEATURES_RECORD = "_FEATURES.json"


def kept_features(keep_in: str, partitions: int, keys) -> str | None:
    """The folder of the scanned features kept in `keep_in` for `partitions` partitions and the
    routing `keys` (engine.routing.partition_keys: Spark's hash of them, which a Spark upgrade
    could change), or None when none is kept there (or one of another routed-rows format:
    run_dir.FORMAT)."""
    from sparkgnn import files as fsys
    from sparkgnn.engine.run_dir import FORMAT

    directory = join(keep_in, FEATURES_DIR)
    try:
        record = fsys.read_json(join(directory, FEATURES_RECORD))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("partitions") != partitions:
        return None
    if record.get("keys") != [int(k) for k in keys]:
        return None
    return directory


def keep_features(scanned: str, keep_in: str, partitions: int, keys, written: tuple[int, int]) -> str:
    """Keep the feature scan's files (folder `scanned`, a run's step -1) in `keep_in`, the prepared
    layout's folder of the graph and P they were scanned for, so that later jobs on the same graph
    and P read them instead of scanning again (reuse_features). WHY there: the layout's folder is
    keyed by the graph's fingerprint (its content) and P, and the routed rows depend on nothing
    else (ownership and routing keys are functions of P). The record is written inside the folder
    first and the folder renamed into place, so a kept folder is complete or absent; where the
    rename fails (another job kept them first, another filesystem) the run reads its own copy. A
    kept folder of another routed-rows format (kept_features: None) is replaced.
    Returns the folder the first step reads."""
    from sparkgnn import files as fsys
    from sparkgnn.engine.run_dir import FORMAT

    rows, num_bytes = written
    keys = [int(k) for k in keys]
    record = {"format": FORMAT, "partitions": partitions, "keys": keys, "rows": rows, "bytes": num_bytes}
    fsys.write_json_atomic(join(scanned, FEATURES_RECORD), record)
    target = join(keep_in, FEATURES_DIR)
    fs, inner = filesystem(scanned)
    if fsys.exists(target) and kept_features(keep_in, partitions, keys) is None:
        fsys.delete(target)  # an older format's files: nothing reads them
    try:
        fs.move(inner, filesystem(target)[1])
    except OSError:
        return scanned
    return target


def _scan_task(step_dir, files, partitions, keys, column, batches):
    from sparkgnn.heap import release_retained_memory

    keys = np.asarray(keys, dtype=np.int64)
    for reader in control_partitions(batches):
        yield from scan_vertex_files(step_dir, files, partitions, keys, reader, column)
        # the scan's buffers (decoded Parquet batches, packed rows) are not what the layer steps
        # reuse: a worker that kept them (2 GiB each at 100M edges) would hold them idle while
        # fewer tasks than cores run the steps, or the next reader of this task runs
        release_retained_memory(0)


EXCHANGES = {"shuffle": ShuffleExchange, "files": FileExchange}


def executors_share_this_disk(spark) -> bool:
    """Every executor runs on this machine: a local or local-cluster master whose driver is here
    (a Spark Connect server elsewhere runs its local executors on its own machine)."""
    master = spark.conf.get("spark.master", "") or ""
    return (is_local_master(spark) or master.startswith("local-cluster[")) and driver_is_here(spark)


def files_reach_every_task(spark, work_dir: str) -> bool:
    """Every executor shares this machine's disk, where the work dir is."""
    return executors_share_this_disk(spark) and is_local(work_dir)


# Headroom asked of the work dir's disk over the two steps' files that exist at once (the step
# being read and the one being written).
DISK_MARGIN = 1.25


def fits_on_disk(work_dir: str, step_bytes: float) -> tuple[bool, int]:
    """Whether two steps of `step_bytes` routed rows fit on the work dir's local disk (and its free
    bytes): files the disk cannot hold would fail a long job midway."""
    import shutil

    probe = filesystem(work_dir)[1]
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    return 2 * step_bytes * DISK_MARGIN <= free, free


def exchange_kind(spark, requested: str, work_dir: str) -> str:
    """The exchange a run asked for, with "auto" resolved: files where every executor shares the
    work dir's disk, the shuffle elsewhere."""
    if requested == "auto":
        return "files" if files_reach_every_task(spark, work_dir) else "shuffle"
    if requested not in EXCHANGES:
        raise SparkGNNError(f"unknown exchange {requested!r}; known: auto, {', '.join(EXCHANGES)}")
    return requested
