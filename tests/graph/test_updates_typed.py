"""Typed graph updates (graph/updates/typed.py): applied to a typed graph they give the graph a
producer would write by hand (per type and relation: deletes before inserts, one occurrence per
edge delete, a vertex delete removing its edges in every relation); they round-trip through their
folder format; bad updates are refused in one line naming the type or relation, the graph
untouched."""

import os
import sys

import numpy as np
import pytest

from sparkgnn.errors import GraphUpdateError, OutputError
from sparkgnn.graph import TypedEdges, TypedGraphData
from sparkgnn.graph.typed import node_table
from sparkgnn.graph.updates import GraphUpdate, TypedGraphUpdate, apply_typed, validate_typed

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import CITES, TOPIC, TOPIC_OF, WRITES, WRITTEN_BY, pyg_data, typed_graph, typed_update  # noqa: E402


def test_apply_gives_the_updated_typed_graph_and_its_row_mappings():
    graph, update = typed_graph(pyg_data()), typed_update()
    before = graph.fingerprint
    applied = apply_typed(update, graph)
    new = applied.graph
    assert graph.fingerprint == before  # the old graph is untouched
    paper = graph.nodes["paper"]
    x = np.concatenate([paper.x[[0, 1, 2, 3, 4, 5, 7]], update.nodes["paper"].vertex_insert_x])
    x[1] = update.nodes["paper"].feature_update_x[0]
    author = graph.nodes["author"]
    expected = TypedGraphData(
        {
            "paper": node_table([3, 8, 13, 18, 23, 28, 38, 100], x),
            "author": node_table(
                [0, 1, 2, 4, 5, 50], np.concatenate([author.x[[0, 1, 2, 4, 5]], update.nodes["author"].vertex_insert_x])
            ),
            "field": node_table([0, 1, 2, 3, 9]),
        },
        {
            WRITES: TypedEdges([0, 1, 2, 4, 4, 50, 0], [3, 8, 13, 23, 28, 100, 13]),
            WRITTEN_BY: TypedEdges([3, 3, 8, 13, 23, 28, 100], [0, 0, 1, 2, 4, 4, 50]),
            CITES: TypedEdges([3, 8, 13, 18, 18, 28, 100, 23], [8, 13, 13, 23, 23, 28, 13, 100]),
            TOPIC: TypedEdges([3, 8, 13, 18, 23, 28, 100], [0, 0, 1, 1, 2, 2, 9]),
            TOPIC_OF: TypedEdges([0, 0, 1, 1, 2, 2, 9], [3, 8, 13, 18, 23, 28, 100]),
        },
    )
    assert new.fingerprint == expected.fingerprint
    assert new.metadata() == graph.metadata()
    assert new.nodes["paper"].ids.tolist() == [3, 8, 13, 18, 23, 28, 38, 100]
    assert applied.old_rows["paper"].tolist() == [0, 1, 2, 3, 4, 5, 7, -1]
    assert applied.new_rows["author"].tolist() == [0, 1, 2, -1, 3, 4]
    assert {t: rows.tolist() for t, rows in applied.feature_changed.items()} == {
        "paper": [1, 7],
        "author": [5],
        "field": [4],
    }
    # writes lost 0 -> 3 (paper row 0) and 3 -> 18 (row 3), gained -> 100 (row 7) and -> 13 (row 2)
    assert applied.edge_changed_dst[WRITES].tolist() == [0, 2, 3, 7]
    assert applied.edge_changed_dst[TOPIC_OF].tolist() == [7]
    assert applied.edge_changed_dst[CITES].tolist() == [0, 2, 7]  # 33 -> 3 gone with paper 33


def test_the_folder_format_round_trips(tmp_path):
    graph, update = typed_graph(pyg_data()), typed_update()
    path = update.write(tmp_path / "update")
    assert sorted(os.listdir(path)) == ["edges", "vertices"]
    assert sorted(os.listdir(os.path.join(path, "edges")))[0] == "author__writes__paper"
    again = TypedGraphUpdate.read(path)
    assert again.counts() == update.counts()
    assert apply_typed(again, graph).graph.fingerprint == apply_typed(update, graph).graph.fingerprint
    with pytest.raises(OutputError, match="already exists"):
        update.write(path)
    os.makedirs(tmp_path / "odd" / "edges" / "paper_cites")
    with pytest.raises(GraphUpdateError, match=r"edges/paper_cites does not name <src>__<relation>__<dst>"):
        TypedGraphUpdate.read(tmp_path / "odd")


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (
            TypedGraphUpdate({"venue": GraphUpdate(vertex_delete_ids=[1])}),
            r"node type 'venue' is unknown \(node types: paper, author, field\)",
        ),
        (
            TypedGraphUpdate(
                edges={("paper", "likes", "paper"): GraphUpdate(edge_insert_src=[3], edge_insert_dst=[8])}
            ),
            r"relation paper__likes__paper is unknown",
        ),
        (  # author 40 does not exist (paper 3 does: ids are per type)
            TypedGraphUpdate(edges={WRITES: GraphUpdate(edge_insert_src=[3, 40], edge_insert_dst=[3, 3])}),
            r"relation author__writes__paper: edge_insert: 1 edges have an endpoint that is neither a vertex of "
            r"type 'author' in the graph nor inserted by this update \(their source\); first: \(40 -> 3\)",
        ),
        (
            TypedGraphUpdate(
                {"author": GraphUpdate(vertex_delete_ids=[0])},
                {WRITES: GraphUpdate(edge_insert_src=[0], edge_insert_dst=[3])},
            ),
            r"relation author__writes__paper: edge_insert: 1 edges have an endpoint deleted by this update "
            r"\(their 'author' source\)",
        ),
        (
            TypedGraphUpdate({"paper": GraphUpdate(vertex_insert_ids=[8], vertex_insert_x=np.zeros((1, 6)))}),
            r"node type 'paper': vertex_insert: 1 ids are already vertices of the graph; first: 8",
        ),
        (
            TypedGraphUpdate({"field": GraphUpdate(feature_update_ids=[0], feature_update_x=np.zeros((1, 2)))}),
            r"node type 'field': feature_update: 1 rows have x of width 2, the graph's features have width 0",
        ),
        (
            TypedGraphUpdate(edges={CITES: GraphUpdate(edge_delete_src=[8, 8, 8], edge_delete_dst=[13, 13, 13])}),
            r"relation paper__cites__paper: edge_delete: 1 edges are deleted more times than the graph holds them; "
            r"first: \(8 -> 13\) deleted 3x, present 2x",
        ),
    ],
)
def test_bad_updates_are_refused_in_one_line_naming_the_type(update, message):
    import re

    graph = typed_graph(pyg_data())
    before = graph.fingerprint
    with pytest.raises(GraphUpdateError) as info:
        validate_typed(update, graph)
    assert "\n" not in str(info.value)
    assert re.search(message, str(info.value)), str(info.value)
    assert graph.fingerprint == before


def test_rows_of_the_wrong_group_are_refused():
    with pytest.raises(GraphUpdateError, match=r"node type 'paper': edge_insert rows belong to a relation's update"):
        TypedGraphUpdate({"paper": GraphUpdate(edge_insert_src=[3], edge_insert_dst=[8])})
    with pytest.raises(GraphUpdateError, match=r"relation paper__cites__paper: vertex_delete rows belong to a node"):
        TypedGraphUpdate(edges={CITES: GraphUpdate(vertex_delete_ids=[3])})
