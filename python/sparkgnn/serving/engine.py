"""QueryEngine: one object that answers requests against G with one mode.

WHY an engine object: G's CSC index and cached statistics (ServingContext) are built once and
shared by every request; the mode is chosen by name from the registry (modes.MODES), and every
further keyword goes to the mode, so later modes (he, srpe, exact: gamma=, policy=,
partitions=) need no change here. `store` is handed to the context for the modes that read PEs.

WHY the engine verifies its store itself: a PEStore is verified when it is OPENED, for the model
and graph given to PEStore.open; nothing tied that pair to the engine's own model and G, so a
store opened for model A and handed to an engine for model B mixed A's embeddings into B's
layers and answered without a word. The engine therefore compares the store's manifest with its
own model's and G's fingerprints (the same comparison PEStore.open makes: pe.store's
manifest_problems) and refuses a mismatch with StalePEStore.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkgnn.errors import SparkGNNError, StalePEStore
from sparkgnn.layers.generic import require_states
from sparkgnn.planner.ir import Plan
from sparkgnn.planner.serving import ServingCostModel, explain_request
from sparkgnn.serving.context import ServingContext
from sparkgnn.serving.modes import Answer, get_mode
from sparkgnn.serving.request import Request

if TYPE_CHECKING:
    from sparkgnn.graph import Graph, GraphData
    from sparkgnn.models import Model
    from sparkgnn.pe import PEStore


class EngineSetupError(SparkGNNError, ValueError):
    """A QueryEngine is built from parts that do not belong together (a graph other than the one
    its shared context serves)."""


def _short(fingerprint: str) -> str:
    return str(fingerprint)[:12]


def verify_store(store, graph, model) -> None:
    """Raise StalePEStore unless `store`'s manifest describes a complete store for exactly this
    model (weights) and this graph G; the message names both short fingerprints and what differs."""
    from sparkgnn.pe.identity import graph_fingerprint, model_identity
    from sparkgnn.pe.store import manifest_problems

    where = getattr(store, "base", None) or repr(store)
    manifest = getattr(store, "manifest", None)
    if not isinstance(manifest, dict):
        raise StalePEStore(
            f"store {where} has no manifest to check against this engine's model and "
            f"graph; pass a store opened with sparkgnn.PEStore.open(path, model=..., graph=...)"
        )
    ident = model_identity(model)
    graph_fp = graph_fingerprint(graph)
    problems = manifest_problems(manifest, graph_fp, ident)
    if problems:
        raise StalePEStore(
            f"PE store {where} does not belong to this engine (model {_short(ident.fingerprint)}, "
            f"graph {_short(graph_fp)}; the store was computed for model "
            f"{_short(str(manifest.get('model_fingerprint')))} "
            f"on graph {_short(str(manifest.get('graph_fingerprint')))}): "
            + "; ".join(problems)
            + ". Open the store computed for this model and graph, or recompute it "
            "(spark_jobs/precompute_pe.py)"
        )


def verify_context_graph(graph, context: ServingContext) -> None:
    """An engine given both a graph and a shared context serves the context's G: refuse a graph
    that is another one (the caller would believe it is served)."""
    if graph is None or graph is context.graph:
        return
    from sparkgnn.pe.identity import graph_fingerprint

    mine, theirs = graph_fingerprint(graph), graph_fingerprint(context.graph)
    if mine != theirs:
        raise EngineSetupError(
            f"the shared context serves graph {_short(theirs)}, not the graph "
            f"{_short(mine)} given to this engine; build the engine without context="
        )


def verify_context_edge_values(model, context: ServingContext) -> None:
    """An engine shares a context only when both read the same per-edge values (edge attributes
    of one width, or weights): the context's edge lists carry one kind (ServingContext doc)."""
    if int(model.edge_attr_dim) != context.attr_dim:
        what = lambda width: f"edge attributes of width {width}" if width else "no edge attributes"  # noqa: E731
        raise EngineSetupError(
            f"the shared context carries {what(context.attr_dim)}, this engine's model reads "
            f"{what(int(model.edge_attr_dim))}; build the engine without context="
        )


def serving_graph(graph: GraphData | Graph | str | os.PathLike[str]) -> GraphData:
    """The in-memory GraphData a QueryEngine serves, from what `sparkgnn.infer` accepts as a graph:
    a GraphData as it is, a graph directory read with graph.reader, or a Spark `Graph` collected to
    the driver (Graph.to_graph_data). Anything else is refused with one line."""
    from sparkgnn.graph import GraphData

    if isinstance(graph, GraphData):
        return graph
    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph.reader import read_graph_dir

        return read_graph_dir(os.fspath(graph))
    if callable(getattr(graph, "to_graph_data", None)):  # a sparkgnn.Graph (Spark DataFrames)
        return graph.to_graph_data()
    raise EngineSetupError(
        f"cannot serve a {type(graph).__name__}: pass a GraphData, a sparkgnn.Graph or a graph directory"
    )


def serving_model(model: Model | str | os.PathLike[str]) -> Model:
    """A Model as it is, or a saved model directory loaded with Model.load; a typed one is refused
    (it is served by serving.typed.TypedQueryEngine). A model whose layers read edge attributes is
    served where G's edges carry them (ServingContext checks the width; requests carry theirs)."""
    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.models.hetero import refuse_typed

    try:
        refuse_typed(model, "the serving engines")
    except UnsupportedModelError:
        raise UnsupportedModelError(
            "the homogeneous serving engines do not serve a typed model (node and edge types): use "
            "sparkgnn.serving.typed.TypedQueryEngine (modes in serving.typed.TYPED_MODES)"
        ) from None
    if isinstance(model, (str, os.PathLike)):
        from sparkgnn.models import Model

        model = Model.load(os.fspath(model))
    return model


class QueryEngine:
    """Answers requests of new query nodes against the graph G (module doc).

    `graph`: G, as a GraphData, a Spark `sparkgnn.Graph` (collected to the driver) or a graph
    directory, like `sparkgnn.infer`; `model`: a Model or a saved model directory. Options after
    `model` are keyword-only: `mode` (a name in serving.MODES), `fanouts` and `seed` (sampling
    modes), `store` (an opened PEStore, checked against this model and G), `validate`, `context`
    (a ServingContext shared with other engines on the same G) and the mode's own options."""

    def __init__(
        self,
        graph: GraphData | Graph | str | os.PathLike[str],
        model: Model | str | os.PathLike[str],
        *,
        mode: str = "full",
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
        store: PEStore | None = None,
        validate: bool = True,
        context: ServingContext | None = None,
        **mode_options: Any,
    ):
        model = serving_model(model)
        graph = context.graph if context is not None and graph is None else serving_graph(graph)
        if context is not None:
            verify_context_graph(graph, context)
            verify_context_edge_values(model, context)
        self.context = context or ServingContext(graph, model, store=store, validate=validate)
        if fanouts is not None:
            mode_options["fanouts"] = fanouts
        if mode not in ("full", "ns"):
            require_states(model, f"serving mode {mode!r}")
        self.mode = get_mode(mode, model, seed=seed, **mode_options)
        # engines sharing one context (same G) may serve different stores
        self.mode.store = store if store is not None else self.context.store
        if self.mode.store is not None:
            verify_store(self.mode.store, self.context.graph, model)

    @property
    def mode_name(self) -> str:
        return self.mode.name

    def answer(self, request: Request) -> Answer:
        return self.mode.answer(self.context, request)

    def plan(self, request: Request, cost: ServingCostModel | None = None) -> Plan:
        """The request's plan in the planner's IR (planner.serving): operators per layer with
        estimates; for mode="auto" the chosen plan with every candidate's estimate."""
        return self.mode.plan(self.context, request, cost)

    def explain(self, request: Request, cost: ServingCostModel | None = None) -> str:
        """The request's plan as text, like the batch job's --explain."""
        return explain_request(self.plan(request, cost))
