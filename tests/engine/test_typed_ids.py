"""The typed id walk (engine/typed_ids.py) over plain Python sets: the rows each round of a typed
model must give, back from requested (type, id) pairs; the hops per relation; typed --ids parsing.
No Spark: the Spark set operations run in tests/engine/test_infer_typed.py."""

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GCNConv, HeteroConv, Linear, SAGEConv, to_hetero

from sparkgnn.engine.typed_ids import parse_typed_ids, relation_hops, walk
from sparkgnn.errors import SparkGNNError
from sparkgnn.models.hetero import HeteroModel

WRITES = ("author", "writes", "paper")
WRITTEN_BY = ("paper", "written_by", "author")
CITES = ("paper", "cites", "paper")
#: a0 -> p0, a1 -> p1 (and back); p1 -> p0 -> ... p3 -> p2 -> p1 cites chain; a2, p4 isolated
EDGES = {
    WRITES: [(0, 0), (1, 1)],
    WRITTEN_BY: [(0, 0), (1, 1)],
    CITES: [(1, 0), (2, 1), (3, 2)],
}


class SetOps:
    """IdSetOps over frozensets and the EDGES lists."""

    def upstream(self, edge_type, ids, hops):
        if edge_type[0] != edge_type[2]:
            return frozenset(u for u, v in EDGES[edge_type] if v in ids)
        current = set(ids)
        for _ in range(hops):
            current |= {u for u, v in EDGES[edge_type] if v in current}
        return frozenset(current)

    def union(self, sets):
        return frozenset().union(*sets)

    def is_empty(self, ids):
        return not ids


def _data() -> HeteroData:
    d = HeteroData()
    d["paper"].x = torch.randn(5, 3)
    d["author"].x = torch.randn(3, 3)
    for edge_type, pairs in EDGES.items():
        d[edge_type].edge_index = torch.tensor(pairs).t()
    return d


class _Sage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = Linear(-1, 4)
        self.conv1 = SAGEConv((-1, -1), 4)
        self.conv2 = SAGEConv((-1, -1), 2)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(self.lin(x).relu(), edge_index).relu(), edge_index)


class _GcnCites(torch.nn.Module):
    """One HeteroConv round: GCN (a degree statistic, self loops) on cites, SAGE on the others."""

    def __init__(self):
        super().__init__()
        convs = {CITES: GCNConv(3, 4), WRITES: SAGEConv(3, 4), WRITTEN_BY: SAGEConv(3, 4)}
        self.conv = HeteroConv(convs, aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        return self.conv(x_dict, edge_index_dict)


def _model(module) -> HeteroModel:
    d = _data()
    torch.manual_seed(0)
    if isinstance(module, _Sage):
        module = to_hetero(module, d.metadata(), aggr="sum")
    module(d.x_dict, d.edge_index_dict)  # materialise lazy parameters
    return HeteroModel.from_pyg(module.eval(), d.metadata())


def test_two_rounds_walk_back_across_relations_with_root_terms():
    needs = walk(_model(_Sage()), {"paper": frozenset({0})}, SetOps())
    assert needs[2] == {"paper": {0}}
    # round 1 gives paper 0: its author (writes), itself and its citing paper (cites, one hop)
    assert needs[1] == {"paper": {0, 1}, "author": {0}}
    # round 0 gives papers 0, 1 (authors 0, 1; papers 0..2) and author 0 (paper 0 and itself)
    assert needs[0] == {"paper": {0, 1, 2}, "author": {0, 1}}


class RoundOps(SetOps):
    """SetOps answering a round's relations in one call, as the driver's walk fetches them."""

    def __init__(self):
        self.calls = []

    def upstream_many(self, asks):
        self.calls.append(sorted(edge_type for edge_type, _, _ in asks))
        return [self.upstream(*ask) for ask in asks]


def test_ops_with_upstream_many_walk_each_round_in_one_call_to_the_same_rows():
    ops = RoundOps()
    needs = walk(_model(_Sage()), {"paper": frozenset({0}), "author": frozenset({1})}, ops)
    assert needs == walk(_model(_Sage()), {"paper": frozenset({0}), "author": frozenset({1})}, SetOps())
    assert ops.calls == [sorted([WRITES, WRITTEN_BY, CITES])] * 2  # one per round, every relation in it


def test_an_author_request_reads_papers_only_through_written_by():
    needs = walk(_model(_Sage()), {"author": frozenset({1}), "paper": frozenset()}, SetOps())
    assert needs[2] == {"author": {1}}  # an empty request is dropped
    assert needs[1] == {"paper": {1}, "author": {1}}
    assert needs[0] == {"paper": {1, 2}, "author": {1}}


def test_a_statistic_reading_relation_walks_one_hop_further():
    model = _model(_GcnCites())
    hops = {edge_type: relation_hops(edge_type, conv) for edge_type, conv in model.round_list()[0].conv_items()}
    assert hops == {CITES: 2, WRITES: 1, WRITTEN_BY: 1}
    needs = walk(model, {"paper": frozenset({0})}, SetOps())
    # paper 1's degree (read by the conv at paper 0) needs paper 2, the source of its in-edge
    assert needs[0] == {"paper": {0, 1, 2}, "author": {0}}


def test_a_type_the_model_does_not_output_is_refused_in_one_line():
    with pytest.raises(SparkGNNError, match=r"^ids name node types \['venue'\] that are not outputs of the model"):
        walk(_model(_Sage()), {"venue": frozenset({0})}, SetOps())


def test_typed_ids_parse_inline_and_per_line_and_refuse_bad_items():
    assert parse_typed_ids("paper:3, paper:8\nauthor:1\n# comment\n") == {"paper": [3, 8], "author": [1]}
    assert parse_typed_ids("paper:-4") == {"paper": [-4]}
    for text, message in (
        ("paper3", r"^typed id 'paper3' is not type:id"),
        ("paper:x", r"^typed id 'paper:x': 'x' is not an integer id"),
        ("paper:99999999999999999999", "does not fit a 64-bit vertex id"),
        (" , ", "^--ids names no typed id"),
    ):
        with pytest.raises(SparkGNNError, match=message):
            parse_typed_ids(text)
