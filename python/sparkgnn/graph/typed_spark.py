"""`TypedGraph`: a typed graph directory as Spark DataFrames, one per node type and edge type.

    vertices[node type]                   id bigint, x array<float> (empty for a type without
                                          features), [y bigint], [split string]
    edges[(src type, relation, dst type)] src bigint, dst bigint, [weight float], [edge_attr array<float>]

Why it reuses the homogeneous Spark pieces: each table has the homogeneous schema, so it is
normalised, validated (spark_checks: one aggregate per table, one join per edge type against its
source and destination types' ids) and fingerprinted (spark_graph's mapInArrow partials) exactly
as a homogeneous graph's tables are; only the typed wording and the typed fingerprint's
combination (typed.py) are added. Like Graph it never imports pyspark, and content validation
runs on load only when graph.json does not vouch for the files.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from sparkgnn import files
from sparkgnn.graph import spark_checks
from sparkgnn.graph.problems import schema_problems
from sparkgnn.graph.spark_graph import (
    _EDGE_TYPES,
    _MASK,
    _PARTIAL_SCHEMA,
    _VERTEX_TYPES,
    _edge_partials,
    _join,
    _normalise,
    _vertex_partials,
)
from sparkgnn.graph.typed import (
    EdgeType,
    edge_key,
    edge_type_fingerprint,
    node_type_fingerprint_of,
    raise_typed,
    scoped,
    typed_fingerprint,
)
from sparkgnn.graph.typed_io import edge_folder, typed_structure, vertex_folder
from sparkgnn.parquet_read import read_parquet

_TYPED_VERTEX_REQUIRED = {"id": spark_checks.VERTEX_REQUIRED["id"]}
_TYPED_VERTEX_OPTIONAL = {"x": spark_checks.VERTEX_REQUIRED["x"], **spark_checks.VERTEX_OPTIONAL}


class TypedGraph:
    """A typed graph as DataFrames per type (dicts in PyG's metadata order) plus graph.json's facts."""

    def __init__(self, vertices: dict, edges: dict, *, name: str = "graph", path: str | None = None, meta=None):
        self.name, self.path = name, path
        self.meta = dict(meta or {})
        lines = []
        for t, df in vertices.items():
            missing, wrong = spark_checks.column_defects(df, _TYPED_VERTEX_REQUIRED, _TYPED_VERTEX_OPTIONAL, t)
            lines += scoped(f"node type {t!r}", schema_problems(missing, wrong))
        for et, df in edges.items():
            missing, wrong = spark_checks.column_defects(
                df, spark_checks.EDGE_REQUIRED, spark_checks.EDGE_OPTIONAL, edge_key(et)
            )
            lines += scoped(f"edge type {edge_key(et)}", schema_problems(missing, wrong))
        raise_typed(lines, name)
        self.vertices = {
            t: _normalise(
                df if "x" in df.columns else df.selectExpr("*", "CAST(array() AS ARRAY<FLOAT>) AS x"), _VERTEX_TYPES
            )
            for t, df in vertices.items()
        }
        self.edges = {tuple(et): _normalise(df, _EDGE_TYPES) for et, df in edges.items()}
        self._validated = bool(self.meta.get("validated"))
        self._fingerprint: str | None = self.meta.get("fingerprint")
        self._facts: dict = {}

    @classmethod
    def load(cls, spark, path: str, *, validate: bool | None = None) -> TypedGraph:
        """Open a typed graph directory (local paths): its folders checked against graph.json's
        types first (typed_io.typed_structure), then content validated unless graph.json records
        a validated write AND still describes the files."""
        path = files.absolute(path)
        meta, trusted, edge_types = typed_structure(path)
        graph = cls(
            {t: read_parquet(spark, _join(path, vertex_folder(t))) for t in meta["node_types"]},
            {et: read_parquet(spark, _join(path, edge_folder(et))) for et in edge_types},
            name=meta.get("name") or "graph",
            path=path,
            meta=trusted,
        )
        if validate or (validate is None and not graph._validated):
            graph.validate(force=bool(validate))
        return graph

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """(node types, edge types) as PyG's `HeteroData.metadata()` gives them."""
        return list(self.vertices), list(self.edges)

    def _type_meta(self, t: str) -> dict:
        return (self.meta.get("types") or {}).get(t, {})

    def _relation_meta(self, et: EdgeType) -> dict:
        return (self.meta.get("relations") or {}).get(edge_key(et), {})

    def validate(self, force: bool = False) -> TypedGraph:
        """Raise GraphValidationError with one line per defect, each naming its type (the
        homogeneous per-table checks, and endpoints missing in their typed vertex tables)."""
        if self._validated and not force:
            return self
        lines: list[str] = []
        unique = {}
        for t, df in self.vertices.items():
            problems, facts = spark_checks.vertex_problems(df, self._type_meta(t).get("feature_dim"))
            lines += scoped(f"node type {t!r}", problems)
            unique[t] = facts.pop("unique_ids")
            self._facts[t] = facts
        for et, df in self.edges.items():
            src_type, _, dst_type = et
            problems, facts = spark_checks.edge_problems(
                df,
                self.vertices[src_type],
                unique_ids=unique[src_type] and unique[dst_type],
                edge_attr_dim=self._relation_meta(et).get("edge_attr_dim") or None,
                dst_vertices=self.vertices[dst_type],
            )
            typed = {"dangling_src": src_type, "dangling_dst": dst_type}
            problems = [
                replace(p, kind=f"typed_{p.kind}", detail=repr(typed[p.kind])) if p.kind in typed else p
                for p in problems
            ]
            lines += scoped(f"edge type {edge_key(et)}", problems)
            self._facts[et] = facts
        raise_typed(lines, self.name)
        self._validated = True
        return self

    @property
    def fingerprint(self) -> str:
        """graph.json's fingerprint when it vouches for the files, else computed (validating first)
        from per-type partial hash sums, as typed.py defines it."""
        if self._fingerprint is None:
            self.validate()
            node_fps, edge_fps = {}, {}
            for t, df in self.vertices.items():
                width = int(self._type_meta(t).get("feature_dim", self._facts.get(t, {}).get("feature_dim", 0)))
                rows = df.select("id", "x").mapInArrow(partial(_vertex_partials, width), _PARTIAL_SCHEMA).collect()
                node_fps[t] = node_type_fingerprint_of(
                    sum(r.n for r in rows), sum(r.h & _MASK for r in rows) & _MASK, width
                )
            for et, df in self.edges.items():
                has_weight = "weight" in df.columns
                attr_dim = int(
                    self._relation_meta(et).get("edge_attr_dim") or self._facts.get(et, {}).get("edge_attr_dim", 0)
                )
                rows = df.mapInArrow(partial(_edge_partials, has_weight, attr_dim), _PARTIAL_SCHEMA).collect()
                edge_fps[et] = edge_type_fingerprint(
                    sum(r.n for r in rows), sum(r.h & _MASK for r in rows) & _MASK, has_weight, attr_dim
                )
            self._fingerprint = typed_fingerprint(node_fps, edge_fps)
        return self._fingerprint

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return f"TypedGraph(name={self.name!r}{where}, node_types={list(self.vertices)}, edge_types={list(self.edges)})"


__all__ = ["TypedGraph"]
