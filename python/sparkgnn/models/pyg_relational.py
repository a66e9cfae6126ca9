"""PyG per-relation decoders (DistMult, TransE) -> sparkgnn decoders, by tracing forward with torch.fx.

Two ways of writing one are accepted, each with one relation table (a [num_relations, hidden]
Parameter read by `table[edge_type]`, or an nn.Embedding called on the edge types):

    def forward(self, z, edge_index, edge_type):          # PyG's examples/rgcn_link_pred.py
        z_src, z_dst = z[edge_index[0]], z[edge_index[1]]
        rel = self.rel_emb[edge_type]
        return torch.sum(z_src * rel * z_dst, dim=1)       # DistMult
        return -(z_src + rel - z_dst).norm(p=1, dim=-1)    # TransE (p = 1 or 2)

    def forward(self, h_src, h_dst, edge_type): ...        # the pair's outputs given directly

optionally ending in a sigmoid. The walk gives every traced value a symbolic meaning (the node
matrix, an edge_index row, a pair side, the relation rows, a product or a signed sum of those)
and accepts exactly the two score formulas; any other op is refused with UnsupportedModelError
naming the source line. The converted decoder is then run next to the module on a random probe
and refused unless the two agree (1e-5): the walk fixes the formula, the probe guards the
reading of its constants (the norm's p, the table).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import NoReturn

import torch
import torch.fx
import torch.nn.functional as F

from sparkgnn.decoders.relational import DistMultDecoder, RelationalDecoder, TransEDecoder
from sparkgnn.errors import UnsupportedModelError

__all__ = ["relational_decoder_from_pyg"]

_MUL = (operator.mul, torch.mul, "mul")
_ADD = (operator.add, torch.add, "add")
_SUB = (operator.sub, torch.sub, "sub")
_NEG = (operator.neg, torch.neg, "neg")
_SUM = (torch.sum, "sum")
_NORM = (torch.norm, torch.linalg.norm, torch.linalg.vector_norm, "norm")
_SIGMOID = (torch.sigmoid, F.sigmoid, "sigmoid")
_FEATURE_DIMS = (1, -1, (1,), (-1,), [1], [-1])
PROBE_TOL = 1e-5


def relational_decoder_from_pyg(
    module: torch.nn.Module, graph: torch.fx.Graph, head: str, relations=None
) -> RelationalDecoder:
    """The DistMult / TransE decoder equal to `module` (module doc) whose traced forward is `graph`;
    `relations`: optional names of the table's rows."""
    walk = _RelationalWalk(module, graph, head)
    decoder = walk.run(relations)
    _probe(module, decoder, walk.pyg_form, head)
    return decoder


def _target_in(node: torch.fx.Node, table: tuple) -> bool:
    if node.op == "call_method":
        return str(node.target) in table
    return node.op == "call_function" and any(node.target is t for t in table if not isinstance(t, str))


class _RelationalWalk:
    def __init__(self, root: torch.nn.Module, graph: torch.fx.Graph, head: str):
        self.root, self.graph, self.head = root, graph, head
        self.node: torch.fx.Node | None = None
        self.sym: dict[torch.fx.Node, object] = {}
        self.table: torch.Tensor | None = None
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        second = self.placeholders[1] if len(self.placeholders) > 1 else None
        # PyG's form indexes the node matrix by edge_index rows; the other reads the pair directly
        self.pyg_form = any(
            n.op == "call_function" and n.target is operator.getitem and n.args[0] is second for n in graph.nodes
        )

    def refuse(self, why: str) -> NoReturn:
        from sparkgnn.models.pyg_fx import _source

        at = f", {_source(self.node)}" if self.node is not None else ""
        raise UnsupportedModelError(f"{self.head}{at}: {why}")

    def run(self, relations) -> RelationalDecoder:
        from sparkgnn.models.pyg_fx import _op_name

        names = ("Z", "EI", "T") if self.pyg_form else ("S", "D", "T")
        result = None
        for node in self.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                index = self.placeholders.index(node)
                self.sym[node] = names[index] if index < 3 else "OPTION"
            elif node.op == "output":
                result = self.sym.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
            else:
                value = self._step(node)
                if value is None:
                    self.refuse(
                        f"{_op_name(node)} is not a step of a DistMult (sum(z_src * rel * z_dst, dim=-1)) or "
                        "TransE (-(z_src + rel - z_dst).norm(p, dim=-1)) decoder"
                    )
                self.sym[node] = value
        if not isinstance(result, tuple) or result[0] not in ("score", "final"):
            self.refuse(
                "must return one score per pair: sum(z_src * rel * z_dst, dim=-1) or -||z_src + rel - z_dst||_p"
            )
        if self.table is None:
            self.refuse("reads no relation table")
        _, kind, p, final = result if result[0] == "final" else (*result, None)
        table = self.table.detach().to(torch.float32)
        options = {"in_dim": table.shape[1], "num_relations": table.shape[0], "relations": relations, "final": final}
        try:
            decoder = DistMultDecoder(**options) if kind == "distmult" else TransEDecoder(**options, p=p)
        except ValueError as e:
            raise UnsupportedModelError(f"{self.head}: {e}") from None
        decoder.rel_emb.data.copy_(table)
        return decoder.train(False)

    # -- one node -------------------------------------------------------------------------------
    def _args(self, node: torch.fx.Node) -> list:
        return [self.sym.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args]

    def _set_table(self, tensor) -> str:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2 or not tensor.is_floating_point():
            self.refuse("reads a tensor attribute that is not a [num_relations, hidden] relation table")
        if self.table is not None and tensor is not self.table:
            self.refuse("reads a second relation table; a decoder has one")
        self.table = tensor
        return "TABLE"

    def _step(self, node: torch.fx.Node):
        args, kwargs = self._args(node), dict(node.kwargs)
        if node.op == "get_attr":
            return self._set_table(operator.attrgetter(str(node.target))(self.root))
        if node.op == "call_module":
            sub = self.root.get_submodule(str(node.target))
            if isinstance(sub, torch.nn.Embedding) and args == ["T"] and not kwargs:
                if sub.max_norm is not None:
                    self.refuse("an nn.Embedding with max_norm (it rewrites the table) is not supported")
                self._set_table(sub.weight)
                return "R"
            return None
        if node.op == "call_function" and node.target is operator.getitem and len(args) == 2:
            return self._getitem(*args)
        if node.op == "call_function" and node.target is F.embedding and args[:2] == ["T", "TABLE"]:
            return "R" if len(args) == 2 and not {k for k, v in kwargs.items() if v is not None} else None
        if _target_in(node, _MUL) and len(args) == 2 and not kwargs:
            return _product(*args)
        if _target_in(node, _ADD) and len(args) == 2 and not kwargs:
            return _signed(args[0], args[1], 1)
        if _target_in(node, _SUB) and len(args) == 2 and not kwargs:
            return _signed(args[0], args[1], -1)
        if _target_in(node, _NEG) and len(args) == 1 and not kwargs:
            if isinstance(args[0], tuple) and args[0][0] == "norm":
                return ("score", "transe", args[0][1])
            return _negate(args[0])
        if _target_in(node, _SUM):
            return self._sum(node, args, kwargs)
        if _target_in(node, _NORM):
            return self._norm(node, args, kwargs)
        if _target_in(node, _SIGMOID) and len(args) == 1 and not kwargs:
            if isinstance(args[0], tuple) and args[0][0] == "score":
                return ("final", args[0][1], args[0][2], "sigmoid")
        return None

    def _getitem(self, base, index):
        if base == "EI" and index in (0, 1):
            return ("EI", index)
        if base == "Z" and index in (("EI", 0), ("EI", 1)):
            return "S" if index == ("EI", 0) else "D"
        if base == "TABLE" and index == "T":
            return "R"
        return None

    def _sum(self, node, args, kwargs):
        dim = args[1] if len(args) > 1 else kwargs.pop("dim", None)
        if len(args) > 2 or set(kwargs) - {"keepdim"} or kwargs.get("keepdim") or dim not in _FEATURE_DIMS:
            self.refuse("a sum must run over the features only (dim=-1, keepdim=False)")
        if args[0] == ("prod", ("D", "R", "S")):
            return ("score", "distmult", None)
        return None

    def _norm(self, node, args, kwargs):
        params = ("p", "dim", "keepdim") if node.target in ("norm", torch.norm) else ("ord", "dim", "keepdim")
        bound = dict(zip(params, args[1:], strict=False)) | kwargs
        if set(bound) - set(params) or bound.get("keepdim") or bound.get("dim") not in _FEATURE_DIMS:
            self.refuse("a norm must run over the features only (dim=-1, keepdim=False)")
        p = bound.get(params[0], "fro" if params[0] == "p" else None)
        p = 2.0 if p in ("fro", None) else p
        if not isinstance(p, (int, float)) or float(p) not in (1.0, 2.0):
            self.refuse(f"a TransE norm must be p=1 or p=2, got {p!r}")
        if _is_transe_difference(args[0]):
            return ("norm", float(p))
        return None


def _terms(value) -> Counter | None:
    """A signed sum of pair sides / relation rows as a Counter, None for anything else."""
    if value in ("S", "D", "R"):
        return Counter({value: 1})
    if isinstance(value, tuple) and value[0] == "lin":
        return Counter(dict(value[1]))
    return None


def _signed(a, b, sign: int):
    left, right = _terms(a), _terms(b)
    if left is None or right is None:
        return None
    total = Counter(left)
    for key, count in right.items():
        total[key] = total.get(key, 0) + sign * count
    return ("lin", tuple(sorted((k, v) for k, v in total.items() if v)))


def _negate(value):
    terms = _terms(value)
    return None if terms is None else ("lin", tuple(sorted((k, -v) for k, v in terms.items())))


def _product(a, b):
    def factors(v):
        if v in ("S", "D", "R"):
            return [v]
        if isinstance(v, tuple) and v[0] == "prod":
            return list(v[1])
        return None

    left, right = factors(a), factors(b)
    if left is None or right is None:
        return None
    return ("prod", tuple(sorted(left + right)))


def _is_transe_difference(value) -> bool:
    terms = _terms(value)
    return terms is not None and dict(terms) in ({"S": 1, "R": 1, "D": -1}, {"S": -1, "R": -1, "D": 1})


def _probe(module: torch.nn.Module, decoder: RelationalDecoder, pyg_form: bool, head: str) -> None:
    """Refuse (UnsupportedModelError) unless `decoder` equals `module` on a seeded random probe."""
    g = torch.Generator().manual_seed(0)
    n, width, rels = 12, decoder.in_dim or 1, decoder.num_relations
    z = torch.randn(n, width, generator=g)
    edge_index = torch.randint(0, n, (2, 20), generator=g)
    edge_type = torch.randint(0, rels, (20,), generator=g)
    h_src, h_dst = z[edge_index[0]], z[edge_index[1]]
    with torch.no_grad():
        try:
            expected = module(z, edge_index, edge_type) if pyg_form else module(h_src, h_dst, edge_type)
        except Exception as e:  # noqa: BLE001 - the module's own failure on the probe, reported named
            raise UnsupportedModelError(f"{head}: fails on a random probe ({type(e).__name__}: {e})") from e
        got = decoder(h_src, h_dst, edge_type)
    expected = torch.as_tensor(expected, dtype=torch.float32).reshape(-1)
    if expected.shape != got.shape or not torch.allclose(got, expected, rtol=PROBE_TOL, atol=PROBE_TOL):
        raise UnsupportedModelError(f"{head}: its scores differ from the {decoder.kind} formula it was read as")
