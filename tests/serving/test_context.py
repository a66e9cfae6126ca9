"""ServingContext's index patched from an earlier version's context (`previous`, a delta swap):
equal, array for array, to the index built from scratch when the new graph only appends edges
(weighted or not, out-index included), and built from scratch when it does anything else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparkgnn.graph.updates import GraphUpdate, apply
from sparkgnn.serving.context import ServingContext, _appended_edges


def _indexes(context: ServingContext) -> list:
    context.out_neighbors(np.arange(2))
    return [context.indptr, context.in_src, context.in_weight, *context._out]


@pytest.mark.parametrize("weighted", [False, True])
def test_appended_edges_patch_the_index_to_the_one_built_from_scratch(skewed, weighted):
    rng = np.random.default_rng(3)
    G = dataclasses.replace(skewed, weight=rng.random(skewed.num_edges).astype(np.float32) if weighted else None)
    src, dst = rng.choice(G.ids, 40), rng.choice(G.ids[:5], 40)  # repeated destinations and sources
    weight = rng.random(40).astype(np.float32) if weighted else None
    G2 = apply(GraphUpdate(edge_insert_src=src, edge_insert_dst=dst, edge_insert_weight=weight), G).graph
    old = ServingContext(G, None)
    _indexes(old)
    assert _appended_edges(old, G2) == 40
    patched, fresh = _indexes(ServingContext(G2, None, previous=old)), _indexes(ServingContext(G2, None))
    for got, want in zip(patched, fresh, strict=True):
        assert (got is None and want is None) or np.array_equal(got, want)


def test_any_other_change_builds_the_index_from_scratch(skewed):
    G = dataclasses.replace(skewed, weight=None)
    old = ServingContext(G, None)
    deleted = apply(GraphUpdate(edge_delete_src=G.ids[G.edge_src[:1]], edge_delete_dst=G.ids[G.edge_dst[:1]]), G).graph
    assert _appended_edges(old, deleted) is None
    new_vertex = int(G.ids.max()) + 1
    grown = apply(
        GraphUpdate(
            vertex_insert_ids=np.array([new_vertex]),
            vertex_insert_x=np.zeros((1, G.feature_dim), np.float32),
            edge_insert_src=np.array([new_vertex]),
            edge_insert_dst=G.ids[:1],
        ),
        G,
    ).graph
    assert _appended_edges(old, grown) is None
    context = ServingContext(deleted, None, previous=old)
    assert np.array_equal(context.in_src, ServingContext(deleted, None).in_src)
