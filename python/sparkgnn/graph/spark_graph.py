"""`Graph`: the Spark-side graph (GraphFrames' schema) that the engine plans over.

Why it never imports pyspark: only the Spark executor may, and everything needed here is
reachable from the DataFrames the caller hands in (selectExpr, joins, mapInArrow, their
sparkSession). Schema problems are reported at construction (no Spark job needed); content
validation costs jobs, so it runs on `validate()`, and on `load()` unless graph.json says the
directory was validated when written.

Normalised columns (extra columns are dropped; results join back to callers by id):
    vertices: id bigint, x array<float>, [y bigint], [split string]
    edges:    src bigint, dst bigint, [weight float]
"""

from __future__ import annotations

import json
import shutil
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn import files
from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import checks, dirfacts, layout, spark_checks
from sparkgnn.graph.fingerprint import FingerprintAccumulator, check_fingerprint, edge_hash_sum, vertex_hash_sum
from sparkgnn.graph.problems import raise_if_any, schema_problems
from sparkgnn.graph.typed import is_typed_meta
from sparkgnn.parquet_read import read_parquet

_MASK = (1 << 64) - 1
_PARTIAL_SCHEMA = "n bigint, h bigint"

# column -> (target Spark type, SQL cast target); a column is cast only when its type differs.
_VERTEX_TYPES = {
    "id": ("bigint", "BIGINT"),
    "x": ("array<float>", "ARRAY<FLOAT>"),
    "y": ("bigint", "BIGINT"),
    "split": ("string", "STRING"),
}
_EDGE_TYPES = {
    "src": ("bigint", "BIGINT"),
    "dst": ("bigint", "BIGINT"),
    "weight": ("float", "FLOAT"),
    layout.EDGE_ATTR: ("array<float>", "ARRAY<FLOAT>"),
}


def _normalise(df, types: dict):
    present = dict(df.dtypes)
    exprs = [
        name if present[name] == target else f"CAST({name} AS {cast}) AS {name}"
        for name, (target, cast) in types.items()
        if name in present
    ]
    return df.selectExpr(*exprs)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def _vertex_partials(feature_dim: int, batches):
    """mapInArrow body: one (rows, hash sum) row per partition (see fingerprint.py)."""
    rows, total = 0, 0
    for batch in batches:
        ids = batch.column("id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        x, problems = checks.vector_column(ids, batch.column("x"), feature_dim)
        if problems:  # unreachable after validate(); fail loudly rather than hash garbage
            raise ValueError("; ".join(p.message() for p in problems))
        rows += len(ids)
        total = (total + vertex_hash_sum(ids, x)) & _MASK
    yield pa.RecordBatch.from_pydict({"n": [rows], "h": [_signed(total)]})


def _edge_partials(has_weight: bool, edge_attr_dim: int, batches):
    rows, total = 0, 0
    for batch in batches:
        src = batch.column("src").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        dst = batch.column("dst").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        weight = batch.column("weight").to_numpy(zero_copy_only=False) if has_weight else None
        attr = None
        if edge_attr_dim:
            attr, problems = checks.vector_column(src, batch.column(layout.EDGE_ATTR), edge_attr_dim)
            if problems:  # unreachable after validate()
                raise ValueError("; ".join(p.message() for p in problems))
        rows += len(src)
        total = (total + edge_hash_sum(src, dst, weight, attr)) & _MASK
    yield pa.RecordBatch.from_pydict({"n": [rows], "h": [_signed(total)]})


def _first_width(folder: str) -> int:
    """The length of the first non-null x vector in a vertex folder's files (0: none), read on the
    driver: what the model is checked against before prepare's tasks validate every row."""
    for found in files.data_files(folder):
        for batch in files.parquet_batches(_join(folder, found.rel), ["x"], 4096):
            lengths = pc.list_value_length(batch.column("x")).drop_null()
            if len(lengths):
                return int(lengths[0].as_py())
    return 0


def _join(path: str, child: str) -> str:
    return path.rstrip("/") + "/" + child


def _read_meta(spark, path: str) -> dict | None:
    """graph.json with open() for local paths, through Spark (any Hadoop filesystem) otherwise."""
    if layout.is_local(path):
        return layout.read_meta(path)
    try:
        text = spark.read.text(_join(path, layout.META_FILE), wholetext=True).first()[0]
    except Exception:  # absent file: Spark raises its own AnalysisException type
        return None
    return layout.checked_meta(json.loads(text), path)


class Graph:
    """A graph as two Spark DataFrames (GraphFrames' schema) plus cached facts about it."""

    def __init__(self, vertices, edges, *, name: str | None = None, path: str | None = None, meta: dict | None = None):
        self.meta = dict(meta) if meta else None
        self.name = name or (self.meta or {}).get("name") or "graph"
        v_missing, v_wrong = spark_checks.column_defects(
            vertices, spark_checks.VERTEX_REQUIRED, spark_checks.VERTEX_OPTIONAL, "vertices"
        )
        e_missing, e_wrong = spark_checks.column_defects(
            edges, spark_checks.EDGE_REQUIRED, spark_checks.EDGE_OPTIONAL, "edges"
        )
        raise_if_any(schema_problems(v_missing + e_missing, v_wrong + e_wrong), self.name)
        self.vertices = _normalise(vertices, _VERTEX_TYPES)
        self.edges = _normalise(edges, _EDGE_TYPES)
        self.path = path
        self._validated = bool(self.meta and self.meta.get("validated"))
        self._facts: dict = {}
        self._stats: dict | None = None
        self._fingerprint: str | None = (self.meta or {}).get("fingerprint")
        #: dirfacts.data_stamp of the directory when `load` opened it, for a directory whose
        #: graph.json does not vouch for its facts (else None): the key of recall/remember_facts
        self.data_stamp: str | None = None
        #: engine.prepare_tasks.RowFiles: the local files of a graph derived from another's (a typed
        #: relation's, a pruned subgraph's), for prepare's tasks to read; None: `path`'s, if any
        self.row_files: object | None = None

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_graphframe(cls, graph, **kwargs) -> Graph:
        """Anything with `.vertices` and `.edges` DataFrames (a graphframes.GraphFrame)."""
        return cls(graph.vertices, graph.edges, **kwargs)

    @classmethod
    def load(cls, spark, path: str, *, validate: bool | None = None, name: str | None = None) -> Graph:
        """Open a graph directory. validate=None validates content unless graph.json records that
        the writer already validated it (write_graph_dir, write_synthetic, Graph.save) AND still
        describes the data files (dirfacts: a changed directory is validated and fingerprinted
        again, never served from a stale cache). Missing folders and unreadable Parquet files are
        refused up front with their names."""
        path = files.absolute(path)  # tasks list and read its files from their own working directory
        reachable = files.reachable(path)
        if reachable:
            dirfacts.check_graph_dir(path)
        meta = _read_meta(spark, path)
        if not reachable and is_typed_meta(meta):  # reachable ones were refused by check_graph_dir
            raise GraphValidationError(
                f"graph directory {path} holds a typed graph (open it with TypedGraph.load); PE stores, refresh "
                "and serving read homogeneous graphs only for now, batch inference runs it with a typed model"
            )
        meta, _why = dirfacts.trusted_meta(path, meta) if reachable else ({"name": (meta or {}).get("name")}, None)
        vouched = bool(meta and meta.get("validated") and meta.get("fingerprint"))
        # the files as this job opened them, which the facts it learns are recorded against (facts_cache)
        stamp = dirfacts.data_stamp(path) if reachable and not vouched else None
        graph = cls(
            read_parquet(spark, _join(path, layout.VERTICES_DIR)),
            read_parquet(spark, _join(path, layout.EDGES_DIR)),
            name=name,
            path=path,
            meta=meta,
        )
        graph.data_stamp = stamp
        if validate or (validate is None and not graph._validated):
            graph.validate(force=bool(validate))
        return graph

    @classmethod
    def from_graph_data(cls, spark, data, name: str | None = None) -> Graph:
        """A Spark Graph from an in-memory GraphData (for tests and small graphs; big graphs
        should go through write_graph_dir + Graph.load so the driver never holds them)."""
        data.validate()
        v_cols = {
            "id": pa.array(data.ids),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(data.x.reshape(-1)), data.feature_dim).cast(
                pa.list_(pa.float32())
            ),
        }
        if data.y is not None:
            v_cols["y"] = pa.array(data.y)
        if data.split is not None:
            v_cols["split"] = pa.array(data.split, mask=data.split == checks.NO_SPLIT, type=pa.string())
        e_cols = {"src": pa.array(data.src_ids), "dst": pa.array(data.dst_ids)}
        if data.weight is not None:
            e_cols["weight"] = pa.array(data.weight)
        if data.edge_attr is not None:
            e_cols[layout.EDGE_ATTR] = pa.FixedSizeListArray.from_arrays(
                pa.array(data.edge_attr.reshape(-1)), data.edge_attr_dim
            ).cast(pa.list_(pa.float32()))
        meta = {**data.meta(), "validated": True}
        return cls(
            spark.createDataFrame(pa.table(v_cols)),
            spark.createDataFrame(pa.table(e_cols)),
            name=name or data.name,
            meta=meta,
        )

    # --- facts ----------------------------------------------------------------------------------
    @property
    def has_weight(self) -> bool:
        return "weight" in self.edges.columns

    @property
    def has_labels(self) -> bool:
        return "y" in self.vertices.columns

    @property
    def edge_attr_dim(self) -> int:
        """Width of the edges' `edge_attr` vectors (0: the edges carry none); graph.json's when it
        vouches for the files, else found by validating."""
        if layout.EDGE_ATTR not in self.edges.columns:
            return 0
        for source in (self.meta or {}, self._facts):
            if source.get("edge_attr_dim"):
                return int(source["edge_attr_dim"])
        self.validate(force=True)
        return int(self._facts["edge_attr_dim"])

    @property
    def feature_dim(self) -> int:
        for source in (self.meta or {}, self._facts, self._stats or {}):
            if "feature_dim" in source:
                return int(source["feature_dim"])
        if self.path is not None and self.unvouched and files.is_local(self.path):
            self._facts["feature_dim"] = _first_width(_join(self.path, layout.VERTICES_DIR))  # no Spark job
            return self._facts["feature_dim"]
        row = self.vertices.where("x IS NOT NULL").selectExpr("size(x) AS f").first()
        self._facts["feature_dim"] = int(row.f) if row else 0
        return self._facts["feature_dim"]

    @property
    def fingerprint(self) -> str:
        """graph.json's fingerprint when loaded from a directory, else computed once (validating
        first: the fingerprint of a malformed graph would name nothing)."""
        if self._fingerprint is None:
            self.validate()
            acc = FingerprintAccumulator(self.feature_dim, self.has_weight, self.edge_attr_dim)
            for row in (
                self.vertices.select("id", "x")
                .mapInArrow(partial(_vertex_partials, self.feature_dim), _PARTIAL_SCHEMA)
                .collect()
            ):
                acc.add_partial(vertices=row.n, vertex_sum=row.h & _MASK)
            edge_partials = partial(_edge_partials, self.has_weight, self.edge_attr_dim)
            for row in self.edges.mapInArrow(edge_partials, _PARTIAL_SCHEMA).collect():
                acc.add_partial(edges=row.n, edge_sum=row.h & _MASK)
            self._fingerprint = acc.hexdigest()
        return self._fingerprint

    @property
    def unvouched(self) -> bool:
        """Whether this is a graph directory whose validity and fingerprint nothing vouches for
        yet (graph.json's data stamp, an earlier job's record, a validation in this job): the
        case in which prepare's tasks establish them while they read its files (graph.scan_facts)."""
        return (
            self.path is not None and self.data_stamp is not None and not self._validated and self._fingerprint is None
        )

    def adopt_scanned(self, facts: dict, fingerprint: str) -> None:
        """Take what prepare's tasks learnt from every row of this unvouched directory
        (graph.scan_facts: no defect, its counts, its fingerprint) as validation would have."""
        if not self.unvouched:
            raise ValueError(f"graph {self.name!r} is not an unvouched directory: its facts are known")
        self._facts.update(facts)
        self._fingerprint = check_fingerprint(fingerprint)
        self._validated = True

    def vouch_derived(self, fingerprint: str, facts: dict) -> None:
        """Take `fingerprint` and `facts` for this graph without a pass over it, and treat it as
        validated: for a graph cut from a validated one by a deterministic selection (the pruned
        subgraph, engine.pruned), whose content the parent's fingerprint and the selection name,
        and whose validity its construction guarantees (every edge kept has both endpoints kept)."""
        self._fingerprint = check_fingerprint(fingerprint)
        self._facts.update(facts)
        self._validated = True

    def sizes(self) -> dict:
        """{num_vertices, num_edges}: stats()' when known, else, for an unvouched directory, the
        row counts in its Parquet footers (no Spark job, no data read: the planner sizes the job
        before prepare's tasks validate it), else stats()'."""
        keys = ("num_vertices", "num_edges")
        for known in (self._stats or {}, self.meta or {}, self._facts):
            if all(k in known for k in keys):
                return {k: int(known[k]) for k in keys}
        if self.path is not None and self.unvouched and files.is_local(self.path):
            return {
                "num_vertices": files.parquet_rows(_join(self.path, layout.VERTICES_DIR)),
                "num_edges": files.parquet_rows(_join(self.path, layout.EDGES_DIR)),
            }
        stats = self.stats()
        return {k: int(stats[k]) for k in keys}

    @property
    def known_fingerprint(self) -> str | None:
        """The fingerprint if already known (graph.json or an earlier `fingerprint`), else None:
        for questions worth asking only when they cost no Spark job (is a layout prepared?)."""
        return self._fingerprint

    def recall_facts(self, work_dir: str) -> bool:
        """Adopt what an earlier job in `work_dir` recorded for this directory as it is now
        (graph.facts_cache: validated, its fingerprint and counts), so they are not computed again;
        returns whether there was such a record. Only for a directory `load` opened whose
        graph.json does not vouch for them."""
        if self.path is None or self.data_stamp is None or self._validated:
            return False
        from sparkgnn.graph import facts_cache

        known = facts_cache.recall(work_dir, self.path, self.data_stamp)
        if known is None:
            return False
        self._facts.update({k: v for k, v in known.items() if k not in ("fingerprint", "validated")})
        self._fingerprint = known["fingerprint"]
        self._validated = True
        return True

    def remember_facts(self, work_dir: str) -> bool:
        """Record this directory's facts in `work_dir` for later jobs (graph.facts_cache) once it
        is validated and fingerprinted; returns whether a record was written (nothing for a graph
        graph.json vouches for, or one not from a directory)."""
        if self.path is None or self.data_stamp is None or not self._validated or self._fingerprint is None:
            return False
        from sparkgnn.graph import facts_cache

        facts = {**self.stats(), "fingerprint": self._fingerprint}
        return facts_cache.remember(work_dir, self.path, self.data_stamp, facts)

    def stats(self) -> dict:
        """num_vertices, num_edges, feature_dim, has_weight, has_labels, num_classes (cached;
        read from graph.json when the graph was loaded from a directory, else from what validation
        counted, else counted)."""
        if self._stats is None:
            keys = ("num_vertices", "num_edges", "feature_dim", "num_classes")
            if self.meta and all(k in self.meta for k in keys):
                self._stats = {k: int(self.meta[k]) for k in keys}
            elif all(k in self._facts for k in keys):  # validate() counted them: no job only to count
                self._stats = {k: int(self._facts[k]) for k in keys}
            else:
                row = self.vertices.selectExpr(
                    "count(1) AS n",
                    "max(size(x)) AS f",
                    "max(y) AS maxy" if self.has_labels else "CAST(NULL AS BIGINT) AS maxy",
                ).collect()[0]
                self._stats = {
                    "num_vertices": row.n,
                    "num_edges": self.edges.count(),
                    "feature_dim": int(self._facts.get("feature_dim", row.f or 0)),
                    "num_classes": int(row.maxy) + 1 if row.maxy is not None and row.maxy >= 0 else 0,
                }
            self._stats.update(has_weight=self.has_weight, has_labels=self.has_labels)
            if self.edge_attr_dim:
                self._stats["edge_attr_dim"] = self.edge_attr_dim
        return dict(self._stats)

    # --- validation and conversion ----------------------------------------------------------------
    def validate(self, force: bool = False) -> Graph:
        """Raise GraphValidationError naming every defect (count + first offenders); else self.
        Runs once per Graph (and not at all for a directory whose writer validated it) unless
        force=True."""
        if self._validated and not force:
            return self
        expected = (self.meta or {}).get("feature_dim")
        v_problems, v_facts = spark_checks.vertex_problems(self.vertices, expected)
        e_problems, e_facts = spark_checks.edge_problems(
            self.edges,
            self.vertices,
            unique_ids=v_facts.pop("unique_ids"),
            edge_attr_dim=(self.meta or {}).get("edge_attr_dim"),
            broadcast_ids=v_facts["num_vertices"] <= spark_checks.BROADCAST_IDS,
        )
        raise_if_any(v_problems + e_problems, self.name)
        self._facts.update(v_facts, **e_facts)
        self._validated = True
        return self

    def to_graph_data(self):
        """Collect to the driver as a GraphData (small graphs: tests, reference computations)."""
        from sparkgnn.graph.reader import graph_data_from_tables

        return graph_data_from_tables(self.vertices.toArrow(), self.edges.toArrow(), name=self.name, meta=self.meta)

    def save(self, path: str, overwrite: bool = False) -> dict:
        """Write the graph directory with Spark (x lands as a Parquet list, which every reader
        accepts) and graph.json (local paths only). Staged inside `path` and swapped in like
        GraphDirWriter: an existing graph is replaced only with overwrite=True, and a failed write
        leaves it as it was. Returns graph.json's content."""
        from sparkgnn.graph.writer import check_target, new_staging, swap_in

        if not layout.is_local(str(path)):
            raise NotImplementedError("Graph.save writes graph.json with open(); use a local path")
        path = layout.strip_scheme(str(path))
        self.validate()
        check_target(path, overwrite)  # nothing is replaced unasked, and only after a complete write
        staging = new_staging(path)
        try:
            self.vertices.write.parquet(_join(staging, layout.VERTICES_DIR))
            self.edges.write.parquet(_join(staging, layout.EDGES_DIR))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        swap_in(path, staging)
        meta = {
            "name": self.name,
            **self.stats(),
            "fingerprint": self.fingerprint,
            "fingerprint_algo": "sgfp1",
            "validated": True,
            dirfacts.STAMP_KEY: dirfacts.data_stamp(str(path)),
        }
        layout.write_meta(str(path), meta)
        return meta

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return f"Graph(name={self.name!r}{where}, weight={self.has_weight}, labels={self.has_labels})"
