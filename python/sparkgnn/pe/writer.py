"""PEWriter: commits one layer of PEs at a time, so a crashed precompute resumes where it died.

Commit protocol for layer l (and for each metrics table), the same on a local disk, HDFS and an
object store (no rename anywhere; layout.py says why):
  1. the writer holds the store's lease (`_writer.json`: its unique id, host, pid), taken when it
     was created, and checks before every write and every commit that it still holds it and that
     the manifest is the one it last read or wrote (`commit` token);
  2. the layer's rows are written to a fresh `layer=<l>/attempt=<uuid>/` (Spark through its Hadoop
     filesystem, or pyarrow for in-memory arrays); a crash here leaves an attempt nobody reads;
  3. the attempt's files are listed and checksummed (integrity.py); an attempt written from
     memory also gets its row file (`_rows.arrow`, rowfile.py), recorded under "row_files";
  4. manifest.json is rewritten whole with l in `layers_complete`, the attempt under `paths` and its
     files under `files` -- THIS is the commit point (one put on an object store, temp + rename on
     a disk). A crash before it leaves the previous manifest, which never names the attempt;
  5. the layer's other attempts (failed, concurrent or superseded ones) and legacy `layer=<l>.tmp-*`
     dirs are deleted.
Readers (PEStore) only look at layers listed in the manifest, read only the files recorded for them,
and check those files against the record first. A resumed run checks the same way and recomputes a
damaged layer (and every layer after it) instead of trusting the manifest. A refresh may commit a
layer as a DELTA (commit_layer_delta): the attempt holds only changed rows and tombstones, and the
manifest's `bases` entry names the earlier versions' attempts it lies on (versions.py).

Two writers: the one created last takes the lease over (with a log line naming the previous
holder: a crashed run never gives it back) and the other stops with PEStoreConflict before its next
write or commit. A writer also stops if the manifest changed since it last read or wrote it (a
writer that never saw the lease). Both checks are a read before a write, not an atomic
compare-and-swap (pyarrow.fs has no conditional put), so two writers committing in the same
instant can still race; what they cannot do is mix their files: each commit names only its own
attempt's files.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sparkgnn import files
from sparkgnn.errors import PEStoreConflict
from sparkgnn.parquet_read import read_parquet
from sparkgnn.pe import integrity, layout, parts, rowfile, versions
from sparkgnn.pe.identity import graph_fingerprint, graph_sizes, model_identity

log = logging.getLogger(__name__)

COMMIT_KEY = "commit"


@dataclass(frozen=True)
class Written:
    """What an attempt's writer wrote: its rows and the CRC-32 of the files whose bytes it
    checksummed as it wrote them (integrity.record reads the others back)."""

    rows: int
    crc32: dict[str, str]


UNIQUE_COLUMNS = ("id",)  # a layer's or metrics table's column whose values never repeat (no dictionary)


def layer_key(l: int) -> str:
    """Key of a layer directory in manifest["files"] (its name under the store directory)."""
    return layout.layer_key(l)


def metrics_key(name: str) -> str:
    return layout.metrics_key(name)


def _token(manifest: dict | None):
    return (manifest or {}).get(COMMIT_KEY)


def _holder(lease: dict | None) -> str:
    if not lease:
        return "no writer: the lease was removed"
    return (
        f"writer {str(lease.get('writer'))[:12]} on {lease.get('host')}, pid {lease.get('pid')}, "
        f"since {lease.get('since')}"
    )


class PEWriter:
    """Writes one store version under `store_root` for (`graph`, `model`) by the protocol above.
    `one_commit`: the version is committed by `finish` alone -- layers and metrics go into the
    in-memory manifest and step 5 waits for it -- so a writer that commits a small version in
    one go (the refresh follower, pe/follow.py) writes the manifest once instead of once per
    layer; a crash before `finish` leaves the previous manifest and nothing of this version."""

    def __init__(self, store_root, graph, model, with_states: bool, force: bool = False, *, one_commit: bool = False):
        self.one_commit = bool(one_commit)
        self._unclean: list[str] = []  # keys whose step 5 waits for finish (one_commit)
        self._staged: dict[str, str] = {}  # key -> attempt (relative) that tasks write into (stage_layer)
        self.model = model_identity(model)
        self.graph_fingerprint = graph_fingerprint(graph)
        self.with_states = bool(with_states)
        self.base = layout.store_dir(store_root, self.graph_fingerprint, self.model.fingerprint)
        self._graph = graph
        self.writer_id = uuid.uuid4().hex
        old = layout.read_manifest(self.base)
        self._seen = _token(old)
        self._take_lease()
        if old is not None and not force and self._reusable(old):
            self.manifest = old
            self._unvouch_damaged()
        else:
            self.manifest = self._fresh_manifest(old)
            self._save()

    # -- the lease -----------------------------------------------------------------------------
    def _lease_path(self) -> str:
        return files.join(self.base, layout.LEASE_FILE)

    def _read_lease(self) -> dict | None:
        try:
            lease = files.read_json(self._lease_path())
        except (FileNotFoundError, ValueError):
            return None
        return lease if isinstance(lease, dict) else None

    def _take_lease(self) -> None:
        held = self._read_lease()
        if held and held.get("writer") != self.writer_id and not held.get("released"):
            log.warning(
                f"sparkgnn precompute: {self.base} was held by {_holder(held)}, which did not finish "
                "(crashed, or still running: it stops before its next commit); this writer takes it over"
            )
        self._lease = {
            "writer": self.writer_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": layout.now(),
        }
        files.write_json_atomic(self._lease_path(), self._lease)

    def _check_owner(self, what: str) -> None:
        """Refuse to go on (PEStoreConflict) unless this writer still holds the lease and the
        manifest is the one it last read or wrote (protocol step 1)."""
        held = self._read_lease()
        if (held or {}).get("writer") != self.writer_id:
            raise PEStoreConflict(
                f"PE store {self.base}: another writer took it over after this one started "
                f"({_holder(held)}); this writer stops before {what}, nothing of it committed. "
                "Let the other writer finish; a rerun then resumes from the committed layers"
            )
        token = _token(layout.read_manifest(self.base))
        if token != self._seen:
            raise PEStoreConflict(
                f"PE store {self.base}: its manifest was committed by someone else (commit {token}, "
                f"this writer last saw {self._seen}); this writer stops before {what}, nothing of it "
                "committed. A rerun resumes from the committed layers"
            )

    def _unvouch_damaged(self) -> None:
        """Resume only from layers whose files still match their commit record: a damaged layer
        (deleted, truncated, edited) is dropped from the manifest, with a line naming it, so the
        run recomputes it (and, being contiguous, every later layer) instead of trusting it."""
        recorded = self.manifest.get(integrity.FILES_KEY) or {}
        columns = ("id", "h", "state") if self.manifest.get("with_states") else ("id", "h")
        dropped = []
        for l in self.completed_layers():
            folder = layout.committed_dir(self.base, self.manifest, layer_key(l))
            found = integrity.problems(folder, recorded.get(layer_key(l)), columns=columns)
            found += versions.base_problems(self.base, self.manifest, layer_key(l), columns=columns)
            if found:
                self.manifest["layers_complete"].remove(l)
                dropped.append(l)
                log.warning(
                    f"sparkgnn precompute: layer {l} of {self.base} is damaged ({'; '.join(found)}); recomputing it"
                )
        for name in list(self.manifest.get("metric_tables") or []):
            found = integrity.problems(
                layout.committed_dir(self.base, self.manifest, metrics_key(name)), recorded.get(metrics_key(name))
            )
            if found:
                log.warning(
                    f"sparkgnn precompute: metrics table {name} is damaged ({'; '.join(found)}); "
                    "recomputing the metrics"
                )
                self.manifest["metric_tables"], self.manifest["metrics"] = [], None
                dropped.append(name)
                break
        if dropped:
            self._save()

    # -- manifest ------------------------------------------------------------------------------
    def _reusable(self, old: dict) -> bool:
        """Committed layers of an earlier run count only if they were written for exactly what
        this run would write (same widths; states present if this run wants states)."""
        return (
            old.get("format") == layout.FORMAT
            and old.get("num_layers") == self.model.num_layers
            and list(old.get("dims") or []) == list(self.model.dims)
            and (bool(old.get("with_states")) or not self.with_states)
        )

    def _fresh_manifest(self, old: dict | None) -> dict:
        k = self.model.num_layers
        return {
            "format": layout.FORMAT,
            "graph_fingerprint": self.graph_fingerprint,
            "model_fingerprint": self.model.fingerprint,
            "model_spec_sha256": self.model.spec_sha,
            "num_layers": k,
            "dims": list(self.model.dims),
            "state_dims": [None] * k if self.with_states else None,
            "dtype": "float32",
            "layers_complete": [],
            "rows": {},
            "created": (old or {}).get("created") or layout.now(),
            "updated": layout.now(),
            "with_states": self.with_states,
            "metrics": None,
            "metric_tables": [],
            "graph": graph_sizes(self._graph),
            "sizes": None,
            integrity.FILES_KEY: {},
            layout.PATHS_KEY: {},
        }

    def _save(self, what: str = "writing the manifest", *, final: bool = False) -> None:
        """Commit point: the whole manifest in one atomic write, after the ownership check (with
        `one_commit`, only the `final` one, from finish)."""
        if self.one_commit and not final:
            return
        self._check_owner(what)
        self.manifest["updated"] = layout.now()
        self.manifest[COMMIT_KEY] = uuid.uuid4().hex
        self.manifest["writer"] = self.writer_id
        layout.write_manifest(self.base, self.manifest)
        self._seen = self.manifest[COMMIT_KEY]

    def completed_layers(self) -> list[int]:
        """Layers the manifest vouches for, ascending (with force=True: none, the old entry was
        dropped when the writer was created)."""
        return sorted(int(l) for l in self.manifest["layers_complete"])

    def next_layer(self) -> int:
        """First layer a resumed run has to compute (k + 1 when all are done)."""
        done, l = set(self.completed_layers()), 1
        while l in done:
            l += 1
        return l

    # -- commits -------------------------------------------------------------------------------
    def _write_attempt(self, key: str, write, row_values: dict | None = None) -> int:
        """Steps 2-3 of the protocol: `write(folder) -> rows` (or Written: rows and the CRC-32s it
        took as it wrote, not read back) into a fresh attempt of `key`, whose
        folder and file record go into the manifest (committed by the caller's _save).
        `row_values`: rowfile.write's keywords (ids, columns[, alive]) for the attempt's row file
        (rowfile.py), written beside the Parquet files and recorded under "row_files"; None: the
        attempt has none (its readers read it whole)."""
        self._check_owner(f"writing {key}")
        rel = self._staged.pop(key, None) or layout.new_attempt(key)
        folder = files.join(self.base, rel)
        wrote = write(folder)
        rows, known = (wrote.rows, wrote.crc32) if isinstance(wrote, Written) else (wrote, None)
        recorded = integrity.record(folder, known)
        row_files = self.manifest.setdefault(rowfile.ROW_FILES_KEY, {})
        row_files.pop(key, None)
        if row_values is not None:
            row_files[key] = rowfile.write(
                folder, **row_values, key=key, version=self.graph_fingerprint, parquet=recorded
            )
        self.manifest.setdefault(layout.PATHS_KEY, {})[key] = rel
        self.manifest.setdefault(integrity.FILES_KEY, {})[key] = recorded
        return int(rows)

    def _legacy(self, key: str) -> bool:
        """Whether `key`'s committed files lie in its folder itself (a store written before
        attempts): an attempt written there would count as an added file until committed."""
        return key not in (self.manifest.get(layout.PATHS_KEY) or {})

    def _clean(self, key: str) -> None:
        """Step 5: everything in `key`'s folder but its committed attempt (failed, concurrent and
        superseded attempts; the files of a store written before attempts), and legacy tmp dirs."""
        folder = files.join(self.base, key)
        committed = (self.manifest.get(layout.PATHS_KEY) or {}).get(key, "").rpartition("/")[2]
        for name in files.entries(folder):
            if name != committed:
                files.delete(files.join(folder, name))
        for stale in layout.stale_tmp_dirs(folder):
            files.delete(stale)

    @staticmethod
    def _commit_dir_write(df, folder: str, columns: list[str], rows: int | None = None) -> int:
        """Spark writes `df` into `folder`; its row count read back, unless the caller knows it
        (`rows`: a delta's count is the merged layer's, not the attempt's; one Spark job less)."""
        df.selectExpr(*columns).write.mode("overwrite").parquet(layout.spark_uri(folder))
        if rows is not None:
            return int(rows)
        return int(read_parquet(df.sparkSession, layout.spark_uri(folder)).count())

    def _check_commit(self, l: int, width: int, state_width: int | None, has_state: bool) -> int:
        k = self.model.num_layers
        if not 1 <= int(l) <= k:
            raise ValueError(f"layer {l} out of range 1..{k}")
        l = int(l)
        if int(width) != self.model.dims[l - 1]:
            raise ValueError(f"layer {l}: h width {width} != model's {self.model.dims[l - 1]}")
        if self.with_states and (state_width is None or not has_state):
            raise ValueError(f"layer {l}: the store keeps states; pass a 'state' column and state_width")
        return l

    def _record(
        self, l: int, write, state_width: int | None, bases: list | None = None, rows=None, row_values=None
    ) -> None:
        """Write layer l into a fresh attempt and commit it (a recommitted layer switches to the
        new attempt in the same manifest write, so readers see the old rows or the new ones).
        `bases`: the segments a delta attempt lies on (versions.py; None: the attempt is the
        whole layer); `rows`: the layer's row count when the attempt is a delta; `row_values`:
        the attempt's rows for its row file (_write_attempt)."""
        if l in self.manifest["layers_complete"] and self._legacy(layer_key(l)):
            self.manifest["layers_complete"].remove(l)  # its folder is about to hold an attempt too
            self._save(f"recommitting layer {l}")
        written = self._write_attempt(layer_key(l), write, row_values)
        if self.with_states:
            assert state_width is not None, "_check_commit refuses a store with states but no state width"
            self.manifest["state_dims"][l - 1] = int(state_width)
        chains = self.manifest.setdefault(versions.BASES_KEY, {})
        chains.pop(layer_key(l), None)
        if bases:
            chains[layer_key(l)] = bases
        self.manifest["rows"][str(l)] = written if rows is None else int(rows)
        self.manifest["layers_complete"] = sorted(set(self.manifest["layers_complete"]) | {l})
        self._save(f"committing layer {l}")
        self._clean_after_commit(layer_key(l))

    def _clean_after_commit(self, key: str) -> None:
        """Step 5 for `key`: now, or after finish's manifest write with one_commit (the manifest
        on disk still names the attempt this would delete)."""
        if self.one_commit:
            self._unclean.append(key)
        else:
            self._clean(key)

    def commit_layer_arrays(self, l: int, ids, h, state=None) -> None:
        """Same commit as `commit_layer`, from in-memory arrays (ids int64 [n], h float32 [n, w],
        state float32 [n, s]) written with pyarrow: the single-machine precompute's path
        (sparkgnn.pe.local), no Spark needed. Vectors are fixed_size_list<float32>."""
        import numpy as np
        import pyarrow as pa

        ids = np.ascontiguousarray(ids, dtype=np.int64)
        h = np.ascontiguousarray(h, dtype=np.float32)
        if h.ndim != 2 or h.shape[0] != len(ids):
            raise ValueError(f"layer {l}: h has shape {h.shape}, expected [{len(ids)}, width]")
        state_width = None
        cols = {"id": pa.array(ids), "h": pa.FixedSizeListArray.from_arrays(pa.array(h.reshape(-1)), h.shape[1])}
        if self.with_states and state is not None:
            state = np.ascontiguousarray(state, dtype=np.float32)
            if state.shape[0] != len(ids):
                raise ValueError(f"layer {l}: state has {state.shape[0]} rows, expected {len(ids)}")
            state_width = int(state.shape[1])
            cols["state"] = pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), state_width)
        l = self._check_commit(l, h.shape[1], state_width, state is not None)
        table = pa.table(cols)
        values = {"h": h} if state_width is None else {"h": h, "state": state}
        row_values = {"ids": ids, "columns": values}
        self._record(l, functools.partial(self._arrow_write, table), state_width, row_values=row_values)

    def _check_base(self, l: int, over) -> str:
        """The layer key of a delta over `over`'s layer l, refused unless `over` can be its base."""
        if versions.version_dir(self.base, over.manifest["graph_fingerprint"]) != over.base:
            raise ValueError(f"layer {l}: a delta lies on a version under the same root, not {over.base}")
        if bool(over.manifest.get("with_states")) != self.with_states:
            raise ValueError(f"layer {l}: a delta needs a base with the same states setting as {self.base}")
        return layer_key(l)

    def commit_layer_delta_frame(self, l: int, over, df, width: int, state_width: int | None, rows: int) -> None:
        """Spark's commit_layer_delta: `df` (id, h[, state]) holds the changed or inserted rows
        and a tombstone (null h and state) per deleted vertex; written by Spark's tasks."""
        key = self._check_base(l, over)
        l = self._check_commit(l, width, state_width, "state" in df.columns)
        columns = ["CAST(id AS BIGINT) AS id", "CAST(h AS ARRAY<FLOAT>) AS h"]
        if self.with_states:
            columns.append("CAST(state AS ARRAY<FLOAT>) AS state")
        write = functools.partial(self._commit_dir_write, df, columns=columns, rows=rows)
        self._record(l, write, state_width, bases=versions.chain_over(over.manifest, key), rows=rows)

    def commit_layer_delta(
        self, l: int, over, ids, h, state, deleted_ids, rows: int, *, bases: list | None = None
    ) -> None:
        """Commit layer l as a DELTA over the same layer of the committed store `over` (a PEStore
        of an earlier version of this model under the same root; versions.py): only the rows of
        `ids` (changed or inserted vertices) and a tombstone for each of `deleted_ids` are
        written. `rows`: the layer's row count once merged. `bases`: `over`'s chain rebased on a
        compacted segment (versions.rebased), instead of `over`'s chain itself."""
        import numpy as np
        import pyarrow as pa

        key = self._check_base(l, over)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        h = np.ascontiguousarray(h, dtype=np.float32)
        deleted = np.ascontiguousarray(deleted_ids, dtype=np.int64)
        state_width = None

        def vectors(values: np.ndarray) -> pa.Array:
            live = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
            return pa.concat_arrays([live, pa.nulls(len(deleted), live.type)])

        cols = {"id": pa.array(np.concatenate([ids, deleted])), "h": vectors(h)}
        if self.with_states:
            state = np.ascontiguousarray(state, dtype=np.float32)
            state_width = int(state.shape[1])
            cols["state"] = vectors(state)
        l = self._check_commit(l, h.shape[1], state_width, state is not None)
        write = functools.partial(self._arrow_write, pa.table(cols))

        def padded(values: np.ndarray) -> np.ndarray:  # tombstones' rows: zeros, alive = 0
            return np.concatenate([values, np.zeros((len(deleted), values.shape[1]), np.float32)])

        values = {"h": padded(h)} if state_width is None else {"h": padded(h), "state": padded(state)}
        row_values = {
            "ids": np.concatenate([ids, deleted]),
            "columns": values,
            "alive": np.arange(len(ids) + len(deleted)) < len(ids),
        }
        if bases is None:
            bases = versions.chain_over(over.manifest, key)
        self._record(l, write, state_width, bases=bases, rows=rows, row_values=row_values)

    def commit_layer(self, l: int, df, width: int, state_width: int | None = None, *, rows: int | None = None) -> None:
        """Write h^(l) (and the merged partial states of conv l) for every node and commit it.
        `df` has columns id (long), h (array<float>) and, when the writer has states, state.
        `rows`: the layer's row count where the caller knows it (a refresh: the updated graph's
        vertices), so the written folder is not counted back (a Spark job); None: counted."""
        l = self._check_commit(l, width, state_width, "state" in df.columns)
        columns = ["CAST(id AS BIGINT) AS id", "CAST(h AS ARRAY<FLOAT>) AS h"]
        if self.with_states:
            columns.append("CAST(state AS ARRAY<FLOAT>) AS state")
        self._record(l, lambda folder: self._commit_dir_write(df, folder, columns, rows), state_width)

    def stage_layer(self, l: int) -> str:
        """Protocol step 2 for tasks that write layer l themselves: a fresh, empty attempt folder
        (absolute) for them to write their Parquet parts into (one `part-<p>.parquet` per
        partition, columns id, h[, state]); `commit_staged_layer` then records and commits it. A
        crash in between leaves an attempt nobody reads, as for any other attempt."""
        k = self.model.num_layers
        if not 1 <= int(l) <= k:
            raise ValueError(f"layer {l} out of range 1..{k}")
        self._check_owner(f"staging layer {l}")
        rel = layout.new_attempt(layer_key(int(l)))
        folder = files.join(self.base, rel)
        files.makedirs(folder)
        self._staged[layer_key(int(l))] = rel
        return folder

    def commit_staged_layer(self, l: int, width: int, state_width: int | None = None) -> None:
        """Commit layer l from the files tasks wrote into its `stage_layer` folder (steps 3-5 of the
        protocol, the same record and manifest as `commit_layer`). Refused when the folder's rows
        are not one per vertex of the graph (a partition's file missing) or lack the store's columns."""
        rows = self._staged_rows(l)
        expected = (self.manifest.get("graph") or {}).get("num_vertices")
        if expected is not None and rows != int(expected):
            raise ValueError(f"layer {l}: the tasks wrote {rows} rows, the graph has {expected} vertices")
        l = self._check_commit(l, width, state_width, self.with_states)
        self._record(l, lambda _folder: rows, state_width)

    def _staged_rows(self, l: int) -> int:
        """Rows of the Parquet files tasks wrote into layer l's stage_layer folder, each checked
        for the store's columns (one empty file written where they wrote none, so it reads back)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rel = self._staged.get(layer_key(int(l)))
        if rel is None:
            raise ValueError(f"layer {l} was not staged (stage_layer) by this writer")
        folder = files.join(self.base, rel)
        written = [f.rel for f in files.data_files(folder)]
        fields = [("id", pa.int64()), ("h", pa.list_(pa.float32()))]
        if self.with_states:
            fields.append(("state", pa.list_(pa.float32())))
        if not written:  # a graph without vertices: one empty file, so the layer reads back
            self._arrow_write(pa.schema(fields).empty_table(), folder)
            written = [f.rel for f in files.data_files(folder)]
        rows, names = 0, [name for name, _ in fields]
        for part in written:
            fs, inner = files.filesystem(files.join(folder, part))
            with fs.open_input_file(inner) as source:
                meta = pq.ParquetFile(source).metadata
            rows += meta.num_rows
            lacking = [name for name in names if name not in meta.schema.to_arrow_schema().names]
            if lacking:
                raise ValueError(f"layer {l}: {part} lacks column(s) {', '.join(lacking)}")
        return rows

    def commit_staged_delta(self, l: int, over, width: int, state_width: int | None, rows: int) -> None:
        """commit_layer_delta from the files tasks wrote into layer l's `stage_layer` folder (id,
        h[, state]: the changed or inserted rows and a tombstone, null h and state, per deleted
        vertex): no Spark job and no copy of the rows. `rows`: the layer's row count once merged."""
        key = self._check_base(l, over)
        self._staged_rows(l)
        l = self._check_commit(l, width, state_width, self.with_states)
        self._record(l, lambda _folder: rows, state_width, bases=versions.chain_over(over.manifest, key), rows=rows)

    def has_metrics(self) -> bool:
        """Whether workload metrics were committed (a resumed run need not recompute them)."""
        return bool(self.manifest.get("metrics") or self.manifest.get("metric_tables"))

    def layer_frame(self, spark, l: int):
        """A committed layer as a DataFrame (id, h[, state]): the input a resumed run continues
        from."""
        if int(l) not in self.completed_layers():
            raise ValueError(f"layer {l} is not committed (committed: {self.completed_layers()})")
        return versions.spark_frame(spark, self.base, self.manifest, layer_key(l))

    @staticmethod
    def _arrow_write(table, folder: str) -> Written:
        """An in-memory Arrow table as the Parquet files of `folder` (the no-Spark commit path:
        row ranges written on several threads, pe/parts.py), vector columns plain
        (arrowvec.parquet_options)."""
        from sparkgnn.arrowvec import parquet_options

        crc = parts.write_parts(table, folder, parquet_options(table.schema, unique=UNIQUE_COLUMNS))
        return Written(int(table.num_rows), crc)

    def commit_metrics(self, metrics: dict) -> None:
        """name -> DataFrame or pyarrow.Table (written to metrics/<name>/ with the same protocol)
        or a JSON-able value (kept in the manifest's "metrics"), e.g. {**frames, "summary": summary}
        from sparkgnn.pe.metrics.compute_metrics, or from sparkgnn.pe.local.local_metrics (the
        single-machine precompute's numpy metrics: Arrow tables, no Spark)."""
        import pyarrow as pa

        values, tables, written = {}, set(self.manifest.get("metric_tables") or []), []
        for name, value in metrics.items():
            is_arrow = isinstance(value, pa.Table)
            if is_arrow or (hasattr(value, "write") and hasattr(value, "columns")):
                if name in tables and self._legacy(metrics_key(name)):
                    tables.discard(name)  # as for layers: un-vouch a pre-attempt table first
                    self.manifest["metric_tables"] = sorted(tables)
                    self._save(f"recommitting metrics table {name}")
                write: Callable[[str], int | Written]
                if is_arrow:
                    write = functools.partial(self._arrow_write, value)
                else:
                    columns = [f"`{c}`" for c in value.columns]
                    write = functools.partial(self._commit_dir_write, value, columns=columns)
                self._write_attempt(metrics_key(name), write)
                tables.add(name)
                written.append(name)
            else:
                values[name] = value
        self.manifest["metric_tables"] = sorted(tables)
        self.manifest["metrics"] = {**(self.manifest.get("metrics") or {}), **values} or None
        self._save("committing the metrics")
        for name in written:
            self._clean_after_commit(metrics_key(name))

    def finish(self, sizes: dict | None = None) -> dict:
        """Record sizes (caller's timings/bytes merged with the store's own per-layer bytes) and
        return the manifest."""
        from sparkgnn.pe.sizes import size_report

        self.manifest["sizes"] = {**size_report(self.base, self.manifest), **(sizes or {})}
        self._save("recording sizes", final=True)
        for key in self._unclean:
            self._clean(key)
        self._unclean.clear()
        files.write_json_atomic(self._lease_path(), {**self._lease, "released": layout.now()})
        return dict(self.manifest)
