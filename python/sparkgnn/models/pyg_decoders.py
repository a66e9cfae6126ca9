"""PyG link-prediction decoders -> sparkgnn decoders, by tracing `forward(h_src, h_dst)` with torch.fx.

A decoder module in PyG's examples is a class whose forward combines the two node outputs and
reduces to one score per pair:

    return (h_src * h_dst).sum(dim=-1)                                  # dot
    return F.cosine_similarity(h_src, h_dst, dim=-1)                    # cosine
    return self.mlp(torch.cat([h_src, h_dst], dim=-1)).squeeze(-1)      # MLP on concat
    return self.lin2(self.lin1(h_src * h_dst).relu()).view(-1)          # MLP on hadamard
    return self.mlp(h_src - h_dst).squeeze(-1).sigmoid()                # MLP on the difference

`decoder_from_pyg` traces it (the node-wise modules of models/pyg_nodeops.py kept whole, as
models/pyg_fx.py does for model classes) and walks the graph in three phases: the PAIR op (one
of mul / sub / torch.cat([src, dst]) / F.cosine_similarity of the two inputs), node-wise ops on
the pair row (modules, activations, dropout), a REDUCTION to one number (sum over the features,
or squeeze / view(-1) / flatten of a width-1 row), then optionally a sigmoid. WHY this shape and
nothing else: the result must be one of the decoder kinds (decoders/base.py) so it saves as JSON
and scores pairs anywhere; anything else (a transform of one side before combining, a bilinear
form, a second output) is refused with UnsupportedModelError naming the source line, never
approximated. A sparkgnn Decoder is accepted as is (a copy). A forward with three inputs is a
per-relation decoder (DistMult, TransE), walked by models/pyg_relational.py. A dict or
torch.nn.ModuleDict {edge type or its key: decoder module} (one decoder per edge type, as PyG's
hetero link-prediction models train) becomes a per_relation decoder, each member converted alone.
"""

from __future__ import annotations

import copy
import inspect
import operator
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import torch
import torch.fx
import torch.nn.functional as F

from sparkgnn.decoders.base import Decoder
from sparkgnn.decoders.cosine import CosineDecoder
from sparkgnn.decoders.dot import DotDecoder
from sparkgnn.decoders.mlp import MLPDecoder
from sparkgnn.decoders.per_relation import PerRelationDecoder, member_key
from sparkgnn.decoders.relational import RelationalDecoder, check_relation_names
from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.nodeops import ActivationOp, NodeOp, NodeOpStack

__all__ = ["decoder_from_pyg"]

_MUL = (operator.mul, torch.mul)
_SUB = (operator.sub, torch.sub)
_SUM = (torch.sum,)
_FLATTEN = ("squeeze", "view", "reshape", "flatten")


def decoder_from_pyg(
    module: torch.nn.Module | Mapping[Any, torch.nn.Module],
    where: str = "decoder",
    *,
    relations: Sequence[str] | None = None,
) -> Decoder:
    """The sparkgnn decoder equal to `module(h_src, h_dst)` (module doc), or to a per-relation
    `module(z, edge_index, edge_type)` / `module(h_src, h_dst, edge_type)` (DistMult, TransE:
    models/pyg_relational.py), weights copied in float32; UnsupportedModelError (one line, naming
    the source line) for anything else; a dict / ModuleDict of such modules keyed by relation is
    a per_relation decoder (module doc). `relations`: names of a per-relation decoder's relations
    (its table's rows, in order), so pairs can name them; refused for the other kinds."""
    if isinstance(module, (Mapping, torch.nn.ModuleDict)):
        return _per_relation_from_pyg(module, where, relations)
    if isinstance(module, Decoder):
        decoder = copy.deepcopy(module).float().train(False)
        if relations is not None:
            if not isinstance(decoder, RelationalDecoder):
                raise UnsupportedModelError(f"{where}: relations= is for distmult and transe decoders only")
            try:
                decoder.relations = check_relation_names(relations, decoder.num_relations)
            except ValueError as e:
                raise UnsupportedModelError(f"{where}: {e}") from None
        return decoder
    if not isinstance(module, torch.nn.Module):
        raise UnsupportedModelError(f"{where}: {type(module).__name__} is not a torch.nn.Module")
    from sparkgnn.models.pyg_common import short_name
    from sparkgnn.models.pyg_nodeops import ensure_registered

    ensure_registered()  # the node-wise module table the tracer keeps whole
    head = f"{where} ({short_name(module)}): forward()"
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError) as e:
        raise UnsupportedModelError(f"{head} has no inspectable signature: {e}") from e
    names = list(params)
    required = [n for n in names if params[n].default is inspect.Parameter.empty]
    if len(required) == 3:
        from sparkgnn.models.pyg_relational import relational_decoder_from_pyg

        graph = _trace(module, head, {n: params[n].default for n in names[3:]})
        return relational_decoder_from_pyg(module, graph, head, relations)
    if len(names) < 2 or len(required) > 2:
        raise UnsupportedModelError(
            f"{head} takes {names}: expected forward(h_src, h_dst) returning one score per pair, "
            "or forward(z, edge_index, edge_type) of a per-relation decoder"
        )
    if relations is not None:
        raise UnsupportedModelError(f"{head}: relations= is for per-relation (distmult, transe) decoders only")
    # options with defaults (e.g. sigmoid=True) are traced at their default value
    concrete = {n: params[n].default for n in names[2:]}
    graph = _trace(module, head, concrete)
    return _DecoderWalk(module, graph, head).run()


def _per_relation_from_pyg(
    modules: Mapping | torch.nn.ModuleDict, where: str, relations: Sequence[str] | None
) -> PerRelationDecoder:
    """A per_relation decoder of {relation: decoder module} (decoders/per_relation.py), each
    member converted by `decoder_from_pyg`."""
    if relations is not None:
        raise UnsupportedModelError(
            f"{where}: relations= names a per-relation table's rows; a dict of decoders names its own"
        )
    members = {}
    for key, member in modules.items():
        try:
            name = member_key(key)
        except ValueError as e:
            raise UnsupportedModelError(f"{where}: {e}") from None
        members[name] = decoder_from_pyg(member, f"{where}[{name!r}]")
    try:
        return PerRelationDecoder(members=members)
    except ValueError as e:
        raise UnsupportedModelError(f"{where}: {e}") from None


def _trace(module, head: str, concrete: dict) -> torch.fx.Graph:
    from sparkgnn.models.pyg_fx import _trace_error_line, _Tracer

    tracer = _Tracer()
    tracer.record_stack_traces = True
    try:
        return tracer.trace(module, concrete_args=concrete or None)
    except Exception as e:  # noqa: BLE001 - any failure of symbolic execution is reported, named
        raise UnsupportedModelError(
            f"{head}, {_trace_error_line(module, e)}: cannot be traced symbolically ({type(e).__name__}: {e})"
        ) from e


class _DecoderWalk:
    """One pass over the traced decoder graph: pair op, node ops, reduction, final (module doc)."""

    def __init__(self, root: torch.nn.Module, graph: torch.fx.Graph, head: str):
        self.root, self.graph, self.head = root, graph, head
        self.inputs: list[torch.fx.Node] = []
        self.cur: torch.fx.Node | None = None
        self.phase = "pair"  # pair -> vector -> score
        self.pair: str | None = None
        self.ops: list[NodeOp] = []
        self.reduce: str | None = None
        self.final: str | None = None
        self.eps = 1e-8
        self.node: torch.fx.Node | None = None

    def refuse(self, why: str) -> NoReturn:
        from sparkgnn.models.pyg_fx import _source

        at = f", {_source(self.node)}" if self.node is not None else ""
        raise UnsupportedModelError(f"{self.head}{at}: {why}")

    def run(self) -> Decoder:
        from sparkgnn.models.pyg_fx import _ensure_tables, _nodes_in

        _ensure_tables()
        guards: set[torch.fx.Node] = set()
        for node in self.graph.nodes:
            self.node = node
            used = _nodes_in((node.args, node.kwargs))
            if node.op == "placeholder":
                if len(self.inputs) < 2:
                    self.inputs.append(node)
                else:
                    guards.add(node)
            elif used and all(n in guards for n in used):
                guards.add(node)  # fx's check that an option kept its traced default value
            elif any(n in guards for n in used):
                self.refuse(f"reads a third input {used[0].name!r}; a decoder reads (h_src, h_dst) only")
            elif node.op == "output":
                self._output(node)
            elif node.op == "get_attr":
                self.refuse(f"reads the attribute self.{node.target} directly; only node-wise submodules are supported")
            elif self.phase == "pair":
                self._pair(node)
            else:
                self._after_pair(node)
        return self._build()

    # -- phases ---------------------------------------------------------------------------------
    def _output(self, node):
        (value,) = node.args
        if self.phase != "score" or value is not self.cur:
            self.refuse(
                "must return one score per pair: the pair's combination reduced over the features "
                "(.sum(dim=-1), or .squeeze(-1) / .view(-1) of a width-1 head)"
            )

    def _is_inputs(self, a, b) -> bool:
        return a is self.inputs[0] and b is self.inputs[1]

    def _pair(self, node):
        from sparkgnn.models.pyg_fx import _op_name

        target, args, kwargs = node.target, list(node.args), dict(node.kwargs)
        method = node.op == "call_method"
        if (target in _MUL or (method and target == "mul")) and len(args) == 2 and not kwargs:
            if self._is_inputs(*args) or self._is_inputs(*args[::-1]):
                return self._start(node, "hadamard")
        if (target in _SUB or (method and target == "sub")) and len(args) == 2 and not kwargs:
            if self._is_inputs(*args):
                return self._start(node, "diff")
        if target is torch.cat:
            bound = dict(zip(("tensors", "dim"), args, strict=False)) | kwargs
            tensors = bound.get("tensors")
            if bound.get("dim", 0) in (1, -1) and isinstance(tensors, (list, tuple)) and len(tensors) == 2:
                if self._is_inputs(*tensors):
                    return self._start(node, "concat")
        if target is F.cosine_similarity:
            bound = dict(zip(("x1", "x2", "dim", "eps"), args, strict=False)) | kwargs
            if set(bound) <= {"x1", "x2", "dim", "eps"} and self._is_inputs(bound.get("x1"), bound.get("x2")):
                if bound.get("dim", 1) not in (1, -1):
                    self.refuse("F.cosine_similarity over a dim other than the features (dim=1 or -1)")
                self.eps = float(bound.get("eps", 1e-8))
                self._start(node, "cosine")
                self.phase = "score"
                return None
        self.refuse(
            f"{_op_name(node)} is not a supported first step: a decoder first combines h_src and h_dst "
            "(h_src * h_dst, h_src - h_dst, torch.cat([h_src, h_dst], dim=-1) or F.cosine_similarity), "
            "with no transform of one side alone"
        )

    def _start(self, node, pair: str):
        self.pair, self.cur, self.phase = pair, node, "vector"

    def _after_pair(self, node):
        from sparkgnn.models.pyg_fx import FUNCTIONS, METHODS, _bind, _op_name

        args = list(node.args)
        if not args or args[0] is not self.cur:
            self.refuse(f"{_op_name(node)} does not read the previous op's result; a decoder is a chain of ops")
        if node.op == "call_module":
            if self.phase != "vector":
                self.refuse(f"{_op_name(node)} after the reduction to one score is not supported (only a sigmoid)")
            if len(args) != 1 or node.kwargs:
                self.refuse(f"{_op_name(node)} is called with more than the pair's features")
            from sparkgnn.models.pyg_nodeops import node_ops

            self.ops += node_ops(self.root.get_submodule(str(node.target)), f"decoder.{node.target}")
            self.cur = node
            return
        if self._reduction(node, args):
            self.cur, self.phase = node, "score"
            return
        if node.op == "call_method":
            entry = METHODS.get(str(node.target))
        else:
            entry = FUNCTIONS.get(node.target)
        if entry is None:
            self.refuse(f"{_op_name(node)} is not a supported decoder operation")
        params, convert = entry
        ops = convert(_bind(node, params, self.refuse))
        if isinstance(ops, str):
            self.refuse(ops)
        if self.phase == "score":
            if ops and not (len(ops) == 1 and isinstance(ops[0], ActivationOp) and ops[0].name == "sigmoid"):
                self.refuse(f"{_op_name(node)} after the reduction to one score is not supported (only a sigmoid)")
            if ops:
                if self.final is not None:
                    self.refuse("a second sigmoid on the score is not supported")
                self.final = "sigmoid"
        else:
            self.ops += ops
        self.cur = node

    def _reduction(self, node, args) -> bool:
        """Whether `node` reduces the pair row to one number (recording how), refusing a reduction
        over another axis."""
        target, kwargs = node.target, dict(node.kwargs)
        is_sum = target in _SUM or (node.op == "call_method" and target == "sum")
        if is_sum:
            if self.phase != "vector":
                self.refuse("a sum after the reduction to one score is not supported")
            dim = args[1] if len(args) > 1 else kwargs.pop("dim", None)
            if (
                dim not in (1, -1, (1,), (-1,), [1], [-1])
                or len(args) > 2
                or set(kwargs) - {"keepdim"}
                or kwargs.get("keepdim")
            ):
                self.refuse("a sum must run over the features only (dim=-1, keepdim=False)")
            self.reduce = "sum"
            return True
        if node.op == "call_method" and target in _FLATTEN:
            if self.phase != "vector":
                return True  # a no-op reshape of the scores
            rest = args[1:] + list(kwargs.values())
            ok = {
                "squeeze": rest in ([-1], [1]),
                "view": rest == [-1],
                "reshape": rest == [-1],
                "flatten": rest in ([], [0]),
            }
            if not ok[str(target)]:
                self.refuse(f"Tensor.{target}{tuple(rest)} is not a reduction of a width-1 head to one score per pair")
            self.reduce = "squeeze"
            return True
        return False

    def _build(self) -> Decoder:
        if self.pair == "cosine":
            return CosineDecoder(final=self.final, eps=self.eps)
        if self.pair == "hadamard" and self.reduce == "sum" and not self.ops:
            return DotDecoder(final=self.final)
        assert self.pair is not None and self.reduce is not None
        try:
            decoder = MLPDecoder(
                final=self.final, combine=self.pair, reduce=self.reduce, _head=NodeOpStack(ops=self.ops)
            )
        except ValueError as e:
            raise UnsupportedModelError(f"{self.head}: {e}") from None
        decoder.float()
        for p in decoder.parameters():
            p.requires_grad_(False)
        return decoder.train(False)
