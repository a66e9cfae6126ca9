"""mode="auto": per request, the cheapest EXACT plan — EXACT or FULL — by the planner's estimate.

WHY: both answer exactly (FULL by recomputing the k-hop neighbourhood from raw features, EXACT from
stored states plus the messages that changed), but which one is faster depends on the request and
the graph: on a small graph whose k-hop neighbourhoods cover most of it, or with GCN (its degree
change makes EXACT recompute every changed in-edge twice, new and old), FULL wins; on a large
skewed graph EXACT wins by an order of magnitude and more (docs/ARCHITECTURE.md, "Serving plans in
the IR"). The choice is made
from serving/sketch.py's size estimates (request-proportional numpy, no computation graph, no
LayerWork) compiled into the planner's IR (planner.serving.choose), so choosing costs a small
fraction of either answer. The candidates are serving.sketch.EXACT_PLANS (a registry: a further
exact plan registers there and auto considers it, no edit here).

The answer's breakdown adds `auto_choice` (the mode that ran) and `auto_estimates_ms` (every
candidate's estimate); QueryEngine.explain(request) prints the chosen plan with the candidates.
"""

from __future__ import annotations

from sparkgnn.planner.serving import DEFAULT_COST, Choice, ServingCostModel, choose
from sparkgnn.serving.modes import Answer, Mode, ModeError, get_mode, register_mode
from sparkgnn.serving.sketch import EXACT_PLANS


@register_mode("auto")
class AutoMode(Mode):
    def __init__(
        self,
        model,
        seed: int = 0,
        partitions: int = 1,
        cost: ServingCostModel | dict | None = None,
        candidates=None,
        **options,
    ):
        super().__init__(model, seed=seed, **options)
        names = tuple(candidates) if candidates is not None else tuple(sorted(EXACT_PLANS))
        if not names:
            raise ModeError("mode 'auto' needs at least one candidate plan")
        for name in names:
            EXACT_PLANS.lookup(name)  # refuses an unknown candidate as a ModeError naming the known ones
        if isinstance(cost, dict):
            cost = ServingCostModel.from_dict(cost)
        self.cost = cost or DEFAULT_COST
        self.partitions = int(partitions)
        self.modes = {
            name: get_mode(name, model, seed=seed, **({"partitions": partitions} if name != "full" else {}))
            for name in names
        }
        self._store = None

    # the engine hands its store to the mode; the candidates that read one get it too
    @property
    def store(self):
        return self._store

    @store.setter
    def store(self, value) -> None:
        self._store = value
        for mode in self.modes.values():
            mode.store = value

    def choose(self, ctx, prep, cost: ServingCostModel | None = None) -> Choice:
        """Every candidate's sketched sizes compiled and costed; the cheapest wins."""
        if self._store is None and ctx.store is None:
            raise ModeError(
                "mode 'auto' chooses between exact plans that include EXACT, which reuses precomputed "
                "embeddings: pass store= (a PEStore with states for this graph and model) to the engine"
            )
        sketches = {name: EXACT_PLANS[name](ctx, prep, self.model, partitions=self.partitions) for name in self.modes}
        return choose(sketches, cost or self.cost)

    def run(self, ctx, prep, meter) -> Answer:
        with meter.timer("plan_s"):
            choice = self.choose(ctx, prep)
        answer = self.modes[choice.mode].run(ctx, prep, meter)
        answer.breakdown["auto_choice"] = choice.mode
        answer.breakdown["auto_estimates_ms"] = {name: s * 1e3 for name, s in choice.seconds.items()}
        return answer

    def counts(self, ctx, prep):
        return self.modes[self.choose(ctx, prep).mode].counts(ctx, prep)

    def plan(self, ctx, request, cost: ServingCostModel | None = None):
        """The chosen plan as estimated before running (sizes from the sketch), with every
        candidate's estimate: what auto decided on, and why."""
        return self.choose(ctx, ctx.prepare(request), cost).plan
