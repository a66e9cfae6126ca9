"""Grouping policies: in which order, and in which engine batches, a micro-batch's requests are
answered. A registry (GROUPINGS, by name) so the job, the benchmark and tests pick one by string.

Every request is still answered by QueryEngine.answer on its own (answers do not depend on the
policy); what a policy changes is WHEN each request is answered, i.e. its queueing time. A
micro-batch is answered group after group, and the next group is chosen only when the previous
one is done (`next_group(queue, now)`), so time-dependent rules (aging) see real waiting times.

    fifo    arrival order, fixed group size (GSM's "\\S" baseline: first come, first served).
    degree  GSM's degree-based scheduler (GSM section IV-A): the queue sorted by estimated cost
            (ascending), groups filled while the cost sum stays within T_d (a request costlier
            than T_d alone forms its own group), plus aging: a request that has waited at least
            `aging_s` since its file arrived goes ahead of every fresh one, oldest first. GSM
            names starvation of expensive requests as its scheduler's weakness and suggests
            promotion (MLFQ) as the remedy; this is the two-level version of that. Within one
            micro-batch every request is answered anyway, so aging bounds how long a large
            request can be pushed behind a stream of small ones once micro-batches get long.

The cost estimate (RequestCost), and why it is not GSM's plain in-degree: GSM predicts a batch's
time from the in-degree sum of its target vertices (its Observation 2). A request's targets are
NEW vertices whose in-edges are only the request's own edges: a handful per query, nearly the same
for every query, so the 1-hop in-degree mostly counts queries. The work of a k >= 2 layer model
is dominated by the next hop: the in-edges of the G vertices the queries attach to, which differ
by orders of magnitude on a skewed graph (a query linked to a hub pulls in the hub's whole
in-neighbourhood). So the estimate is
    cost = B + (request edges into the queries) + sum over those edges s -> q with s in G of deg_in_G(s)
i.e. the number of in-edges of the 2-hop computation graph, counted with multiplicity and without
the deeper hops. It is the GSM predictor applied one hop further, costs O(M) per request from G's
in-degree array (computed once), and needs no sampling, which GSM rejects as too expensive.
Unknown ids (requests that will be answered with an error row) contribute nothing. On a typed
graph (TypedRequestCost) a source's in-degree counts its in-edges of every relation.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import numpy as np

from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry

if TYPE_CHECKING:
    from sparkgnn.streaming.intake import Pending


class GroupingError(SparkGNNError, ValueError):
    """Unknown grouping policy or an option it does not take."""


GROUPINGS: Registry[type] = Registry("grouping policy", GroupingError)


def register_grouping(name: str):
    def deco(cls):
        cls.name = name
        return GROUPINGS.register(name, cls)

    return deco


def get_grouping(name: str, **options) -> GroupingPolicy:
    cls = GROUPINGS.lookup(name)
    accepted = [p for p in inspect.signature(cls).parameters]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise GroupingError(f"grouping {name!r} does not take option(s) {unknown}; it takes {accepted}")
    return cls(**options)


class RequestCost:
    """The cost estimate of the module doc, for requests against one graph G."""

    def __init__(self, graph):
        self.graph = graph
        self.in_degree = np.bincount(graph.edge_dst, minlength=graph.num_nodes).astype(np.int64)

    def __call__(self, request) -> float:
        into_q = np.isin(request.dst, request.qid)
        src = request.src[into_q]
        idx, in_g = self.graph.id_index.lookup(src)
        second_hop = int(self.in_degree[np.asarray(idx)[in_g]].sum()) if len(src) else 0
        return float(request.batch_size + int(into_q.sum()) + second_hop)


class TypedRequestCost:
    """RequestCost on a typed graph (serving.typed.TypedRequest against a TypedGraphData): the
    same sum, with each request edge s -> q into a query counted with the in-degree of s in G
    over every relation into the type of s."""

    def __init__(self, graph):
        self.graph = graph
        self.in_degree = {t: np.zeros(n.num_nodes, np.int64) for t, n in graph.nodes.items()}
        for et in graph.edge_types:
            _, dst = graph.edge_index(et)
            self.in_degree[et[2]] += np.bincount(dst, minlength=graph.nodes[et[2]].num_nodes).astype(np.int64)

    def __call__(self, request) -> float:
        cost = request.batch_size
        for (src_type, _, dst_type), (src, dst) in request.edges.items():
            queries = request.nodes.get(dst_type)
            if queries is None or src_type not in self.graph.nodes:
                continue
            into_q = np.isin(np.asarray(dst, np.int64), np.asarray(queries[0], np.int64))
            idx, in_g = self.graph.nodes[src_type].id_index.lookup(np.asarray(src, np.int64)[into_q])
            cost += int(into_q.sum()) + int(self.in_degree[src_type][np.asarray(idx)[in_g]].sum())
        return float(cost)


def request_cost(graph) -> RequestCost | TypedRequestCost:
    """The cost estimate for requests against `graph`: TypedRequestCost on a typed graph."""
    from sparkgnn.graph.typed import TypedGraphData

    return TypedRequestCost(graph) if isinstance(graph, TypedGraphData) else RequestCost(graph)


class GroupingPolicy:
    name = ""

    def next_group(self, queue: list, now: float) -> list:
        """The next non-empty group out of `queue` (a list of intake.Pending, left unchanged)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"grouping": self.name}


def _positive(value, what: str, integer: bool = False):
    try:
        v = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise GroupingError(f"{what} must be a number, got {value!r}") from None
    if v <= 0:
        raise GroupingError(f"{what} must be > 0, got {value!r}")
    return v


@register_grouping("fifo")
class FifoGrouping(GroupingPolicy):
    def __init__(self, batch_size: int = 1):
        self.batch_size = _positive(batch_size, "fifo batch_size", integer=True)

    def next_group(self, queue, now):
        return sorted(queue, key=lambda p: p.seq)[: self.batch_size]

    def describe(self):
        return {"grouping": self.name, "batch_size": self.batch_size}


@register_grouping("degree")
class DegreeGrouping(GroupingPolicy):
    def __init__(self, threshold: float = 100_000.0, aging_s: float = 30.0, max_requests: int | None = None):
        self.threshold = _positive(threshold, "degree threshold T_d")
        self.aging_s = _positive(aging_s, "aging_s")
        self.max_requests = None if max_requests is None else _positive(max_requests, "max_requests", integer=True)

    def next_group(self, queue, now):
        aged = sorted((p for p in queue if now - p.arrival_ts >= self.aging_s), key=lambda p: p.seq)
        aged_ids = {id(p) for p in aged}
        fresh = sorted((p for p in queue if id(p) not in aged_ids), key=lambda p: (p.cost, p.seq))
        group: list[Pending] = []
        total = 0.0
        for p in aged + fresh:
            if group and (
                total + p.cost > self.threshold or (self.max_requests is not None and len(group) >= self.max_requests)
            ):
                break
            group.append(p)
            total += p.cost
        return group

    def describe(self):
        return {
            "grouping": self.name,
            "threshold": self.threshold,
            "aging_s": self.aging_s,
            "max_requests": self.max_requests,
        }


def run_schedule(policy: GroupingPolicy, queue: list, clock, serve) -> None:
    """Answer `queue` group by group: pick a group at clock(), call serve(group_index, group),
    repeat until the queue is empty."""
    remaining = list(queue)
    g = 0
    while remaining:
        group = policy.next_group(remaining, clock())
        if not group:
            raise GroupingError(
                f"policy {policy.name!r} returned an empty group for a queue of {len(remaining)} requests"
            )
        taken = {id(p) for p in group}
        remaining = [p for p in remaining if id(p) not in taken]
        serve(g, group)
        g += 1
