"""PEStore: open a committed PE store for ONE (graph, model) pair, refusing it when stale.

WHY verification is mandatory on open: PEs are only meaningful for the exact weights and the
exact graph they were computed from; a store silently reused after retraining or after the graph
changed gives plausible-looking, wrong answers. So `open` needs the model and the graph and names
every difference it finds (weights, graph, layer count, widths, layers never committed) in one
StalePEStore message.

`rows(layer)` reads given rows of a layer from its row files (rowfile.py) without reading it
whole (what a cold refresh uses). Lookups load a layer's Parquet with pyarrow once (cached per
layer; exactly the files the manifest recorded, through pyarrow.fs, so s3:// stores work) and
answer id batches with a vectorised search (lookup.py); `frame` hands the same files to Spark
(its Hadoop filesystem) for joins at scale. A store is shared by threads answering at once (typed
serving's engines): each layer is loaded once under the store's lock, then only read.
"""

from __future__ import annotations

import threading

from sparkgnn import files
from sparkgnn.errors import DamagedPEStore, SparkGNNError, StalePEStore
from sparkgnn.parquet_read import read_parquet
from sparkgnn.pe import integrity, layout, rowfile, versions
from sparkgnn.pe.identity import graph_fingerprint, model_identity
from sparkgnn.pe.lookup import SortedTable, UnknownIds, vectors
from sparkgnn.pe.rowfile import LayerRows
from sparkgnn.pe.writer import PEWriter, layer_key, metrics_key

__all__ = ["MissingMetricsTable", "PEStore", "PEWriter", "UnknownIds"]


class MissingMetricsTable(SparkGNNError, ValueError):
    """The store has no committed metrics table of that name (precomputed without metrics, or a
    name it never writes)."""


def _short(fp: str) -> str:
    return fp[:12]


def _listdirs(path: str) -> list[str]:
    return sorted(name for name, what in files.entries(path).items() if what == "dir")


def _missing_dir_problem(root: str, graph_fp: str, model) -> str:
    """Why <root>/<graph>/<model> does not exist, in the caller's terms."""
    graphs = [g for g in _listdirs(root) if not g.startswith(".")]
    if graph_fp not in graphs:
        have = ", ".join(_short(g) for g in graphs) or "none"
        return (
            f"graph fingerprint differs: no PEs for graph {_short(graph_fp)} under {root} (store has graph(s): {have})"
        )
    models = _listdirs(files.join(root, graph_fp))
    same_spec = [
        m
        for m in models
        if (layout.read_manifest(files.join(root, graph_fp, m)) or {}).get("model_spec_sha256") == model.spec_sha
    ]
    if same_spec:
        return (
            f"model weights differ: the store has PEs of the same architecture for this graph "
            f"but model fingerprint(s) {', '.join(_short(m) for m in same_spec)}, "
            f"not {_short(model.fingerprint)} (retrained or edited weights)"
        )
    described = []
    for m in models:
        mf = layout.read_manifest(files.join(root, graph_fp, m)) or {}
        described.append(f"{_short(m)} ({mf.get('num_layers')} layers, dims {mf.get('dims')})")
    return (
        f"model fingerprint differs: no PEs for model {_short(model.fingerprint)} "
        f"({model.num_layers} layers, dims {list(model.dims)}) on this graph; the store has "
        f"{', '.join(described) or 'none'}, none with this architecture"
    )


def manifest_problems(manifest: dict, graph_fp: str, model) -> list[str]:
    """Every way a manifest fails to describe a complete store for (graph, model)."""
    problems = []
    if manifest.get("format") != layout.FORMAT:
        problems.append(f"manifest format {manifest.get('format')!r} != {layout.FORMAT}")
    if manifest.get("graph_fingerprint") != graph_fp:
        problems.append(
            f"graph fingerprint differs: store {_short(str(manifest.get('graph_fingerprint')))}"
            f" vs graph {_short(graph_fp)}"
        )
    if manifest.get("model_fingerprint") != model.fingerprint:
        what = (
            "model weights differ"
            if manifest.get("model_spec_sha256") == model.spec_sha
            else "model fingerprint differs"
        )
        problems.append(
            f"{what}: store {_short(str(manifest.get('model_fingerprint')))} vs model {_short(model.fingerprint)}"
        )
    k = manifest.get("num_layers")
    if k != model.num_layers:
        problems.append(f"layer count differs: store has {k} layers, model {model.num_layers}")
    if list(manifest.get("dims") or []) != list(model.dims):
        problems.append(f"dims differ: store {manifest.get('dims')} vs model {list(model.dims)}")
    done = set(int(l) for l in manifest.get("layers_complete") or [])
    for l in range(1, int(k or 0) + 1):
        if l not in done:
            problems.append(f"layer {l} of {k} never committed")
    return problems


def damaged_parts(base: str, manifest: dict, verify: str = "checksums", trusted=frozenset()) -> list[str]:
    """'layer=2: 1 file(s) missing: ...' for every committed directory whose files differ from
    the manifest's record (base segments in `trusted` not listed again: versions.base_problems)."""
    recorded = manifest.get(integrity.FILES_KEY) or {}
    columns: tuple[str, ...] = ("id", "h", "state") if manifest.get("with_states") else ("id", "h")
    keys = [(layer_key(l), columns) for l in sorted(manifest["layers_complete"])]
    keys += [(metrics_key(n), ()) for n in manifest.get("metric_tables") or []]
    found = []
    for key, cols in keys:
        directory = layout.committed_dir(base, manifest, key)
        problems = integrity.problems(directory, recorded.get(key), verify, cols)
        problems += versions.base_problems(base, manifest, key, verify, cols, trusted)
        if problems:
            found.append(f"{key}: " + ", ".join(problems))
    return found


def _segment_folders(store: PEStore | None) -> frozenset[str]:
    """The folders of every segment of every committed layer of `store` (none for None)."""
    if store is None:
        return frozenset()
    keys = [layer_key(l) for l in store.manifest.get("layers_complete") or []]
    return frozenset(s.folder for key in keys for s in versions.segments(store.base, store.manifest, key))


class PEStore:
    """A verified, complete PE store. Construct with PEStore.open."""

    def __init__(self, base: str, manifest: dict):
        self.base = base
        self.manifest = manifest
        self._tables: dict = {}
        self._rows: dict = {}
        self._lock = threading.Lock()  # table() and rows() load a layer once (module doc)

    def __getstate__(self) -> dict:
        # a store may travel with a serving context to Spark executors: its lock does not
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path, *, model, graph, verify: str = "checksums", trusted_from: PEStore | None = None) -> PEStore:
        """`path`: the store root (or a <root>/<graph fp>/<model fp> directory). `model`: a Model
        or saved-model path. `graph`: a Graph or graph directory. Raises StalePEStore naming
        what differs, and DamagedPEStore naming every committed layer or metrics table whose
        files differ from their commit record (`verify`: "checksums" or "sizes", integrity.py).
        `trusted_from`: a store opened (checked) earlier whose segments this one may lie on: those
        are not listed again (a delta swap opens each successor of the version it holds)."""
        ident = model_identity(model)
        graph_fp = graph_fingerprint(graph)
        root = layout.normal_path(path)
        if files.kind(files.join(root, layout.MANIFEST_FILE)) == "file":
            base = root
        else:
            base = layout.store_dir(root, graph_fp, ident.fingerprint)
            if files.kind(base) != "dir":
                raise StalePEStore(f"PE store {root}: {_missing_dir_problem(root, graph_fp, ident)}")
        manifest = layout.read_manifest(base)
        if manifest is None:
            raise StalePEStore(f"PE store {base}: no manifest.json (no layer ever committed)")
        problems = manifest_problems(manifest, graph_fp, ident)
        if problems:
            raise StalePEStore(f"PE store {base} is stale or incomplete: " + "; ".join(problems))
        damage = damaged_parts(base, manifest, verify, _segment_folders(trusted_from))
        if damage:
            raise DamagedPEStore(
                f"PE store {base} is damaged: "
                + "; ".join(damage)
                + ". Rerun the precompute job on it: it recomputes damaged layers"
            )
        return cls(base, manifest)

    # -- facts ---------------------------------------------------------------------------------
    @property
    def layers(self) -> list[int]:
        return sorted(int(l) for l in self.manifest["layers_complete"])

    @property
    def with_states(self) -> bool:
        return bool(self.manifest.get("with_states"))

    def width(self, layer: int) -> int:
        return int(self.manifest["dims"][self._check_layer(layer) - 1])

    def state_width(self, layer: int) -> int | None:
        sd = self.manifest.get("state_dims")
        return None if not sd else sd[self._check_layer(layer) - 1]

    def _check_layer(self, layer: int) -> int:
        if int(layer) not in self.layers:
            raise ValueError(f"layer {layer} not in this store (layers {self.layers})")
        return int(layer)

    def layer_path(self, layer: int) -> str:
        """The folder holding the committed files of `layer` (its attempt folder)."""
        return layout.committed_dir(self.base, self.manifest, layer_key(self._check_layer(layer)))

    # -- lookups -------------------------------------------------------------------------------
    def table(self, layer: int) -> SortedTable:
        """Layer `layer` whole, sorted by id (h and, when stored, state columns), read once and kept:
        what lookup() answers from, and what a refresh reads the old values from."""
        layer = self._check_layer(layer)
        found = self._tables.get(layer)
        if found is None:
            with self._lock:
                found = self._tables.get(layer)
                if found is None:
                    table = versions.read(self.base, self.manifest, layer_key(layer))
                    what = f"PE store layer {layer}"
                    cols = {"h": vectors(table.column("h"), self.width(layer), f"{what} h")}
                    if "state" in table.column_names:
                        cols["state"] = vectors(table.column("state"), self.state_width(layer), f"{what} state")
                    ids = table.column("id").to_numpy().astype("int64", copy=False)
                    found = self._tables[layer] = SortedTable(ids, cols, what)
        return found

    def loaded(self, layer: int) -> bool:
        """Whether layer `layer` is already held whole in memory (table() was called)."""
        return int(layer) in self._tables

    def rows(self, layer: int) -> LayerRows | None:
        """Layer `layer` readable row by row from its row files (rowfile.py: memory-mapped, a
        fetch reads only the rows asked for; `LayerRows.rows_read` counts them), or None when a
        segment of the layer has no row file (a store written before them, or by Spark): read it
        whole with table(). Raises DamagedPEStore when a row file does not belong to its layer."""
        layer = self._check_layer(layer)
        if layer not in self._rows:  # None (no row files) is kept too
            with self._lock:
                if layer not in self._rows:
                    key = layer_key(layer)
                    chain = versions.segments(self.base, self.manifest, key)
                    self._rows[layer] = rowfile.layer_rows(chain, key, f"PE store layer {layer} (row files)")
        return self._rows[layer]

    def lookup(self, ids, layer: int, states: bool = False):
        """(h [n, w] float32, state [n, s] float32 or None) for `ids` in the given order.
        Unknown ids raise UnknownIds (a SparkGNNError and KeyError) naming count + examples."""
        t = self.table(layer)
        pos = t.positions(ids)
        if states and "state" not in t.columns:
            raise ValueError(f"layer {layer} was stored without partial states")
        return t.columns["h"][pos], (t.columns["state"][pos] if states else None)

    def lookup_torch(self, ids, layer: int, states: bool = False, device=None):
        import torch

        h, s = self.lookup(ids, layer, states)
        h = torch.from_numpy(h).to(device) if device else torch.from_numpy(h)
        if s is not None:
            s = torch.from_numpy(s).to(device) if device else torch.from_numpy(s)
        return h, s

    def frame(self, spark, layer: int):
        """The layer as a Spark DataFrame (id, h[, state]): its recorded files (and, for a layer
        committed as a delta, its base segments merged: versions.py), read by Spark's own
        filesystem (s3a:// for an s3:// store: the cluster needs hadoop-aws)."""
        return versions.spark_frame(spark, self.base, self.manifest, layer_key(self._check_layer(layer)))

    # -- workload metrics ----------------------------------------------------------------------
    @property
    def metric_tables(self) -> list[str]:
        """Names of the committed metrics tables ("degrees", "psgs", "fap" after a precompute
        with metrics), sorted."""
        return sorted(self.manifest.get("metric_tables") or [])

    def _check_metrics(self, name: str) -> str:
        if name not in self.metric_tables:
            have = ", ".join(self.metric_tables) or "none: rerun the precompute with workload metrics"
            raise MissingMetricsTable(f"PE store {self.base} has no metrics table {name!r} (it has: {have})")
        return name

    def metrics_frame(self, spark, name: str):
        """Metrics table `name` as a Spark DataFrame (its recorded files, read by Spark)."""
        key = metrics_key(self._check_metrics(name))
        return read_parquet(spark, *layout.spark_paths(self.base, self.manifest, key))

    def metrics_table(self, name: str):
        """Metrics table `name` as a pyarrow.Table, without Spark: exactly the files the manifest
        recorded for it (the ones metrics_frame gives Spark), through pyarrow.fs (s3:// works).
        WHY: serving workers (the hot cache's placement policies) need a few million doubles, not
        a Spark session. Raises MissingMetricsTable naming the tables the store has. Only the
        files' own columns: pyarrow would otherwise add the `attempt=<id>` folder as a Hive
        partition column, which Spark (given the files themselves) does not."""
        import pyarrow.parquet as pq

        key = metrics_key(self._check_metrics(name))
        listed = layout.committed_files(self.base, self.manifest, key)
        if listed is None:  # a store written before file records: the committed folder
            fs, inner = files.filesystem(layout.committed_dir(self.base, self.manifest, key))
            return pq.read_table(inner, filesystem=fs, partitioning=None)
        fs = files.filesystem(listed[0])[0]
        return pq.read_table([files.filesystem(p)[1] for p in listed], filesystem=fs, partitioning=None)

    def size_report(self) -> dict:
        from sparkgnn.pe.sizes import size_report

        return size_report(self.base, self.manifest)

    def __repr__(self) -> str:
        return f"PEStore({self.base!r}, layers={self.layers}, states={self.with_states})"
