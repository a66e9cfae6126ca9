"""TypedGraphData: a typed (heterogeneous) graph in memory, PyG HeteroData's counterpart.

A typed graph has node types, each with its own vertex table (ids, features of the type's own
width or none at all, optional labels and split), and edge types `(src type, relation, dst
type)`, each with its own edge table whose endpoints are ids of the source and destination
types. Ids are per type: `paper` 7 and `author` 7 are two vertices.

Why each node type is a GraphData without edges: a vertex table is exactly what GraphData
already coerces, validates and fingerprints (duplicate ids, non-finite features, labels,
splits), so the typed graph reuses it per type instead of repeating those rules; only the
checks that cross types (unknown types, endpoints missing in their typed vertex table) live here.

Fingerprint ("sgtfp1"): every node type and every edge type gets the homogeneous fingerprint of
its own table (fingerprint.py: a node type's is that of its vertices with no edges, an edge
type's that of its edges with no vertices), and the typed fingerprint hashes the sorted list of
`v:<type>=<fp>` and `e:<src>__<rel>__<dst>=<fp>`. It changes with any type's content or name,
not with the order types are listed in, and it can be accumulated chunk by chunk like sgfp1.

Like the rest of graph/, this module imports neither pyspark nor torch at import time.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import checks
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.fingerprint import FingerprintAccumulator, edge_hash_sum

log = logging.getLogger(__name__)

EdgeType = tuple[str, str, str]
TYPED_FORMAT = "sparkgnn-typed-graph/1"
TYPED_FINGERPRINT_ALGO = "sgtfp1"
KEY_SEPARATOR = "__"
# Folder-safe names: no separator, no path characters, no hive `k=v`, not hidden from Spark
# (Spark skips paths starting with `_` or `.`).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")


def check_type_name(name, what: str = "node type") -> str | None:
    """None when `name` can name a type or relation (a folder and a key part), else why not."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or KEY_SEPARATOR in name:
        return (
            f"{what} name {name!r} is not usable: use letters, digits, '_' and '-', starting with a letter or "
            f"digit and without '{KEY_SEPARATOR}'"
        )
    return None


def edge_key(edge_type: EdgeType) -> str:
    """`src__rel__dst`: an edge type's folder name under edges/ and its key in graph.json."""
    return KEY_SEPARATOR.join(edge_type)


def as_edge_type(value) -> EdgeType:
    """A (src type, relation, dst type) triple as a tuple of three strings (from a list in JSON)."""
    return (str(value[0]), str(value[1]), str(value[2]))


def parse_edge_key(key: str) -> EdgeType | None:
    """The edge type a folder name `src__rel__dst` names, or None when it names none."""
    parts = key.split(KEY_SEPARATOR)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


def node_type_fingerprint(node: GraphData) -> str:
    """A node type's fingerprint: sgfp1 of its vertex table with no edges."""
    return node.fingerprint


def node_type_fingerprint_of(num_vertices: int, vertex_sum: int, feature_dim: int) -> str:
    """The same from a row count and vertex hash sum (fingerprint.vertex_hash_sum), as a
    streaming writer or Spark partials have them."""
    acc = FingerprintAccumulator(feature_dim, False)
    acc.add_partial(vertices=num_vertices, vertex_sum=vertex_sum)
    return acc.hexdigest()


def edge_type_fingerprint(num_edges: int, edge_sum: int, has_weight: bool, edge_attr_dim: int) -> str:
    """An edge type's fingerprint from its row count and edge hash sum (fingerprint.edge_hash_sum):
    sgfp1 of its edge table with no vertices."""
    acc = FingerprintAccumulator(0, has_weight, edge_attr_dim)
    acc.add_partial(edges=num_edges, edge_sum=edge_sum)
    return acc.hexdigest()


def typed_fingerprint(node_fps: Mapping[str, str], edge_fps: Mapping[EdgeType, str]) -> str:
    """The typed graph's fingerprint from its per-type fingerprints (order free)."""
    parts = [f"v:{t}={fp}" for t, fp in sorted(node_fps.items())]
    parts += [f"e:{edge_key(et)}={fp}" for et, fp in sorted(edge_fps.items())]
    text = "|".join([TYPED_FINGERPRINT_ALGO, *parts])
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def node_table(ids, x=None, *, y=None, split=None, name: str = "node") -> GraphData:
    """One node type's vertex table: a GraphData without edges (x None: a type without features)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if x is None:
        x = np.zeros((len(ids), 0), np.float32)
    empty = np.empty(0, np.int64)
    return GraphData(ids, x, empty, empty, y=y, split=split, name=name)


def raise_typed(lines: list[str], name: str) -> None:
    """Raise one GraphValidationError with one line per defect, each naming its type; the lines
    are kept as `.problems`."""
    if not lines:
        return
    noun = "problem" if len(lines) == 1 else "problems"
    error = GraphValidationError(
        f"typed graph {name!r} failed validation ({len(lines)} {noun}):\n" + "\n".join(f"  - {line}" for line in lines)
    )
    error.problems = list(lines)
    raise error


def scoped(scope: str, problems) -> list[str]:
    """Problem messages prefixed with the type they belong to."""
    return [f"{scope}: {p.message()}" for p in problems if p is not None and p.count > 0]


@dataclass(eq=False)
class TypedEdges:
    """One edge type's edges, by ORIGINAL ids of their source and destination types."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray | None = None
    # [E, D] float32 edge attributes, or None
    edge_attr: np.ndarray | None = None

    def __post_init__(self):
        self.src = np.ascontiguousarray(self.src, dtype=np.int64).reshape(-1)
        self.dst = np.ascontiguousarray(self.dst, dtype=np.int64).reshape(-1)
        if self.weight is not None:
            self.weight = np.ascontiguousarray(self.weight, dtype=np.float32).reshape(-1)
        if self.edge_attr is not None:
            self.edge_attr = np.ascontiguousarray(self.edge_attr, dtype=np.float32)
            if self.edge_attr.ndim == 1:
                self.edge_attr = self.edge_attr.reshape(-1, 1)

    @property
    def num_edges(self) -> int:
        return int(len(self.src))

    @property
    def edge_attr_dim(self) -> int:
        return int(self.edge_attr.shape[1]) if self.edge_attr is not None and self.edge_attr.ndim == 2 else 0

    def shape_problems(self) -> list[str]:
        e = self.num_edges
        wrong = [
            f"{what} has {len(arr)} rows, expected {e}"
            for what, arr in (("dst", self.dst), ("weight", self.weight), ("edge_attr", self.edge_attr))
            if arr is not None and len(arr) != e
        ]
        if self.edge_attr is not None and (self.edge_attr.ndim != 2 or self.edge_attr.shape[1] < 1):
            wrong.append(f"edge_attr has shape {self.edge_attr.shape}, expected [num_edges, D] with D >= 1")
        return wrong

    @cached_property
    def fingerprint(self) -> str:
        total = edge_hash_sum(self.src, self.dst, self.weight, self.edge_attr)
        return edge_type_fingerprint(self.num_edges, total, self.weight is not None, self.edge_attr_dim)


@dataclass(eq=False)
class TypedGraphData:
    """A typed graph in memory: a vertex table per node type and an edge table per edge type, in
    PyG's metadata order (the order of the mappings). Treat as immutable (derived values cached)."""

    nodes: dict[str, GraphData]
    edges: dict[EdgeType, TypedEdges] = field(default_factory=dict)
    name: str = "graph"

    def __post_init__(self):
        self.nodes = dict(self.nodes)
        self.edges = {as_edge_type(et): e for et, e in dict(self.edges).items()}

    # --- metadata and sizes ---------------------------------------------------------------------
    @property
    def node_types(self) -> list[str]:
        return list(self.nodes)

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.edges)

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """(node types, edge types) as PyG's `HeteroData.metadata()` gives them."""
        return self.node_types, self.edge_types

    @property
    def num_nodes(self) -> int:
        return sum(n.num_nodes for n in self.nodes.values())

    @property
    def num_edges(self) -> int:
        return sum(e.num_edges for e in self.edges.values())

    def edge_index(self, edge_type: EdgeType) -> tuple[np.ndarray, np.ndarray]:
        """Dense (src row, dst row) of an edge type: rows of the source and destination types'
        vertex tables (PyG's edge_index)."""
        src_type, _, dst_type = edge_type
        edges = self.edges[edge_type]
        return self.nodes[src_type].id_index.lookup(edges.src)[0], self.nodes[dst_type].id_index.lookup(edges.dst)[0]

    @cached_property
    def fingerprint(self) -> str:
        """Content hash over every type (see module doc); equals the one written to graph.json."""
        return typed_fingerprint(
            {t: node_type_fingerprint(n) for t, n in self.nodes.items()},
            {et: e.fingerprint for et, e in self.edges.items()},
        )

    # --- validation -------------------------------------------------------------------------------
    def validate(self) -> TypedGraphData:
        """Raise GraphValidationError with one line per defect, each naming its type: bad type names,
        edge types whose node types are unknown, per-type vertex defects (duplicate ids, ragged or
        non-finite features, labels, splits), endpoints missing in their typed vertex tables, bad
        weights and edge attributes. Returns self when there is none."""
        raise_typed(self.problems(), self.name)
        return self

    def problems(self) -> list[str]:
        """Every defect as one line naming its type (empty: valid)."""
        lines = [why for t in self.nodes if (why := check_type_name(t))]
        if not self.nodes:
            lines.append("no node types (a typed graph needs at least one)")
        for node_type, node in self.nodes.items():
            scope = f"node type {node_type!r}"
            shape = node._shape_problems
            lines += scoped(scope, shape)
            if shape:
                continue
            lines += scoped(
                scope,
                [
                    checks.duplicate_ids(node.id_index),
                    checks.nonfinite_features(node.ids, node.x),
                    checks.bad_labels(node.ids, node.y),
                    checks.bad_splits(node.ids, node.split),
                ],
            )
        for edge_type, edges in self.edges.items():
            lines += self._edge_problems(edge_type, edges)
        return lines

    def _edge_problems(self, edge_type: EdgeType, edges: TypedEdges) -> list[str]:
        scope = f"edge type {edge_key(edge_type)}"
        if len(edge_type) != 3:
            return [f"edge type {edge_type!r} is not a (src type, relation, dst type) triple"]
        naming = [
            why
            for part, what in zip(edge_type, ("source node type", "relation", "destination node type"), strict=True)
            if (why := check_type_name(part, what))
        ]
        unknown = [t for t in (edge_type[0], edge_type[2]) if t not in self.nodes]
        if naming or unknown:
            known = ", ".join(self.nodes) or "none"
            return [f"{scope}: {why}" for why in naming] + [
                f"{scope}: node type {t!r} is unknown (node types: {known})" for t in dict.fromkeys(unknown)
            ]
        shape = edges.shape_problems()
        if shape:
            return [f"{scope}: {line}" for line in shape]
        src_type, _, dst_type = edge_type
        src_found = self.nodes[src_type].id_index.lookup(edges.src)[1]
        dst_found = self.nodes[dst_type].id_index.lookup(edges.dst)[1]
        lines = []
        for kind, found, node_type in (("src", src_found, src_type), ("dst", dst_found, dst_type)):
            problem = checks.dangling(f"dangling_{kind}", found, edges.src, edges.dst)
            if problem is not None:
                lines += scoped(scope, [replace(problem, kind=f"typed_dangling_{kind}", detail=repr(node_type))])
        lines += scoped(
            scope,
            [
                checks.bad_weights(edges.weight, edges.src, edges.dst),
                checks.nonfinite_edge_attr(edges.edge_attr, edges.src, edges.dst),
            ],
        )
        return lines

    # --- PyG ----------------------------------------------------------------------------------------
    @classmethod
    def from_pyg(cls, data, *, name: str = "graph", validate: bool = True) -> TypedGraphData:
        """From a torch_geometric HeteroData: per node type x (absent: a type without features;
        its `num_nodes` must then be set), y (one label per node) and train/val/test masks; per
        edge type edge_index, edge_weight and edge_attr. Ids are the PyG row numbers. Other
        attributes are not converted (logged)."""
        nodes: dict[str, GraphData] = {}
        dropped: list[str] = []
        for node_type in data.node_types:
            store = data[node_type]
            nodes[node_type] = _node_from_pyg(store, node_type, name)
            dropped += [f"{node_type}.{k}" for k in store.keys() if k not in _PYG_NODE_KEYS]
        edges: dict[EdgeType, TypedEdges] = {}
        for edge_type in data.edge_types:
            store = data[edge_type]
            if "edge_index" not in store:
                raise GraphValidationError(
                    f"typed graph {name!r}: edge type {edge_key(edge_type)} has no edge_index "
                    "(a SparseTensor adj_t is not converted; give edge_index)"
                )
            index = store.edge_index.detach().cpu().numpy()
            weight = store.get("edge_weight")
            attr = store.get("edge_attr")
            edges[tuple(edge_type)] = TypedEdges(
                nodes[edge_type[0]].ids[index[0]] if edge_type[0] in nodes else index[0],
                nodes[edge_type[2]].ids[index[1]] if edge_type[2] in nodes else index[1],
                weight=None if weight is None else weight.detach().cpu().numpy(),
                edge_attr=None if attr is None else attr.detach().cpu().numpy(),
            )
            dropped += [f"{edge_key(edge_type)}.{k}" for k in store.keys() if k not in _PYG_EDGE_KEYS]
        if dropped:
            log.warning("typed graph %r: attributes not converted: %s", name, ", ".join(dropped))
        graph = cls(nodes, edges, name=name)
        return graph.validate() if validate else graph

    def to_pyg(self):
        """A torch_geometric HeteroData with the same metadata order: x (only for types with
        features, num_nodes otherwise), y, train/val/test masks, edge_index (dense rows),
        edge_weight and edge_attr."""
        import torch
        from torch_geometric.data import HeteroData

        data = HeteroData()
        for node_type, node in self.nodes.items():
            store = data[node_type]
            if node.feature_dim:
                store.x = torch.from_numpy(node.x.copy())
            else:
                store.num_nodes = node.num_nodes
            if node.y is not None:
                store.y = torch.from_numpy(node.y.copy())
            if node.split is not None:
                for split_name in checks.SPLIT_NAMES:
                    store[f"{split_name}_mask"] = torch.from_numpy(node.mask(split_name))
        for edge_type, edges in self.edges.items():
            store = data[edge_type]
            src, dst = self.edge_index(edge_type)
            store.edge_index = torch.from_numpy(np.stack([src, dst]))
            if edges.weight is not None:
                store.edge_weight = torch.from_numpy(edges.weight.copy())
            if edges.edge_attr is not None:
                store.edge_attr = torch.from_numpy(edges.edge_attr.copy())
        return data

    # --- description ------------------------------------------------------------------------------
    def meta(self) -> dict:
        """The graph.json document describing this graph (without the writer's data stamp)."""
        return {
            "name": self.name,
            "format": TYPED_FORMAT,
            "node_types": self.node_types,
            "edge_types": [list(et) for et in self.edge_types],
            "num_vertices": self.num_nodes,
            "num_edges": self.num_edges,
            "types": {t: node_type_meta(n, node_type_fingerprint(n)) for t, n in self.nodes.items()},
            "relations": {
                edge_key(et): edge_type_meta(e.num_edges, e.weight is not None, e.edge_attr_dim, e.fingerprint)
                for et, e in self.edges.items()
            },
            "fingerprint": self.fingerprint,
            "fingerprint_algo": TYPED_FINGERPRINT_ALGO,
        }

    def summary(self) -> str:
        """One line for logs and the CLI."""
        return typed_summary(self.meta())

    def __repr__(self) -> str:
        return (
            f"TypedGraphData(name={self.name!r}, node_types={self.node_types}, "
            f"edge_types={self.edge_types}, num_nodes={self.num_nodes}, num_edges={self.num_edges})"
        )


_PYG_NODE_KEYS = {"x", "y", "num_nodes", "train_mask", "val_mask", "test_mask"}
_PYG_EDGE_KEYS = {"edge_index", "edge_weight", "edge_attr"}


def _node_from_pyg(store, node_type: str, name: str) -> GraphData:
    scope = f"typed graph {name!r}: node type {node_type!r}"
    x = store.get("x")
    n = int(x.shape[0]) if x is not None else store.get("num_nodes")
    if n is None:
        raise GraphValidationError(f"{scope} has neither x nor num_nodes; set data[{node_type!r}].num_nodes")
    if x is not None and x.dim() != 2:
        raise GraphValidationError(f"{scope}: x has shape {tuple(x.shape)}, expected [num_nodes, F]")
    y = store.get("y")
    if y is not None and y.dim() != 1:
        raise GraphValidationError(f"{scope}: y has shape {tuple(y.shape)}, expected one label per node")
    split = None
    masks = {s: store.get(f"{s}_mask") for s in checks.SPLIT_NAMES}
    if any(m is not None for m in masks.values()):
        split = np.full(int(n), checks.NO_SPLIT, dtype="<U5")
        taken = np.zeros(int(n), bool)
        for split_name, mask in masks.items():
            if mask is None:
                continue
            rows = mask.detach().cpu().numpy().astype(bool)
            if (rows & taken).any():
                raise GraphValidationError(f"{scope}: {int((rows & taken).sum())} nodes are in more than one mask")
            split[rows] = split_name
            taken |= rows
    return node_table(
        np.arange(int(n), dtype=np.int64),
        None if x is None else x.detach().cpu().numpy(),
        y=None if y is None else y.detach().cpu().numpy(),
        split=split,
        name=f"{name}/{node_type}",
    )


def node_type_meta(node: GraphData, fingerprint: str, splits: dict | None = None) -> dict:
    """graph.json's entry for one node type."""
    meta = {
        "num_vertices": node.num_nodes,
        "feature_dim": node.feature_dim,
        "has_labels": node.has_labels,
        "has_split": node.split is not None,
        "num_classes": node.num_classes,
        "fingerprint": fingerprint,
    }
    if splits is not None:
        meta["splits"] = splits
    return meta


def edge_type_meta(num_edges: int, has_weight: bool, edge_attr_dim: int, fingerprint: str) -> dict:
    """graph.json's entry for one edge type."""
    return {
        "num_edges": int(num_edges),
        "has_weight": bool(has_weight),
        "edge_attr_dim": int(edge_attr_dim),
        "fingerprint": fingerprint,
    }


def is_typed_meta(meta: dict | None) -> bool:
    """True when graph.json describes a typed graph."""
    if not meta:
        return False
    return meta.get("format") == TYPED_FORMAT or "node_types" in meta


def typed_summary(meta: dict) -> str:
    """One line describing a typed graph from its graph.json content."""
    types = meta.get("types", {})
    nodes = ", ".join(
        f"{t} {types.get(t, {}).get('num_vertices', '?')}"
        + (f" x {types[t]['feature_dim']}-d" if types.get(t, {}).get("feature_dim") else "")
        for t in meta.get("node_types", [])
    )
    relations = meta.get("relations", {})
    edges = ", ".join(
        f"{k} {relations.get(k, {}).get('num_edges', '?')}" for k in (edge_key(tuple(et)) for et in meta["edge_types"])
    )
    return (
        f"{meta.get('name', 'graph')}: node types [{nodes}], edge types [{edges}], "
        f"{meta.get('num_vertices', '?')} vertices, {meta.get('num_edges', '?')} edges, "
        f"fingerprint {meta.get('fingerprint')}"
    )
