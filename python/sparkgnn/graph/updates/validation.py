"""Validation of a GraphUpdate against a GraphData: every reason the update cannot be applied.

* Validation finds EVERY problem and raises one GraphUpdateError before anything is applied: a
  half-applied update leaves a graph that matches neither snapshot nor any embedding store, and a
  producer fixes its data in one round trip. Rules that could be relaxed are refused because they
  hide mistakes or break bookkeeping: re-inserting a deleted id (an id kept across snapshots must
  mean the same vertex, so the refresh can reuse its state), deleting an edge of a vertex the
  update deletes (the vertex delete already removes it; counting it twice would remove another).
* One edge_delete row removes ONE occurrence of its (src, dst) pair: graphs may be multigraphs, and
  each parallel edge is a separate message in a GNN aggregation. Removing all of them would change
  aggregates the producer did not mean to touch, and count semantics keep deletes symmetric with
  inserts (insert k copies, delete k copies). A weight, when given, picks an occurrence of exactly
  that weight; without one the first remaining occurrences in the graph's edge order go.

resolve() is validate() returning what it found (Resolved: deleted rows, endpoint rows, the edges
the deletes pick), so applying.py looks nothing up twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkgnn.graph import checks
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.index import IdIndex
from sparkgnn.graph.problems import MAX_EXAMPLES, fmt_edge, fmt_edge_weight, fmt_ids
from sparkgnn.graph.updates.format import (
    EDGE_DELETE,
    EDGE_INSERT,
    FEATURE_UPDATE,
    VERTEX_DELETE,
    VERTEX_INSERT,
    GraphUpdate,
    UpdateProblem,
    make_problem,
    no_ids,
    raise_if_any,
)


@dataclass
class Endpoints:
    """Where each endpoint id of an edge insert lands: a row of the graph (in_graph) or a position
    among the inserted vertices (in_inserts)."""

    graph_rows: np.ndarray
    in_graph: np.ndarray
    insert_positions: np.ndarray
    in_inserts: np.ndarray


@dataclass
class Resolved:
    """What validation found out that apply() needs, so nothing is looked up twice."""

    deleted: np.ndarray  # bool [N]: graph rows deleted by the update
    feature_update_rows: np.ndarray  # graph row of each feature_update
    insert_src: Endpoints
    insert_dst: Endpoints
    deleted_edges: np.ndarray  # positions in the graph's edge arrays removed by edge_delete rows


def validate(update: GraphUpdate, graph: GraphData) -> None:
    """Raise one GraphUpdateError listing every reason `update` cannot be applied to `graph`
    (counts and the first offending ids); return None when it can."""
    resolve(update, graph)


def resolve(update: GraphUpdate, graph: GraphData) -> Resolved:
    """validate()'s work, keeping what it found for apply(): every id resolved to its row, or one
    GraphUpdateError listing every problem."""
    index = graph.id_index
    problems: list[UpdateProblem | None] = []

    deleted_ids = update.vertex_delete_ids
    deleted_rows, deleted_found = index.lookup(deleted_ids)
    problems += [
        _id_problem("unknown_id", VERTEX_DELETE, deleted_ids, ~deleted_found),
        _repeated(VERTEX_DELETE, deleted_ids),
    ]
    deleted = np.zeros(graph.num_nodes, bool)
    deleted[deleted_rows[deleted_found]] = True

    inserted_ids = update.vertex_insert_ids
    rows, found = index.lookup(inserted_ids)
    problems += [
        _id_problem("existing_id", VERTEX_INSERT, inserted_ids, found & ~deleted[rows]),
        _id_problem(
            "deleted_id",
            VERTEX_INSERT,
            inserted_ids,
            found & deleted[rows],
            hint=" (a vertex cannot be deleted and re-inserted in one update)",
        ),
        _repeated(VERTEX_INSERT, inserted_ids),
        *_feature_problems(VERTEX_INSERT, inserted_ids, update.vertex_insert_x, graph.feature_dim),
    ]

    insert_index = IdIndex(inserted_ids)
    updated_ids = update.feature_update_ids
    feature_update_rows, found = index.lookup(updated_ids)
    inserted_too = ~found & insert_index.lookup(updated_ids)[1]
    problems += [
        _id_problem(
            "unknown_id",
            FEATURE_UPDATE,
            updated_ids,
            ~found,
            hint=" (an inserted vertex takes its x from its vertex_insert row)" if inserted_too.any() else "",
        ),
        _id_problem("deleted_id", FEATURE_UPDATE, updated_ids, found & deleted[feature_update_rows]),
        _repeated(FEATURE_UPDATE, updated_ids),
        *_feature_problems(FEATURE_UPDATE, updated_ids, update.feature_update_x, graph.feature_dim),
    ]

    insert_src = _insert_endpoints(index, insert_index, update.edge_insert_src)
    insert_dst = _insert_endpoints(index, insert_index, update.edge_insert_dst)
    problems += _edge_insert_problems(update, graph, deleted, insert_src, insert_dst)

    deleted_edges, delete_problems = _edge_deletes(update, graph, deleted)
    problems += delete_problems

    raise_if_any(problems, f"update of graph {graph.name!r}")
    return Resolved(deleted, feature_update_rows, insert_src, insert_dst, deleted_edges)


def _id_problem(defect: str, kind: str, ids: np.ndarray, bad: np.ndarray, hint: str = "") -> UpdateProblem | None:
    count = int(bad.sum())
    return make_problem(defect, count, fmt_ids(ids[checks.first_rows(bad, ids)]), kind, hint=hint) if count else None


def _repeated(kind: str, ids: np.ndarray) -> UpdateProblem | None:
    values, counts = IdIndex(ids).duplicates()
    if not len(values):
        return None
    examples = [f"{v} (x{c})" for v, c in zip(values[:MAX_EXAMPLES], counts[:MAX_EXAMPLES], strict=True)]
    return make_problem("repeated_id", len(values), examples, kind)


def _feature_problems(kind: str, ids: np.ndarray, x: np.ndarray, width: int) -> list[UpdateProblem | None]:
    if not len(ids):
        return []
    wrong_width = None
    if x.shape[1] != width:
        every = np.ones(len(ids), bool)
        wrong_width = make_problem(
            "x_width", len(ids), fmt_ids(ids[checks.first_rows(every, ids)]), kind, width=x.shape[1], expected=width
        )
    nonfinite = ~np.isfinite(x).all(axis=1)
    return [wrong_width, _id_problem("x_nonfinite", kind, ids, nonfinite)]


def _insert_endpoints(graph_index: IdIndex, insert_index: IdIndex, ids: np.ndarray) -> Endpoints:
    graph_rows, in_graph = graph_index.lookup(ids)
    insert_positions, in_inserts = insert_index.lookup(ids)
    return Endpoints(graph_rows, in_graph, insert_positions, in_inserts)


def _edge_examples(bad: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None = None) -> list:
    rows = checks.first_rows(bad, src, dst)
    if weight is None:
        return [fmt_edge(src[i], dst[i]) for i in rows]
    return [fmt_edge_weight(src[i], dst[i], weight[i]) for i in rows]


def _edge_problem(defect, kind, bad, src, dst, weight=None, hint: str = "", **detail) -> UpdateProblem | None:
    count = int(bad.sum())
    examples = _edge_examples(bad, src, dst, weight)
    return make_problem(defect, count, examples, kind, hint=hint, **detail) if count else None


def _edge_insert_problems(update, graph, deleted, src: Endpoints, dst: Endpoints) -> list:
    s, d, weight = update.edge_insert_src, update.edge_insert_dst, update.edge_insert_weight
    if not len(s):
        return []
    unknown = (~src.in_graph & ~src.in_inserts) | (~dst.in_graph & ~dst.in_inserts)
    gone = (src.in_graph & deleted[src.graph_rows] & ~src.in_inserts) | (
        dst.in_graph & deleted[dst.graph_rows] & ~dst.in_inserts
    )
    problems = [
        _edge_problem(
            "unknown_endpoint",
            EDGE_INSERT,
            unknown,
            s,
            d,
            hint="neither a vertex of the graph nor inserted by this update",
        ),
        _edge_problem("deleted_endpoint", EDGE_INSERT, gone, s, d),
    ]
    given = ~np.isnan(weight) if weight is not None else np.zeros(len(s), bool)
    if graph.has_weight:
        bad = given & (~np.isfinite(weight) | (weight < 0)) if weight is not None else given
        problems += [
            _edge_problem("missing_weight", EDGE_INSERT, ~given, s, d),
            _edge_problem("bad_weight", EDGE_INSERT, bad, s, d, weight),
        ]
    else:
        problems.append(_edge_problem("unexpected_weight", EDGE_INSERT, given, s, d, weight))
    return problems + _edge_attr_problems(update.edge_insert_attr, graph.edge_attr_dim, s, d)


def _edge_attr_problems(attr: np.ndarray | None, width: int, s: np.ndarray, d: np.ndarray) -> list:
    """Inserted edges' attributes against the graph's: required (of its width, finite) iff the
    graph's edges carry them, refused otherwise."""
    every = np.ones(len(s), bool)
    if not width:
        return [] if attr is None else [_edge_problem("unexpected_edge_attr", EDGE_INSERT, every, s, d)]
    if attr is None:
        return [_edge_problem("missing_edge_attr", EDGE_INSERT, every, s, d, expected=width)]
    if attr.shape[1] != width:
        rows = checks.first_rows(every, s, d)
        examples = [fmt_edge(s[i], d[i]) for i in rows]
        return [make_problem("edge_attr_width", len(s), examples, EDGE_INSERT, width=attr.shape[1], expected=width)]
    return [_edge_problem("edge_attr_nonfinite", EDGE_INSERT, ~np.isfinite(attr).all(axis=1), s, d)]


def _edge_deletes(update: GraphUpdate, graph: GraphData, deleted: np.ndarray) -> tuple[np.ndarray, list]:
    """(positions in the graph's edge arrays that the edge_delete rows remove, problems)."""
    s, d, weight = update.edge_delete_src, update.edge_delete_dst, update.edge_delete_weight
    if not len(s):
        return no_ids(), []
    src_rows, src_found = graph.id_index.lookup(s)
    dst_rows, dst_found = graph.id_index.lookup(d)
    unknown = ~src_found | ~dst_found
    gone = (src_found & deleted[src_rows]) | (dst_found & deleted[dst_rows])
    given = ~np.isnan(weight) if weight is not None else np.zeros(len(s), bool)
    problems = [
        _edge_problem("unknown_endpoint", EDGE_DELETE, unknown, s, d, hint="not a vertex of the graph"),
        _edge_problem(
            "deleted_endpoint", EDGE_DELETE, gone, s, d, hint=" (deleting a vertex already removes its edges)"
        ),
    ]
    if not graph.has_weight:
        problems.append(_edge_problem("unexpected_weight", EDGE_DELETE, given, s, d, weight))
        given = np.zeros(len(s), bool)
    matchable = ~unknown & ~gone
    removed, short = _match_deletes(graph, src_rows, dst_rows, weight, given, matchable)
    if len(short[0]):
        problems.append(make_problem("too_many_deletes", len(short[0]), _short_examples(short, graph), EDGE_DELETE))
    return removed, problems


def _group_ids(*segments: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """Dense group ids (0..G-1, in key order) for rows of several segments that share the same key
    columns: equal keys, equal id, across segments. One lexsort of all rows."""
    sizes = [len(seg[0]) for seg in segments]
    keys = [np.concatenate([seg[k] for seg in segments]) for k in range(len(segments[0]))]
    order = np.lexsort(keys[::-1])
    starts = np.ones(len(order), bool)
    if len(order):
        starts[1:] = np.any([k[order][1:] != k[order][:-1] for k in keys], axis=0)
    group = np.empty(len(order), np.int64)
    group[order] = np.cumsum(starts) - 1
    return np.split(group, np.cumsum(sizes)[:-1])


def _first_of_group(group: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Bool mask of the first wanted[g] rows (in array order) of each group g."""
    order = np.argsort(group, kind="stable")
    sizes = np.bincount(group, minlength=len(wanted))
    starts = np.cumsum(sizes) - sizes
    rank = np.empty(len(group), np.int64)
    rank[order] = np.arange(len(group)) - starts[group[order]]
    return rank < wanted[group]


def _match_deletes(graph, src_rows, dst_rows, weight, given, matchable) -> tuple[np.ndarray, list]:
    """Pick the graph edge each matchable delete row removes: first the deletes with a weight, each
    taking an occurrence of exactly that weight, then the deletes without one, each taking any
    remaining occurrence; in both the earliest occurrences in the graph's edge order go.

    Returns (removed edge positions, ascending; the _shortages() arrays of every (src, dst[, weight])
    group with more deletes than occurrences)."""
    n = graph.num_nodes
    # Only edges whose src and dst both appear among the deletes can match (two gathers, no sort).
    is_src, is_dst = np.zeros(n, bool), np.zeros(n, bool)
    is_src[src_rows[matchable]] = True
    is_dst[dst_rows[matchable]] = True
    candidates = np.flatnonzero(is_src[graph.edge_src] & is_dst[graph.edge_dst])

    def pair(src, dst):
        # One int64 key per (src, dst) pair while n * n fits; two key columns beyond.
        return (src * n + dst,) if n <= 3_037_000_499 else (src, dst)

    cand_pair = pair(graph.edge_src[candidates], graph.edge_dst[candidates])
    shortages = []
    taken_by_weight = np.zeros(len(candidates), bool)
    with_weight = np.flatnonzero(matchable & given)
    if len(with_weight):
        # -0.0 + 0.0 is 0.0: "exactly equal" weights must also group together bitwise-different zeros.
        cand_weight = graph.weight[candidates] + np.float32(0)
        del_weight = weight[with_weight] + np.float32(0)
        cand_group, del_group = _group_ids(
            (*cand_pair, cand_weight), (*pair(src_rows[with_weight], dst_rows[with_weight]), del_weight)
        )
        groups = int(max(cand_group.max(initial=-1), del_group.max(initial=-1))) + 1
        wanted = np.bincount(del_group, minlength=groups)
        present = np.bincount(cand_group, minlength=groups)
        taken_by_weight = _first_of_group(cand_group, wanted)
        shortages.append(_shortages(del_group, wanted, present, with_weight, src_rows, dst_rows, weight))

    without_weight = np.flatnonzero(matchable & ~given)
    removed = candidates[taken_by_weight]
    if len(without_weight):
        remaining = ~taken_by_weight
        remaining_group, any_group, weighted_group, taken_group = _group_ids(
            tuple(k[remaining] for k in cand_pair),
            pair(src_rows[without_weight], dst_rows[without_weight]),
            pair(src_rows[with_weight], dst_rows[with_weight]),
            tuple(k[taken_by_weight] for k in cand_pair),
        )
        groups = 1 + max(int(g.max(initial=-1)) for g in (remaining_group, any_group, weighted_group, taken_group))
        wanted = np.bincount(any_group, minlength=groups)
        available = np.bincount(remaining_group, minlength=groups)
        removed = np.sort(np.concatenate([removed, candidates[remaining][_first_of_group(remaining_group, wanted)]]))
        # Shown as totals of the pair: every delete of it (with or without weight), every occurrence.
        all_deletes = wanted + np.bincount(weighted_group, minlength=groups)
        all_present = available + np.bincount(taken_group, minlength=groups)
        over = wanted > available
        shortages.append(
            _shortages(any_group, np.where(over, all_deletes, 0), all_present, without_weight, src_rows, dst_rows)
        )
    if not shortages:
        return removed, [np.empty(0, np.int64)] * 5
    return removed, [np.concatenate(columns) for columns in zip(*shortages, strict=True)]


def _shortages(group, deletes, present, delete_rows, src_rows, dst_rows, weight=None) -> list[np.ndarray]:
    """[src rows, dst rows, weights (NaN: none), deletes, present], one entry per group whose
    deletes exceed its occurrences (with the group's first delete row as the example)."""
    groups, first = np.unique(group, return_index=True)
    over = deletes[groups] > present[groups]
    rows, groups = delete_rows[first[over]], groups[over]
    weights = weight[rows] if weight is not None else np.full(len(rows), np.nan, np.float32)
    return [src_rows[rows], dst_rows[rows], weights, deletes[groups], present[groups]]


def _short_examples(short: list[np.ndarray], graph: GraphData) -> list[str]:
    src, dst, weight, deletes, present = short
    src_ids, dst_ids = graph.ids[src], graph.ids[dst]
    examples = []
    for i in checks.first_rows(np.ones(len(src), bool), src_ids, dst_ids):
        s, d = src_ids[i], dst_ids[i]
        edge = fmt_edge(s, d) if np.isnan(weight[i]) else fmt_edge_weight(s, d, weight[i])
        examples.append(f"{edge} deleted {deletes[i]}x, present {present[i]}x")
    return examples
