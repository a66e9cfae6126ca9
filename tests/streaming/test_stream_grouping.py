"""grouping: the cost estimate counts what its docstring says; degree = ascending cost packed up
to T_d with aging; fifo = arrival order; the registry refuses unknown names and options."""

import numpy as np
import pytest

from sparkgnn.graph import GraphData
from sparkgnn.serving import Request
from sparkgnn.streaming.grouping import (
    GROUPINGS,
    DegreeGrouping,
    GroupingError,
    RequestCost,
    get_grouping,
    run_schedule,
)
from sparkgnn.streaming.intake import Pending


def tiny_graph():
    # ids 10..15; in-degrees: 10:0, 11:1, 12:3, 13:1, 14:0, 15:0
    src = np.array([10, 10, 11, 13, 14], np.int64)
    dst = np.array([11, 12, 12, 12, 13], np.int64)
    ids = np.arange(10, 16, dtype=np.int64)
    return GraphData(ids, np.zeros((6, 2), np.float32), src - 10, dst - 10)


def test_cost_is_queries_plus_request_in_edges_plus_g_in_degrees_of_their_sources():
    g = tiny_graph()
    cost = RequestCost(g)
    # queries 100, 101; edges 12->100, 11->100, 101->100 (into queries), 100->13 (out of a query)
    r = Request(
        "r",
        np.array([100, 101]),
        np.zeros((2, 2), np.float32),
        np.array([12, 11, 101, 100]),
        np.array([100, 100, 100, 13]),
    )
    # B=2, 3 edges into queries, G in-degrees of G sources 12 (3) and 11 (1)
    assert cost(r) == 2 + 3 + 3 + 1
    unknown = Request("u", np.array([100]), np.zeros((1, 2), np.float32), np.array([999]), np.array([100]))
    assert cost(unknown) == 1 + 1 + 0


def pend(seq, cost, arrival=0.0):
    r = Request(f"r{seq}", np.array([1000 + seq]), np.zeros((1, 1), np.float32), np.empty(0), np.empty(0))
    return Pending(r, f"f{seq}", arrival, seq, cost=cost)


def groups_of(policy, queue, now=0.0):
    out = []
    run_schedule(policy, queue, lambda: now, lambda g, group: out.append([p.seq for p in group]))
    return out


def test_degree_grouping_sorts_by_cost_and_packs_up_to_threshold():
    queue = [pend(0, 50), pend(1, 5), pend(2, 20), pend(3, 5), pend(4, 200), pend(5, 30)]
    policy = get_grouping("degree", threshold=40, aging_s=1e9)
    # ascending cost (ties by arrival): 1(5) 3(5) 2(20) | 5(30) | 50 alone | 200 alone (over T_d)
    assert groups_of(policy, queue) == [[1, 3, 2], [5], [0], [4]]
    capped = get_grouping("degree", threshold=1e9, aging_s=1e9, max_requests=2)
    assert groups_of(capped, queue) == [[1, 3], [2, 5], [0, 4]]


def test_degree_grouping_ages_long_waiting_requests_to_the_front():
    queue = [pend(0, 1000, arrival=0.0), pend(1, 1, arrival=9.0), pend(2, 2, arrival=9.5)]
    policy = DegreeGrouping(threshold=10, aging_s=5.0)
    # at t=10 request 0 has waited 10 s >= 5 s: it goes first although it is the costliest
    assert groups_of(policy, queue, now=10.0) == [[0], [1, 2]]
    # at t=4 nobody is aged: pure cost order
    assert groups_of(policy, queue, now=4.0)[0] == [1, 2]


def test_aging_is_evaluated_when_each_group_is_chosen():
    queue = [pend(0, 100, arrival=0.0), pend(1, 1, arrival=0.0), pend(2, 1, arrival=0.0)]
    clock = iter([0.0, 6.0, 6.0, 6.0])
    order = []
    run_schedule(
        DegreeGrouping(threshold=1, aging_s=5.0),
        queue,
        lambda: next(clock),
        lambda g, group: order.append([p.seq for p in group]),
    )
    # first pick at t=0: cheapest (1); by t=6 everyone is aged -> arrival order: 0 then 2
    assert order == [[1], [0], [2]]


def test_fifo_is_arrival_order_in_fixed_groups():
    queue = [pend(3, 1), pend(0, 50), pend(2, 5), pend(1, 500)]
    assert groups_of(get_grouping("fifo"), queue) == [[0], [1], [2], [3]]
    assert groups_of(get_grouping("fifo", batch_size=3), queue) == [[0, 1, 2], [3]]


def test_registry_refuses_unknown_policies_and_options():
    assert {"degree", "fifo"} <= set(GROUPINGS)
    with pytest.raises(GroupingError, match="unknown grouping policy 'sjf'.*degree"):
        get_grouping("sjf")
    with pytest.raises(GroupingError, match=r"'fifo' does not take option\(s\) \['threshold'\]"):
        get_grouping("fifo", threshold=3)
    with pytest.raises(GroupingError, match="must be > 0"):
        get_grouping("degree", threshold=0)
