"""The serving modes that reuse precomputed embeddings: HE, SRPE(gamma, policy) and EXACT
(plans.py says what each recomputes, delta.py how). They need the engine's PE store (opened and
verified against the same graph and model, with states for SRPE and EXACT).

`partitions` (P >= 1) runs computation graph parallelism in-process (delta.py): answers equal
P = 1 up to float summation order; the breakdown adds the bytes exchanged between partitions.
spark_cgp.use_spark_cgp(engine, spark, ...) runs the same partitions as Spark tasks instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from sparkgnn.serving.cgp_kernel import no_exchange
from sparkgnn.serving.context import Meter
from sparkgnn.serving.delta import LayerExecutor
from sparkgnn.serving.modes import Answer, Mode, ModeError, register_mode
from sparkgnn.serving.plans import exact_works, he_works, srpe_works
from sparkgnn.serving.policies import POLICIES, candidates, select
from sparkgnn.serving.sizes import delta_counts

if TYPE_CHECKING:
    from sparkgnn.serving.stored import StoredLayers


class ReuseMode(Mode):
    needs_states = True

    def __init__(self, model, seed: int = 0, partitions: int = 1, **options):
        super().__init__(model, seed=seed, **options)
        if int(partitions) < 1:
            raise ModeError(f"partitions must be >= 1, got {partitions}")
        self.partitions = int(partitions)
        self._stored: StoredLayers | None = None

    def stored(self, ctx) -> StoredLayers:
        """The store's layers aligned to G, built on the first request (then reused)."""
        store = getattr(self, "store", None) or ctx.store
        if store is None:
            raise ModeError(
                f"mode {self.name!r} reuses precomputed embeddings: pass store= (a "
                f"PEStore opened for this graph and model) to the engine"
            )
        if self._stored is None or self._stored.graph is not ctx.graph:
            self._stored = ctx.stored_layers(store, self.model, self.needs_states)
        return self._stored

    def works(self, ctx, prep, meter: Meter) -> tuple[list, dict]:
        raise NotImplementedError

    def counts(self, ctx, prep):
        works, _ = self.works(ctx, prep, Meter())
        return delta_counts(ctx, self.model, prep, works, self.name, self.partitions)

    def run(self, ctx, prep, meter) -> Answer:
        with meter.timer("plan_s"):
            works, extra = self.works(ctx, prep, meter)
        # a partitioned executor (Spark tasks, messenger workers) reads the store where it runs;
        # only the in-process one needs the store aligned in this process
        executor = getattr(self, "executor", None) or LayerExecutor(ctx, self.model, self.stored(ctx), self.partitions)
        values, comm = executor.run(works, prep, meter)
        n = ctx.num_nodes
        g_targets = [w.targets[w.targets < n] for w in works]
        counts = dict(
            nodes_recomputed=int(len(ctx.sets.unique(*g_targets))),
            recomputed_per_layer=[int(len(t)) for t in g_targets],
            nodes_touched=int(len(ctx.sets.unique(*[w.src for w in works], *[w.targets for w in works]))),
            edges=int(sum(len(w.src) for w in works)),
        )
        return self._answer(prep, values[-1], meter, counts, comm, extra)

    def _answer(self, prep, h_last: torch.Tensor, meter: Meter, counts: dict, comm: dict, extra: dict) -> Answer:
        """The answer from the last layer's values (queries first) and the breakdown's counts."""
        h = h_last[: prep.batch_size].numpy().astype(np.float32, copy=False)
        pred = h.argmax(axis=1).astype(np.int64) if self.model.output == "logits" else None
        breakdown = dict(meter.seconds)
        breakdown.update(bytes_fetched=int(meter.bytes_fetched), **counts, partitions=self.partitions, **comm, **extra)
        return Answer(prep.request.qid.copy(), h, pred, breakdown)


@register_mode("he")
class HEMode(ReuseMode):
    """Historical embeddings: no recomputation of existing vertices."""

    needs_states = False

    def works(self, ctx, prep, meter):
        return he_works(ctx, prep, self.model), {}

    def run(self, ctx, prep, meter) -> Answer:
        if self.partitions != 1 or getattr(self, "executor", None) is not None:
            return super().run(ctx, prep, meter)  # partitions in-process, or Spark / messenger tasks
        executor = LayerExecutor(ctx, self.model, self.stored(ctx))
        values, touched, edges = executor.run_queries(prep, meter)
        counts = dict(
            nodes_recomputed=0,
            recomputed_per_layer=[0] * len(values),
            nodes_touched=int(len(touched)),
            edges=int(edges),
        )
        return self._answer(prep, values[-1], meter, counts, no_exchange(), {})


@register_mode("srpe")
class SRPEMode(ReuseMode):
    def __init__(self, model, gamma: float = 0.1, policy: str = "qer", seed: int = 0, partitions: int = 1, **options):
        super().__init__(model, seed=seed, partitions=partitions, **options)
        if not 0.0 <= float(gamma) <= 1.0:
            raise ModeError(f"gamma must be in [0, 1], got {gamma}")
        POLICIES.lookup(policy)  # refuses an unknown policy as a ModeError
        self.gamma, self.policy = float(gamma), policy

    def approximation_errors(self, ctx, prep, cands) -> np.ndarray:
        """The AE oracle: sum over layers 1..k-1 of ||exact h_u - PE_u|| (0 where unchanged)."""
        stored = self.stored(ctx)
        works = exact_works(ctx, prep, self.model, also=cands)
        values, _ = LayerExecutor(ctx, self.model, stored, 1).run(works[:-1], prep, Meter())
        err = np.zeros(len(cands))
        for w, h in zip(works[:-1], values, strict=True):
            on = np.isin(w.targets, cands)
            rows = w.targets[on]
            pe = stored.value(w.layer, rows, Meter()).numpy()
            e = np.linalg.norm(h[torch.from_numpy(on)].numpy() - pe, axis=1)
            err[np.searchsorted(cands, rows)] += e
        return err

    def works(self, ctx, prep, meter):
        cands = candidates(prep, ctx)
        scores = POLICIES.lookup(self.policy)(ctx, prep, cands, self)
        chosen = select(np.asarray(scores, np.float64), cands, self.gamma)
        return srpe_works(ctx, prep, self.model, chosen), {
            "candidates": int(len(cands)),
            "gamma": self.gamma,
            "policy": self.policy,
        }


@register_mode("exact")
class ExactMode(ReuseMode):
    """FULL's answers from stored states plus the changed in-edges of changed vertices."""

    def works(self, ctx, prep, meter):
        works = exact_works(ctx, prep, self.model)
        scratch = sum(int((~w.from_state).sum()) for w in works) - len(works) * prep.batch_size
        return works, {"recomputed_from_scratch": scratch}
