"""GraphData: a whole graph in memory as numpy arrays, with DENSE edge indices.

Why it exists next to the Spark `Graph`: datasets, tests, the PyG reference path and single-node
workers all want plain arrays (x as one C-contiguous float32 matrix, edges as 0..N-1 row
indices) without a JVM. Original ids are kept in `ids` so results can be joined back to the
caller's vertices and so the fingerprint matches the one Spark computes from the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import checks
from sparkgnn.graph.fingerprint import fingerprint_arrays
from sparkgnn.graph.index import IdIndex
from sparkgnn.graph.problems import Problem, fmt_ids, raise_if_any


def _as_1d(values, dtype, name: str, problems: list) -> np.ndarray:
    arr = np.ascontiguousarray(values, dtype=dtype)
    if arr.ndim != 1:
        problems.append(Problem("shape", 1, (f"{name} has shape {arr.shape}, expected 1-D",)))
    return arr


def _as_matrix(ids: np.ndarray, x, problems: list) -> np.ndarray:
    """x as C-contiguous float32 [N, F]. Ragged Python input is reported row by row (this loop runs
    only on the error path, over objects the caller already holds as Python rows)."""
    try:
        arr = np.ascontiguousarray(x, dtype=np.float32)
    except (ValueError, TypeError):
        rows = list(x)
        lengths = np.array([-1 if r is None else len(r) for r in rows], dtype=np.int64)
        nulls = lengths < 0
        if nulls.any():
            problems.append(Problem("null_x", int(nulls.sum()), fmt_ids(ids[checks.first_rows(nulls, ids)])))
        widths, counts = np.unique(lengths[~nulls], return_counts=True)
        expected = int(widths[np.argmax(counts)]) if len(widths) else 0
        wrong = ~nulls & (lengths != expected)
        if wrong.any():
            problems.append(
                Problem(
                    "x_width",
                    int(wrong.sum()),
                    tuple(f"id {ids[i]} (len {lengths[i]})" for i in checks.first_rows(wrong, ids)),
                    detail=str(expected),
                )
            )
        return np.zeros((len(rows), expected), np.float32)
    if arr.ndim != 2:
        problems.append(Problem("shape", 1, (f"x has shape {arr.shape}, expected [num_nodes, F]",)))
    return arr


@dataclass(eq=False)
class GraphData:
    """A graph in memory. Treat as immutable: derived values (index, fingerprint) are cached."""

    ids: np.ndarray
    x: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    weight: np.ndarray | None = None
    y: np.ndarray | None = None
    split: np.ndarray | None = None
    name: str = "graph"
    # [E, D] float32 edge attributes (PyG's edge_attr, D >= 1), or None
    edge_attr: np.ndarray | None = None

    def __post_init__(self):
        # Coerce to the documented dtypes; shape defects are kept and raised by validate() so
        # they are reported together with content defects.
        problems: list[Problem] = []
        self.ids = _as_1d(self.ids, np.int64, "ids", problems)
        self.x = _as_matrix(self.ids, self.x, problems)
        self.edge_src = _as_1d(self.edge_src, np.int64, "edge_src", problems)
        self.edge_dst = _as_1d(self.edge_dst, np.int64, "edge_dst", problems)
        if self.weight is not None:
            self.weight = _as_1d(self.weight, np.float32, "weight", problems)
        if self.y is not None:
            self.y = _as_1d(self.y, np.int64, "y", problems)
        if self.edge_attr is not None:
            self.edge_attr = np.ascontiguousarray(self.edge_attr, dtype=np.float32)
            if self.edge_attr.ndim == 1:  # one attribute per edge, as PyG accepts it
                self.edge_attr = self.edge_attr.reshape(-1, 1)
            if self.edge_attr.ndim != 2 or self.edge_attr.shape[1] < 1:
                shape = f"edge_attr has shape {self.edge_attr.shape}, expected [num_edges, D] with D >= 1"
                problems.append(Problem("shape", 1, (shape,)))
        if self.split is not None and np.asarray(self.split).dtype.kind != "U":
            split = np.array(self.split, dtype=object)
            split[np.equal(split, np.array(None, dtype=object))] = checks.NO_SPLIT
            self.split = split.astype(str)
        elif self.split is not None:
            self.split = np.asarray(self.split)
        self._shape_problems = problems + self._length_problems()

    def _length_problems(self) -> list[Problem]:
        n, e = len(self.ids), len(self.edge_src)
        expected = {
            "x": (self.x, n),
            "edge_dst": (self.edge_dst, e),
            "weight": (self.weight, e),
            "edge_attr": (self.edge_attr, e),
            "y": (self.y, n),
            "split": (self.split, n),
        }
        wrong = [
            f"{name} has {len(arr)} rows, expected {rows}"
            for name, (arr, rows) in expected.items()
            if arr is not None and len(arr) != rows
        ]
        return [Problem("shape", len(wrong), tuple(wrong))] if wrong else []

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_edge_ids(
        cls,
        ids,
        x,
        src,
        dst,
        weight=None,
        y=None,
        split=None,
        name: str = "graph",
        validate: bool = True,
        edge_attr=None,
    ) -> GraphData:
        """Build from edges given by ORIGINAL vertex ids (the GraphFrames convention); edges whose
        src or dst is not a vertex id are reported as dangling, with their original ids."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        src = np.ascontiguousarray(src, dtype=np.int64)
        dst = np.ascontiguousarray(dst, dtype=np.int64)
        index = IdIndex(ids)
        s, s_found = index.lookup(src)
        d, d_found = index.lookup(dst)
        data = cls(ids, x, s, d, weight=weight, y=y, split=split, name=name, edge_attr=edge_attr)
        data.__dict__["id_index"] = index
        if validate:
            data._validate(
                extra=[
                    checks.dangling("dangling_src", s_found, src, dst),
                    checks.dangling("dangling_dst", d_found, src, dst),
                ],
                src_ids=src,
                dst_ids=dst,
            )
        return data

    # --- validation ---------------------------------------------------------------------------
    def validate(self) -> GraphData:
        """Raise GraphValidationError listing every defect (count + first offenders); else self."""
        self._validate()
        return self

    def _validate(self, extra=(), src_ids=None, dst_ids=None) -> None:
        # Same order as the Spark path: vertex problems, then edge problems.
        raise_if_any(self._shape_problems, self.name)
        index_problem = checks.bad_dense_index(self.num_nodes, self.edge_src, self.edge_dst)
        if src_ids is None:
            src_ids, dst_ids = (self.src_ids, self.dst_ids) if index_problem is None else (self.edge_src, self.edge_dst)
        problems = [
            checks.duplicate_ids(self.id_index),
            checks.nonfinite_features(self.ids, self.x),
            checks.bad_labels(self.ids, self.y),
            checks.bad_splits(self.ids, self.split),
            index_problem,
            *extra,
            checks.bad_weights(self.weight, src_ids, dst_ids),
            checks.nonfinite_edge_attr(self.edge_attr, src_ids, dst_ids),
        ]
        raise_if_any([p for p in problems if p is not None], self.name)

    # --- sizes and metadata -------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(len(self.ids))

    @property
    def num_edges(self) -> int:
        return int(len(self.edge_src))

    @property
    def feature_dim(self) -> int:
        return int(self.x.shape[1]) if self.x.ndim == 2 else 0

    @property
    def has_weight(self) -> bool:
        return self.weight is not None

    @property
    def has_labels(self) -> bool:
        return self.y is not None

    @property
    def edge_attr_dim(self) -> int:
        """Width D of the edge attributes (0: the edges carry none)."""
        return int(self.edge_attr.shape[1]) if self.edge_attr is not None and self.edge_attr.ndim == 2 else 0

    @property
    def num_classes(self) -> int:
        """1 + the largest label (0 without labels); -1 marks unlabelled vertices."""
        return int(self.y.max()) + 1 if self.y is not None and len(self.y) and self.y.max() >= 0 else 0

    @cached_property
    def id_index(self) -> IdIndex:
        return IdIndex(self.ids)

    @cached_property
    def fingerprint(self) -> str:
        """Content hash (see fingerprint.py); equals the one write_graph_dir stores in graph.json."""
        return fingerprint_arrays(self.ids, self.x, self.src_ids, self.dst_ids, self.weight, self.edge_attr)

    @property
    def src_ids(self) -> np.ndarray:
        return self.ids[self.edge_src]

    @property
    def dst_ids(self) -> np.ndarray:
        return self.ids[self.edge_dst]

    # --- lookups --------------------------------------------------------------------------------
    def index_of(self, ids) -> np.ndarray:
        """Dense row index of each original id; unknown ids raise GraphValidationError."""
        query = np.asarray(ids, dtype=np.int64)
        idx, found = self.id_index.lookup(query)
        if not found.all():
            missing = query[~found]
            raise_if_any([Problem("unknown_id", len(missing), fmt_ids(missing))], self.name)
        return idx

    def mask(self, split_name: str) -> np.ndarray:
        """Boolean [N] mask of the vertices in split `split_name` (train, val or test)."""
        if split_name not in checks.SPLIT_NAMES:
            raise GraphValidationError(f"unknown split {split_name!r}; expected one of {checks.SPLIT_NAMES}")
        if self.split is None:
            raise GraphValidationError(f"graph {self.name!r} has no split column")
        return self.split == split_name

    def in_degree(self) -> np.ndarray:
        return np.bincount(self.edge_dst, minlength=self.num_nodes)

    def out_degree(self) -> np.ndarray:
        return np.bincount(self.edge_src, minlength=self.num_nodes)

    # --- conversions ----------------------------------------------------------------------------
    def edge_index_torch(self):
        """torch.LongTensor [2, E] of dense indices (PyG's edge_index). torch loads lazily so the
        graph package stays importable where torch is absent (e.g. a Spark driver)."""
        import torch

        return torch.from_numpy(np.stack([self.edge_src, self.edge_dst]))

    def to_pyg(self):
        """A torch_geometric.data.Data with x, edge_index, optional edge_weight, edge_attr, y and masks."""
        import torch
        from torch_geometric.data import Data

        data = Data(x=torch.from_numpy(self.x), edge_index=self.edge_index_torch(), num_nodes=self.num_nodes)
        if self.weight is not None:
            data.edge_weight = torch.from_numpy(self.weight)
        if self.edge_attr is not None:
            data.edge_attr = torch.from_numpy(self.edge_attr)
        if self.y is not None:
            data.y = torch.from_numpy(self.y)
        if self.split is not None:
            for split_name in checks.SPLIT_NAMES:
                data[f"{split_name}_mask"] = torch.from_numpy(self.mask(split_name))
        return data

    def meta(self) -> dict:
        """The graph.json document describing this graph."""
        return {
            "name": self.name,
            "num_vertices": self.num_nodes,
            "num_edges": self.num_edges,
            "feature_dim": self.feature_dim,
            "has_weight": self.has_weight,
            "has_labels": self.has_labels,
            "num_classes": self.num_classes,
            "fingerprint": self.fingerprint,
            **({"edge_attr_dim": self.edge_attr_dim} if self.edge_attr is not None else {}),
        }

    def summary(self) -> str:
        """One line for logs and the CLI."""
        deg = self.in_degree()
        max_in = int(deg.max()) if len(deg) else 0
        labels = f", {self.num_classes} classes" if self.has_labels else ""
        return (
            f"{self.name}: {self.num_nodes} vertices, {self.num_edges} edges, "
            f"{self.feature_dim}-d features{labels}, max in-degree {max_in}, "
            f"fingerprint {self.fingerprint}"
        )

    def __repr__(self) -> str:
        return (
            f"GraphData(name={self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
            f"feature_dim={self.feature_dim}, weight={self.has_weight}, labels={self.has_labels}"
            + (f", edge_attr_dim={self.edge_attr_dim})" if self.edge_attr is not None else ")")
        )
