"""QueryEngine: one object that answers requests against G with one mode.

WHY an engine object: G's CSC index and cached statistics (ServingContext) are built once and
shared by every request; the mode is chosen by name from the registry (modes.MODES), and every
further keyword goes to the mode, so later modes (he, srpe, exact: gamma=, policy=,
partitions=) need no change here. `store` is handed to the context for the modes that read PEs.
"""
from __future__ import annotations

from sparkgnn.serving.context import ServingContext
from sparkgnn.serving.modes import Answer, get_mode
from sparkgnn.serving.request import Request


class QueryEngine:
    def __init__(self, graph, model, mode: str = "full", fanouts=None, seed: int = 0, store=None,
                 validate: bool = True, context: ServingContext | None = None, **mode_options):
        self.context = context or ServingContext(graph, model, store=store, validate=validate)
        if fanouts is not None:
            mode_options["fanouts"] = fanouts
        self.mode = get_mode(mode, model, seed=seed, **mode_options)
        # engines sharing one context (same G) may serve different stores
        self.mode.store = store if store is not None else self.context.store

    @property
    def mode_name(self) -> str:
        return self.mode.name

    def answer(self, request: Request) -> Answer:
        return self.mode.answer(self.context, request)
