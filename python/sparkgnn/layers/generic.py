"""The generic fallback: a message-passing conv sparkgnn has no native layer for, run as the
user's own module over whole in-edge neighbourhoods.

A conv is *local* when its output at a vertex v depends only on v's row, v's in-edges and the rows
of their sources. Such a conv needs no re-implementation: a partition holding destinations D, every
in-edge of D and the rows of those edges' sources (the replicate strategy ships exactly that: own
rows plus mirrored source rows) calls the module on that local subgraph and keeps its outputs at D.
No layer math is copied, so whatever the module computes, sparkgnn computes.

What it gives up: there is no partial state per destination, so a destination's in-edges can never
be split over partitions (only the replicate strategy qualifies; the planner refuses the others for
this layer, `whole_neighbourhoods` in plan_info), and the PE store, its refresh and the
state-reading serving modes, which are built on merged states, refuse such a model
(`require_states`).

Locality is checked, not assumed (`locality_probe`): at conversion the conv runs on seeded random
graphs with isolated vertices, self loops and parallel edges, whole and split into partitions of
destinations with their in-edge neighbourhoods (the executor's layout, node and edge order
shuffled); a conv whose split output differs (a global statistic, out-degrees, 2-hop reads, a
source's own in-degree as in GCN's symmetric normalisation) is refused by name.

Saving never pickles code: the spec names the conv's class (importable by module path; only
`torch_geometric.nn.conv` unless the loader allows more, `allowed_modules` / SPARKGNN_ALLOW_CONV_MODULES)
and its constructor arguments (read back from the module's attributes against its signature), the
weights travel in the model's state_dict, and the spec carries the conv's output on a small probe
graph, which the rebuilt conv must reproduce when a model is loaded (`verify`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import math
import os
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.aggregators import Aggregator
from sparkgnn.layers.base import MergeableConv, register_conv

GENERIC_KIND = "generic"
#: Packages whose conv classes a saved model may name without the loader allowing them.
ALLOWED_PACKAGES = ("torch_geometric.nn.conv",)
#: Comma-separated extra packages (or modules) allowed for generic convs, read at load time.
ALLOW_ENV = "SPARKGNN_ALLOW_CONV_MODULES"
_ALLOWED: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("sparkgnn_generic_allow", default=())

#: Probe graphs: (seed, partition counts compared with the whole graph).
PROBE_SEEDS = (0, 1, 2)
PROBE_PARTS = (2, 5)
PROBE_NODES = 30
PROBE_ISOLATED = 4
PROBE_EDGES = 70
# float32 agreement between the whole-graph and the split run (another node / edge order changes
# the order of float sums); a non-local conv differs by orders of magnitude more.
PROBE_RTOL = 1e-4
PROBE_ATOL = 1e-5

NO_STATES = (
    "runs the user's conv on whole in-edge neighbourhoods (generic fallback) and keeps no mergeable aggregation state"
)


@contextlib.contextmanager
def allowed_modules(modules: Sequence[str]) -> Iterator[None]:
    """Within the block, generic convs may also be rebuilt from classes in `modules` (package or
    module names), e.g. while loading a model whose conv the user wrote (Model.load(allow_modules=))."""
    token = _ALLOWED.set(tuple(_ALLOWED.get()) + tuple(str(m) for m in modules))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def _allowed() -> tuple[str, ...]:
    env = tuple(p.strip() for p in os.environ.get(ALLOW_ENV, "").split(",") if p.strip())
    return ALLOWED_PACKAGES + env + _ALLOWED.get()


def _is_allowed(module_name: str) -> bool:
    return any(module_name == p or module_name.startswith(p + ".") for p in _allowed())


def import_conv_class(path: str) -> type:
    """The MessagePassing class named `path` ("package.module.Class"), imported only from an
    allowed package; UnsupportedModelError saying why otherwise."""
    from torch_geometric.nn.conv import MessagePassing

    module_name, _, qualname = str(path).rpartition(".")
    if not module_name or not qualname.isidentifier():
        raise UnsupportedModelError(f"generic conv class {path!r} is not a 'module.Class' path")
    if not _is_allowed(module_name):
        raise UnsupportedModelError(
            f"generic conv class {path!r} is outside the allowed packages {', '.join(_allowed())}: "
            f"loading it would import and run that module's code; allow it with "
            f"Model.load(..., allow_modules=[{module_name!r}]) or {ALLOW_ENV}={module_name}"
        )
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError) as e:
        raise UnsupportedModelError(f"generic conv class {path!r} cannot be imported: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, MessagePassing)):
        raise UnsupportedModelError(f"generic conv class {path!r} is not a torch_geometric MessagePassing class")
    return cls


def _tuples(value):
    """JSON lists back into the tuples constructors take (channel pairs, ...)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def build_module(path: str, arguments: dict) -> torch.nn.Module:
    """A fresh conv (random weights) of class `path` from its recorded constructor arguments."""
    cls = import_conv_class(path)
    try:
        module = cls(**{k: _tuples(v) for k, v in arguments.items()})
    except Exception as e:  # noqa: BLE001 - a constructor may raise anything; reported by name
        raise UnsupportedModelError(
            f"generic conv {path} cannot be rebuilt from arguments {arguments}: {type(e).__name__}: {e}"
        ) from e
    return module.float().eval()


# ------------------------------------------------------------------ running on neighbourhoods


def call_conv(module: torch.nn.Module, x: Tensor, edge_index: Tensor) -> Tensor:
    """module(x, edge_index) with gradients off, checked to be one row per node."""
    with torch.no_grad():
        y = module(x, edge_index)
    if not isinstance(y, Tensor) or y.dim() != 2 or y.shape[0] != x.shape[0]:
        shape = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise UnsupportedModelError(
            f"{type(module).__name__} returned {shape} for {x.shape[0]} nodes: the generic fallback needs "
            "one output row per node"
        )
    return y


def split_by_destination(
    run: Callable[[Tensor, Tensor], Tensor], x: Tensor, src: Tensor, dst: Tensor, *, parts: int, seed: int
) -> Tensor:
    """`run(x_local, edge_index_local)` per partition of destinations, the way a replicate step
    calls it: vertices dealt at random (seeded) into `parts` partitions; each partition's local
    rows are its own vertices (shuffled) then the other sources of their in-edges (shuffled), its
    edges are its own vertices' in-edges (shuffled); the outputs at its own vertices are kept."""
    n = x.shape[0]
    parts = max(1, int(parts))
    gen = torch.Generator().manual_seed(int(seed))
    assign = torch.randint(0, parts, (n,), generator=gen)
    src = torch.as_tensor(src, dtype=torch.long)
    dst = torch.as_tensor(dst, dtype=torch.long)
    out: Tensor | None = None
    local = torch.full((n,), -1, dtype=torch.long)
    for p in range(parts):
        own = (assign == p).nonzero().view(-1)
        if own.numel() == 0:
            continue
        own = own[torch.randperm(own.numel(), generator=gen)]
        mine = (assign[dst] == p).nonzero().view(-1)
        mine = mine[torch.randperm(mine.numel(), generator=gen)]
        s, d = src[mine], dst[mine]
        local.fill_(-1)
        local[own] = torch.arange(own.numel())
        foreign = torch.unique(s[local[s] < 0])
        foreign = foreign[torch.randperm(foreign.numel(), generator=gen)]
        local[foreign] = own.numel() + torch.arange(foreign.numel())
        y = run(x[torch.cat([own, foreign])], torch.stack([local[s], local[d]]))
        if out is None:
            out = torch.zeros((n, *y.shape[1:]), dtype=y.dtype)
        out[own] = y[: own.numel()]
    if out is None:  # no vertices at all
        return run(x, torch.stack([src, dst]))
    return out


# ------------------------------------------------------------------ the locality probe


def probe_graph(seed: int, width: int) -> tuple[Tensor, Tensor]:
    """(x, edge_index) of a small random graph with isolated vertices (the last PROBE_ISOLATED),
    self loops (one node twice) and parallel edges."""
    g = torch.Generator().manual_seed(1000 + int(seed))
    active = PROBE_NODES - PROBE_ISOLATED
    src = torch.randint(0, active, (PROBE_EDGES,), generator=g)
    dst = torch.randint(0, active, (PROBE_EDGES,), generator=g)
    dup = torch.randint(0, PROBE_EDGES, (8,), generator=g)
    loops = torch.tensor([0, 3, 5, 5, 7])
    src = torch.cat([src, src[dup], loops])
    dst = torch.cat([dst, dst[dup], loops])
    perm = torch.randperm(src.numel(), generator=g)
    x = torch.randn(PROBE_NODES, width, generator=g)
    return x, torch.stack([src[perm], dst[perm]])


def _differs(a: Tensor, b: Tensor) -> float | None:
    """max|a - b| / max(1, max|b|) when a and b disagree beyond float32 tolerance, else None."""
    if a.shape != b.shape:
        return math.inf
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    if torch.allclose(a, b, rtol=PROBE_RTOL, atol=PROBE_ATOL * scale, equal_nan=False):
        return None
    return float((a.double() - b.double()).abs().max()) / scale


def locality_probe(module: torch.nn.Module, width: int, where: str) -> int:
    """The conv's output width, after checking on the probe graphs that it is deterministic, finite
    and local (whole graph == split by destination, module doc); UnsupportedModelError naming the
    conv and the failed check otherwise."""
    name = f"{where} ({type(module).__name__})"
    out_dim = None
    for seed in PROBE_SEEDS:
        x, edge_index = probe_graph(seed, width)
        try:
            whole = call_conv(module, x, edge_index)
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"{name}: {e}") from e
        except Exception as e:  # noqa: BLE001 - the user's forward may raise anything
            raise UnsupportedModelError(
                f"{name}: conv(x, edge_index) fails on a {width}-wide probe graph "
                f"({type(e).__name__}: {e}); the generic fallback calls it with exactly these two inputs"
            ) from e
        if not torch.isfinite(whole).all():
            raise UnsupportedModelError(f"{name}: gives NaN/Inf on a probe graph (isolated vertices, self loops)")
        if _differs(call_conv(module, x, edge_index), whole) is not None:
            raise UnsupportedModelError(f"{name}: not deterministic in eval mode (two calls on one graph differ)")
        out_dim = whole.shape[1]
        for parts in PROBE_PARTS:
            split = split_by_destination(
                lambda xs, es: call_conv(module, xs, es), x, edge_index[0], edge_index[1], parts=parts, seed=seed
            )
            diff = _differs(split, whole)
            if diff is not None:
                raise UnsupportedModelError(
                    f"{name}: not supported: not local: its output at a vertex depends on more than the vertex, its "
                    f"in-edges and their sources (a global statistic, out-degrees, 2-hop information, a "
                    f"source's own in-degree): run on partitions of destinations with their in-edge "
                    f"neighbourhoods it differs from the whole graph by {diff:.3g} (relative; probe graph "
                    f"{seed}, {parts} partitions), so the generic fallback would be wrong and refuses it"
                )
    assert out_dim is not None
    return int(out_dim)


# ------------------------------------------------------------------ constructor arguments


def _json_value(value, default):
    """`value` as JSON (scalars, lists of them), or a bool standing for a tensor/module attribute
    whose constructor argument defaults to a bool (`bias=True` -> self.bias is a Parameter or
    None); the marker _UNKNOWN when it has no JSON form."""
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and not math.isfinite(value):
            return _UNKNOWN
        return value
    if isinstance(value, (list, tuple)):
        items = [_json_value(v, inspect.Parameter.empty) for v in value]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    if isinstance(default, bool) and isinstance(value, (Tensor, torch.nn.Module)):
        return True
    return _UNKNOWN


_UNKNOWN = object()


def _same_default(value, default) -> bool:
    """A module / callable attribute that is the constructor's default (a parameter-free module of
    the default's class, or the default object itself)."""
    if value is default:
        return True
    if isinstance(value, torch.nn.Module) and isinstance(default, torch.nn.Module):
        return type(value) is type(default) and not list(value.parameters()) and not list(value.buffers())
    return False


def constructor_arguments(module: torch.nn.Module, where: str) -> list[dict]:
    """Candidate keyword arguments that rebuild `module` from its class: each constructor parameter
    read from the attribute of the same name (a missing attribute: the default, checked later by
    the rebuild), and MessagePassing's `aggr` when the class passes **kwargs on; UnsupportedModelError
    naming the parameter that has no attribute and no default, or no JSON form."""
    name = f"{where} ({type(module).__name__})"
    try:
        params = list(inspect.signature(type(module).__init__).parameters.values())[1:]
    except (TypeError, ValueError) as e:
        raise UnsupportedModelError(f"{name}: constructor signature cannot be read ({e})") from e
    args: dict = {}
    passes_kwargs = False
    for p in params:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            passes_kwargs = True
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        has_default = p.default is not inspect.Parameter.empty
        if not hasattr(module, p.name):
            if has_default:
                continue
            raise UnsupportedModelError(
                f"{name}: cannot be rebuilt for saving: constructor argument {p.name!r} is not kept as an "
                "attribute of the same name"
            )
        value = getattr(module, p.name)
        encoded = _json_value(value, p.default)
        if encoded is _UNKNOWN:
            if has_default and _same_default(value, p.default):
                continue
            raise UnsupportedModelError(
                f"{name}: cannot be rebuilt for saving: constructor argument {p.name}={value!r} has no JSON form "
                "(only numbers, strings, booleans, None and lists of them, or the default, can be recorded)"
            )
        args[p.name] = encoded
    candidates = [args]
    aggr = getattr(module, "aggr", None)
    if passes_kwargs and "aggr" not in args and isinstance(aggr, str):
        candidates.insert(0, {**args, "aggr": aggr})
    return candidates


# ------------------------------------------------------------------ the layer


class NeighbourhoodAggregator(Aggregator):
    """Stand-in aggregator of a generic conv: the module aggregates inside its own forward, so
    there is no state to form, merge or finalize; any caller that tries is told why in one line.
    Its `state_width` is the conv's output width: what a partition holds per destination between
    the module call and the post ops (the planner counts it as the layer's intermediate rows)."""

    name = "neighbourhood"

    def __init__(self, width: int):
        self.width = int(width)

    def state_width(self, msg_width: int) -> int:
        return self.width

    def _refuse(self, *args, **kwargs):
        raise UnsupportedModelError(f"a generic conv {NO_STATES}: its in-edges cannot be split into partial states")

    identity = partial = merge = finalize = negate = _refuse


@register_conv(GENERIC_KIND)
class GenericConv(MergeableConv):
    """A local MessagePassing conv run as its own module (`module`) over whole in-edge
    neighbourhoods (module doc). Built from its config: the class path, the constructor
    arguments and the probe output the weights must reproduce (`verify`)."""

    edge_mergeable = False
    can_pre_transform = False

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        conv_class: str,
        arguments: dict,
        probe_output: list | None = None,
        _module: torch.nn.Module | None = None,
    ):
        super().__init__()
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.conv_class = str(conv_class)
        self.arguments = dict(arguments)
        self.probe_output = probe_output
        self.aggregator = NeighbourhoodAggregator(self.out_dim)
        self.module = _module if _module is not None else build_module(self.conv_class, self.arguments)

    @classmethod
    def from_module(cls, conv: torch.nn.Module, in_dim: int, where: str) -> GenericConv:
        """The generic layer of the user's conv `conv` (read at `in_dim` features): probed for
        locality, rebuilt from its class and constructor arguments with its weights, and checked
        to equal `conv` on a probe graph; UnsupportedModelError naming why otherwise."""
        name = f"{where} ({type(conv).__name__})"
        if getattr(conv, "flow", "source_to_target") != "source_to_target":
            raise UnsupportedModelError(f"{name}: flow={conv.flow!r}: the generic fallback reads in-edges only")
        if getattr(conv, "explain", None):
            raise UnsupportedModelError(f"{name}: explain mode is on")
        path = f"{type(conv).__module__}.{type(conv).__qualname__}"
        if "<locals>" in path:
            raise UnsupportedModelError(f"{name}: its class is defined inside a function, so it cannot be imported")
        original = conv.eval()
        out_dim = locality_probe(original, in_dim, where)
        x, edge_index = probe_graph(0, in_dim)
        expected = call_conv(original, x, edge_index)
        why = "no candidate"
        for arguments in constructor_arguments(conv, where):
            try:
                with allowed_modules([conv.__class__.__module__]):
                    rebuilt = build_module(path, arguments)
                rebuilt.load_state_dict(conv.state_dict(), strict=True)
            except (UnsupportedModelError, RuntimeError) as e:
                why = str(e)
                continue
            rebuilt = rebuilt.float().eval()
            got = call_conv(rebuilt, x, edge_index)
            if _differs(got, expected) is None:
                return cls(in_dim, out_dim, path, arguments, got.tolist(), _module=rebuilt)
            why = f"the rebuilt conv's output differs from the original's on a probe graph (arguments {arguments})"
        raise UnsupportedModelError(f"{name}: cannot be rebuilt from its class and constructor arguments: {why}")

    # -- description -------------------------------------------------------------------------
    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "conv_class": self.conv_class,
            "arguments": self.arguments,
            "probe_output": self.probe_output,
        }

    def src_width(self, pre_transform: bool) -> int:
        return self.in_dim

    def plan_info(self) -> dict:
        return {**super().plan_info(), "whole_neighbourhoods": True}

    def verify(self) -> None:
        """Check the conv (rebuilt and given its weights) reproduces the probe output recorded at
        conversion; UnsupportedModelError otherwise (a different PyG version, a class changed since)."""
        if self.probe_output is None:
            raise UnsupportedModelError(f"generic conv {self.conv_class}: the spec records no probe output")
        x, edge_index = probe_graph(0, self.in_dim)
        got = call_conv(self.module, x, edge_index)
        diff = _differs(got, torch.tensor(self.probe_output, dtype=got.dtype))
        if diff is not None:
            raise UnsupportedModelError(
                f"generic conv {self.conv_class} rebuilt from arguments {self.arguments} does not reproduce "
                f"the saved conv's output on the probe graph (relative difference {diff:.3g}): the class "
                "changed since the model was saved, or an option is not recorded by its constructor arguments"
            )

    # -- running ---------------------------------------------------------------------------
    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return h

    def message(self, src_e, dst_e, weight_e, pre_transform: bool) -> Tensor:
        raise UnsupportedModelError(f"layer {self.conv_class} {NO_STATES}: it has no per-edge message")

    def update(self, h_dst, agg, stats, pre_transform: bool) -> Tensor:
        raise UnsupportedModelError(f"layer {self.conv_class} {NO_STATES}: it has no separate update")

    def neighbourhoods(self, x: Tensor, src: Tensor, dst: Tensor, num_dst: int, h_own: Tensor | None = None) -> Tensor:
        """The conv's output at the first `num_dst` rows of `x` (a partition's own vertices; the
        rest are mirrored sources), given every in-edge of those vertices as local (src, dst).
        `h_own` (the own vertices' full rows) is unused: this conv's row is its input; a round
        that carries skip columns (layers/dag.py CarryRound) appends them from it."""
        edge_index = torch.stack([torch.as_tensor(src, dtype=torch.long), torch.as_tensor(dst, dtype=torch.long)])
        return call_conv(self.module, x, edge_index.to(x.device))[:num_dst]

    def by_destinations(self, h: Tensor, src: Tensor, dst: Tensor, *, parts: int, seed: int) -> Tensor:
        """Reference execution (Model.forward, propagate): destinations dealt into `parts`
        partitions, each run on its in-edge neighbourhood as a replicate step would."""
        return split_by_destination(
            lambda xs, es: self.neighbourhoods(xs, es[0], es[1], xs.shape[0]), h, src, dst, parts=parts, seed=seed
        )


def require_states(model, job: str) -> None:
    """Refuse (UnsupportedModelError, one line) a model with a generic layer for `job`, a job built
    on merged aggregation states (PE store, refresh, state-reading serving)."""
    for index, conv in enumerate(model.conv_list()):
        if not getattr(conv, "edge_mergeable", True):
            raise UnsupportedModelError(
                f"{job} needs every layer's merged aggregation state, but layer {index} "
                f"({getattr(conv, 'conv_class', conv.kind)}) {NO_STATES}; run the model with sparkgnn.infer "
                "(strategy replicate or auto) or serving mode full / ns"
            )
