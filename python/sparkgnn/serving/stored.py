"""StoredLayers: a PE store's h^(l) and merged states, aligned to G's dense vertex index.

WHY aligned arrays: the serving modes that reuse PEs (HE, SRPE, EXACT) look up a few thousand
rows per request and layer; G's serving index is dense (0..N-1), the store is keyed by original
id in whatever order Spark wrote it. Mapping every id once when the engine starts (one vectorised
search per layer, which also proves that the store covers every vertex of G) turns each later
lookup into a plain row gather, and a store that misses vertices fails at start-up, not in the
middle of a request.

Layer 0 is G's raw features passed through the model's node-wise `pre` ops, so "the value of v
at layer l-1" means the same thing for every l. Only the layers serving can use are loaded:
h^(1..k-1) (inputs of layers 2..k) and, when asked for, states 1..k-1 (the last layer is only ever
computed for queries, which have no stored state).

`cache` (empty unless serving.online.hotcache.attach_hot_cache filled it) maps ("h", layer) or
("state", layer) to a HotRows that holds the hottest rows of that array in the fastest memory; a
lookup then goes through it. Answers are the same bytes either way (HotRows copies rows, never
recomputes them), and bytes_fetched still counts every row handed out, hit or miss, so a request's
breakdown does not depend on the cache (its hits and misses are in hotcache.cache_stats).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import torch

from sparkgnn.errors import SparkGNNError
from sparkgnn.serving.context import Meter

if TYPE_CHECKING:
    from sparkgnn.serving.online.hotcache import HotRows

_PRE_LOCK = threading.Lock()  # pre(x) is computed once however many threads ask for it at once


class StoreMismatch(SparkGNNError, ValueError):
    """The PE store cannot serve this mode (no states, or it does not cover G's vertices)."""


class StoredLayers:
    def __init__(self, store, graph, model, states: bool):
        k = model.num_rounds
        self.num_layers = k
        self.graph = graph
        self.model = model
        self._pre_x: np.ndarray | None = None
        self.h: dict[int, np.ndarray] = {}
        self.state: dict[int, np.ndarray] = {}
        self.cache: dict[tuple[str, int], HotRows] = {}
        self.cache_policy: str | None = None  # the policy that filled `cache` (for its stats)
        if states and not store.with_states:
            raise StoreMismatch(
                f"{store!r} was written without partial aggregation states; SRPE "
                f"and EXACT recompute from them (rerun precompute with states)"
            )
        for l in range(1, k):
            # rows in G's order; raises UnknownIds naming the vertices the store lacks
            h, state = store.lookup(graph.ids, l, states=states)
            self.h[l] = np.ascontiguousarray(h)
            if states:
                self.state[l] = np.ascontiguousarray(state)

    @classmethod
    def from_arrays(
        cls, graph, model, h: dict[int, np.ndarray], state: dict[int, np.ndarray] | None = None
    ) -> StoredLayers:
        """StoredLayers over arrays already aligned to `graph`'s dense index (h^(l) and, when
        given, states, for l = 1..k-1), without reading a store: what a delta swap builds from
        the served version's arrays with the rows a store version changed patched in
        (serving.online.delta). Refuses arrays of another row count or layer set (one line)."""
        k = model.num_rounds
        state = state or {}
        want = set(range(1, k))
        if set(h) != want or (state and set(state) != want):
            raise StoreMismatch(f"aligned layers {sorted(h)} / states {sorted(state)}: layers {sorted(want)} wanted")
        for name, arrays in (("h", h), ("state", state)):
            for l, a in arrays.items():
                if a.ndim != 2 or a.shape[0] != graph.num_nodes:
                    raise StoreMismatch(f"aligned {name}^({l}) has shape {a.shape}, not {graph.num_nodes} rows")
        self = cls.__new__(cls)
        self.num_layers = k
        self.graph = graph
        self.model = model
        self._pre_x = None
        self.h = {l: np.ascontiguousarray(a) for l, a in h.items()}
        self.state = {l: np.ascontiguousarray(a) for l, a in state.items()}
        self.cache = {}
        self.cache_policy = None
        return self

    @torch.no_grad()
    def _layer0(self) -> np.ndarray:
        if self._pre_x is None:
            with _PRE_LOCK:
                if self._pre_x is None:
                    self._pre_x = self.model.pre(torch.from_numpy(self.graph.x)).numpy()
        return self._pre_x

    def arrays(self) -> dict[tuple[str, int], np.ndarray]:
        """Every array a lookup can gather from, keyed as in `cache`: ("h", 0) is pre(x) (computed
        here if no request needed it yet), ("h", l) and ("state", l) the loaded store layers."""
        out = {("h", 0): self._layer0()}
        out.update({("h", l): a for l, a in self.h.items()})
        out.update({("state", l): a for l, a in self.state.items()})
        return out

    def _cached(self, key: tuple[str, int], rows: np.ndarray, meter: Meter) -> torch.Tensor:
        """The rows through the hot cache, on the CPU where the executor computes (a GPU cache
        hands them back; it pays off once the kernels run on that GPU too)."""
        out = self.cache[key].gather(rows)
        meter.bytes_fetched += int(out.numel() * out.element_size())
        return out if out.device.type == "cpu" else out.cpu()

    def value(self, layer: int, rows: np.ndarray, meter: Meter) -> torch.Tensor:
        """h^(layer) of G vertices `rows` (layer 0: pre(x)), counted as fetched bytes."""
        if ("h", layer) in self.cache:
            return self._cached(("h", layer), rows, meter)
        src = self._layer0() if layer == 0 else self.h[layer]
        out = src[rows]
        meter.bytes_fetched += int(out.nbytes)
        return torch.from_numpy(out)

    def stored_state(self, layer: int, rows: np.ndarray, meter: Meter) -> torch.Tensor:
        if ("state", layer) in self.cache:
            return self._cached(("state", layer), rows, meter)
        out = self.state[layer][rows]
        meter.bytes_fetched += int(out.nbytes)
        return torch.from_numpy(out)
