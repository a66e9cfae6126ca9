"""PEWriter: commits one layer of PEs at a time, so a crashed precompute resumes where it died.

Commit protocol for layer l (and for each metrics table), WHY in this order:
  1. remove stale `layer=<l>.tmp-*` dirs left by a crashed attempt;
  2. Spark writes the DataFrame to a fresh `layer=<l>.tmp-<uuid>/` (a crash here leaves only a
     tmp dir, which step 1 of the next run deletes);
  3. the tmp dir is renamed to `layer=<l>/` (atomic on a local FS; an orphaned `layer=<l>/` that
     the manifest does not list is deleted first);
  4. manifest.json is rewritten atomically with l added to `layers_complete` and the layer's files
     (size, CRC-32; integrity.py) under `files` -- THIS is the commit point. A crash between 3 and
     4 leaves a directory the manifest does not vouch for; it is recomputed, never trusted.
Readers (PEStore) only look at layers listed in the manifest, and only after checking their files
against the record. A resumed run checks the same way and recomputes a damaged layer (and every
layer after it) instead of trusting the manifest. On HDFS the same protocol needs
FileSystem.rename; see layout.py.
"""

from __future__ import annotations

import os
import shutil

from sparkgnn.pe import integrity, layout
from sparkgnn.pe.identity import graph_fingerprint, graph_sizes, model_identity


def layer_key(l: int) -> str:
    """Key of a layer directory in manifest["files"] (its name under the store directory)."""
    return f"layer={int(l)}"


def metrics_key(name: str) -> str:
    return f"{layout.METRICS_DIR}/{name}"


class PEWriter:
    def __init__(self, store_root, graph, model, with_states: bool, force: bool = False, log=None):
        self.model = model_identity(model)
        self.graph_fingerprint = graph_fingerprint(graph)
        self.with_states = bool(with_states)
        self.base = layout.store_dir(store_root, self.graph_fingerprint, self.model.fingerprint)
        self._graph = graph
        self._log = log or (lambda _line: None)
        old = layout.read_manifest(self.base)
        if old is not None and not force and self._reusable(old):
            self.manifest = old
            self._unvouch_damaged()
        else:
            self.manifest = self._fresh_manifest(old)
            layout.write_manifest(self.base, self.manifest)

    def _unvouch_damaged(self) -> None:
        """Resume only from layers whose files still match their commit record: a damaged layer
        (deleted, truncated, edited) is dropped from the manifest, with a line naming it, so the
        run recomputes it (and, being contiguous, every later layer) instead of trusting it."""
        recorded = self.manifest.get(integrity.FILES_KEY) or {}
        columns = ("id", "h", "state") if self.manifest.get("with_states") else ("id", "h")
        dropped = []
        for l in self.completed_layers():
            found = integrity.problems(layout.layer_dir(self.base, l), recorded.get(layer_key(l)), columns=columns)
            if found:
                self.manifest["layers_complete"].remove(l)
                dropped.append(l)
                self._log(
                    f"sparkgnn precompute: layer {l} of {self.base} is damaged ({'; '.join(found)}); recomputing it"
                )
        for name in list(self.manifest.get("metric_tables") or []):
            found = integrity.problems(
                os.path.join(self.base, layout.METRICS_DIR, name), recorded.get(metrics_key(name))
            )
            if found:
                self._log(
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
        }

    def _save(self) -> None:
        self.manifest["updated"] = layout.now()
        layout.write_manifest(self.base, self.manifest)

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
    def _commit_dir(self, df, final: str, columns: list[str]) -> int:
        return self._commit_with(final, lambda tmp: self._commit_dir_write(df, tmp, columns))

    def _record_files(self, key: str, directory: str) -> None:
        """Put the committed directory's file record into the manifest (saved by the caller's
        commit, so record and commit land together)."""
        self.manifest.setdefault(integrity.FILES_KEY, {})[key] = integrity.record(directory)

    @staticmethod
    def _commit_dir_write(df, tmp: str, columns: list[str]) -> int:
        df.selectExpr(*columns).write.mode("overwrite").parquet(layout.spark_uri(tmp))
        return int(df.sparkSession.read.parquet(layout.spark_uri(tmp)).count())

    @staticmethod
    def _commit_with(final: str, write) -> int:
        """Steps 1-3 of the protocol (module doc) around `write(tmp_dir) -> rows`."""
        for stale in layout.stale_tmp_dirs(final):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = layout.tmp_dir(final)
        rows = write(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        return int(rows)

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

    def _record(self, l: int, write, state_width: int | None) -> None:
        if l in self.manifest["layers_complete"]:  # recommit: un-vouch first
            self.manifest["layers_complete"].remove(l)
            self._save()
        rows = self._commit_with(layout.layer_dir(self.base, l), write)
        self._record_files(layer_key(l), layout.layer_dir(self.base, l))
        if self.with_states:
            assert state_width is not None, "_check_commit refuses a store with states but no state width"
            self.manifest["state_dims"][l - 1] = int(state_width)
        self.manifest["rows"][str(l)] = rows
        self.manifest["layers_complete"] = sorted(set(self.manifest["layers_complete"]) | {l})
        self._save()

    def commit_layer_arrays(self, l: int, ids, h, state=None) -> None:
        """Same commit as `commit_layer`, from in-memory arrays (ids int64 [n], h float32 [n, w],
        state float32 [n, s]) written with pyarrow: the single-machine precompute's path
        (sparkgnn.pe.local), no Spark needed. Vectors are fixed_size_list<float32>."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

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

        def write(tmp: str) -> int:
            os.makedirs(tmp)
            pq.write_table(table, os.path.join(tmp, "part-00000.parquet"))
            return table.num_rows

        self._record(l, write, state_width)

    def commit_layer(self, l: int, df, width: int, state_width: int | None = None) -> None:
        """Write h^(l) (and the merged partial states of conv l) for every node and commit it.
        `df` has columns id (long), h (array<float>) and, when the writer has states, state."""
        l = self._check_commit(l, width, state_width, "state" in df.columns)
        columns = ["CAST(id AS BIGINT) AS id", "CAST(h AS ARRAY<FLOAT>) AS h"]
        if self.with_states:
            columns.append("CAST(state AS ARRAY<FLOAT>) AS state")
        self._record(l, lambda tmp: self._commit_dir_write(df, tmp, columns), state_width)

    def has_metrics(self) -> bool:
        """Whether workload metrics were committed (a resumed run need not recompute them)."""
        return bool(self.manifest.get("metrics") or self.manifest.get("metric_tables"))

    def layer_frame(self, spark, l: int):
        """A committed layer as a DataFrame (id, h[, state]): the input a resumed run continues
        from."""
        if int(l) not in self.completed_layers():
            raise ValueError(f"layer {l} is not committed (committed: {self.completed_layers()})")
        return spark.read.parquet(layout.spark_uri(layout.layer_dir(self.base, int(l))))

    def commit_metrics(self, metrics: dict) -> None:
        """name -> DataFrame (written to metrics/<name>/ with the same protocol) or a JSON-able
        value (kept in the manifest's "metrics"), e.g. {**frames, "summary": summary} from
        sparkgnn.pe.metrics.compute_metrics."""
        values, tables = {}, set(self.manifest.get("metric_tables") or [])
        for name, value in metrics.items():
            if hasattr(value, "write") and hasattr(value, "columns"):
                tables.discard(name)
                self.manifest["metric_tables"] = sorted(tables)
                self._save()
                final = os.path.join(self.base, layout.METRICS_DIR, name)
                os.makedirs(os.path.dirname(final), exist_ok=True)
                self._commit_dir(value, final, [f"`{c}`" for c in value.columns])
                self._record_files(metrics_key(name), final)
                tables.add(name)
            else:
                values[name] = value
        self.manifest["metric_tables"] = sorted(tables)
        self.manifest["metrics"] = {**(self.manifest.get("metrics") or {}), **values} or None
        self._save()

    def finish(self, sizes: dict | None = None) -> dict:
        """Record sizes (caller's timings/bytes merged with the store's own per-layer bytes) and
        return the manifest."""
        from sparkgnn.pe.sizes import size_report

        self.manifest["sizes"] = {**size_report(self.base, self.manifest), **(sizes or {})}
        self._save()
        return dict(self.manifest)
