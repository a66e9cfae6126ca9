"""The front-end side of a sharded pool (serving.online.sharded): the deployment a sharded pool
answers batches from, whose reuse-mode engines run their layers as computation graph parallelism
(CGP) over the pool's shard workers instead of reading the PE store in this process.

The front holds G (the requests' computation-graph structure is built from its topology, as the
CGP driver always does: serving.spark_cgp) and the model; the stored layers h^(1..k-1) and their
states are read only by the shard that owns them. Each engine's executor builds one job per layer,
the pool fans it out to the S shard owners at once and the partials merge here exactly
(cgp_kernel.merge_partials); the answers equal the in-process engine's up to float summation order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkgnn.serving.modes import ModeError
from sparkgnn.serving.online.batch_op import Deployment, DeploymentCache
from sparkgnn.serving.online.sharded import SHARDED_MODES
from sparkgnn.serving.spark_cgp import PartitionedLayerExecutor


class ShardedLayerExecutor(PartitionedLayerExecutor):
    """A reuse mode's layers as one job per layer fanned out to the shard owners by
    `fan_out(job) -> [result per partition]` (ShardedPool.fan_out); merged and updated here."""

    def __init__(self, ctx, model, store, graph_dir: str, model_path: str, parts: int, states: bool, fan_out: Callable):
        super().__init__(ctx, model, store, graph_dir, model_path, parts, states)
        self._fan_out = fan_out

    def _run(self, job: dict) -> list:
        self.jobs += 1
        return self._fan_out(job)


class ShardedDeployment(Deployment):
    """batch_op.Deployment whose engines run over `shards` partitions through `fan_out`; the store
    is opened here for its manifest only (the shards read its rows), the hot cache never attached."""

    def __init__(self, spec: dict, *, shards: int, states: bool, fan_out: Callable):
        super().__init__(spec)
        self.shards, self.states, self._fan_out = int(shards), bool(states), fan_out

    def _build_engine(self, mode: str):
        """A reuse-mode engine whose layers run on a ShardedLayerExecutor (Deployment.engine
        builds it once, under its lock)."""
        from sparkgnn.serving.engine import QueryEngine

        if mode not in SHARDED_MODES:
            raise ModeError(
                f"mode {mode!r} is not served by a sharded pool: only {', '.join(SHARDED_MODES)} run over "
                "shards of the PE store"
            )
        options = dict((self.spec.get("options") or {}).get(mode, {}), partitions=self.shards)
        found = QueryEngine(self.graph, self.model, mode=mode, store=self.store, context=self.context, **options)
        self.context = found.context
        executor = ShardedLayerExecutor(
            found.context,
            found.mode.model,
            self.store,
            self.spec["graph"],
            self.spec["model"],
            self.shards,
            self.states,
            self._fan_out,
        )
        executor.warm_up()  # every shard loaded before the engine answers
        reuse: Any = found.mode  # a ReuseMode: it runs its layers on `executor` when given one
        reuse.executor = executor
        return found

    def _attach_cache(self, engine) -> None:
        """No hot cache: the stored rows live in the shard workers (config refuses one)."""


class ShardedDeploymentCache(DeploymentCache):
    """The front's loaded deployments of one sharded pool: each loaded as a ShardedDeployment."""

    def __init__(self, *, shards: int, states: bool, fan_out: Callable):
        super().__init__()
        self._shards, self._states, self._fan_out = int(shards), bool(states), fan_out

    def _load(self, spec: dict) -> Deployment:
        return ShardedDeployment(spec, shards=self._shards, states=self._states, fan_out=self._fan_out)
