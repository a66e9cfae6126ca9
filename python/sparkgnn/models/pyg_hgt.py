"""PyG's HGTConv -> one typed round of HGTRelationLayer per relation and an HGTOutputOp per
destination type (layers/hgt.py), with HGT's weights sliced per relation and type.

WHY slices: HGTConv keeps its weights per node type (kqv_lin: keys, queries and values of a type in
one [3F, in] Linear; out_lin; skip) and per (head, relation) (k_rel, v_rel: PyG's HeteroLinear
over num_heads * num_edge_types types, type h * R + r; p_rel per relation). A relation's layer
takes its source type's key and value rows, its destination type's query rows and its relation's
matrices, so each relation is a self-contained merge-aware conv.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.hetero import EdgeType, edge_key
from sparkgnn.layers.hgt import HGTOutputOp, HGTRelationLayer
from sparkgnn.layers.nodeops import NodeOp
from sparkgnn.models.pyg_common import tensor_of


def hgt_round(
    module: Any, where: str, relations: Sequence[EdgeType], widths: Mapping[str, int]
) -> tuple[dict[EdgeType, HGTRelationLayer], dict[str, list[NodeOp]]]:
    """(relation -> HGTRelationLayer, destination type -> [HGTOutputOp]) of one HGTConv called with
    `relations` (the edge_index_dict's keys) over types of `widths` (type -> input width);
    `module` is PyG's HGTConv (Any: its submodules are read by PyG's attribute names);
    UnsupportedModelError (one line) for what the typed rounds cannot run."""
    built_for = [tuple(e) for e in module.edge_types]
    if sorted(relations) != sorted(built_for):
        raise UnsupportedModelError(
            f"{where} (HGTConv) is called with relations {sorted(relations)} but built for {sorted(built_for)}"
        )
    if getattr(module, "flow", "source_to_target") != "source_to_target":
        raise UnsupportedModelError(f"{where} (HGTConv): flow={module.flow!r} (only 'source_to_target')")
    f, heads = int(module.out_channels), int(module.heads)
    num_relations = len(built_for)
    k_rel = tensor_of(module.k_rel.weight, f"{where}.k_rel.weight", module)
    v_rel = tensor_of(module.v_rel.weight, f"{where}.v_rel.weight", module)
    convs: dict[EdgeType, HGTRelationLayer] = {}
    for e in relations:
        s, _, d = e
        for t in (s, d):
            if t not in widths:
                raise UnsupportedModelError(f"{where} (HGTConv): relation {e} reads type {t!r}, which x_dict lacks")
        if widths[s] != widths[d]:
            raise UnsupportedModelError(
                f"{where}: relation {e} reads {widths[s]}-wide {s!r} rows and {widths[d]}-wide {d!r} rows; "
                "a relation's conv reads one width on both sides: project the types to one width first "
                "(a per-type Linear)"
            )
        weight_s, bias_s = _kqv(module, s, where)
        weight_d, bias_d = _kqv(module, d, where)
        if weight_s.shape[1] != widths[s] or weight_d.shape[1] != widths[d]:
            raise UnsupportedModelError(
                f"{where} (HGTConv): kqv_lin reads {weight_s.shape[1]}-wide {s!r} rows, it is given {widths[s]}"
            )
        layer = HGTRelationLayer(widths[s], f, heads)
        r = built_for.index(e)
        with torch.no_grad():
            layer.weight_key.copy_(weight_s[:f]), layer.bias_key.copy_(bias_s[:f])
            layer.weight_query.copy_(weight_d[f : 2 * f]), layer.bias_query.copy_(bias_d[f : 2 * f])
            layer.weight_value.copy_(weight_s[2 * f :]), layer.bias_value.copy_(bias_s[2 * f :])
            rows = [h * num_relations + r for h in range(heads)]  # PyG's type index of (head h, relation r)
            layer.k_rel.copy_(k_rel[rows]), layer.v_rel.copy_(v_rel[rows])
            layer.p_rel.copy_(tensor_of(module.p_rel[edge_key(e)], f"{where}.p_rel", module).view(-1))
        convs[e] = layer
    post: dict[str, list[NodeOp]] = {}
    for d in dict.fromkeys(e[2] for e in relations):
        lin = module.out_lin.lins[d]
        op = HGTOutputOp(f, carry=f if widths[d] == f else 0)
        with torch.no_grad():
            op.weight.copy_(tensor_of(lin.weight, f"{where}.out_lin.{d}.weight", module))
            if lin.bias is not None:
                op.bias.copy_(tensor_of(lin.bias, f"{where}.out_lin.{d}.bias", module))
            if op.skip is not None:
                op.skip.copy_(tensor_of(module.skip[d], f"{where}.skip.{d}", module).view(-1))
        post[d] = [op]
    return convs, post


def _kqv(module: Any, t: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Type t's [3F, in] key / query / value weight and [3F] bias (zeros when it has none)."""
    lin = module.kqv_lin.lins[t]
    weight = tensor_of(lin.weight, f"{where}.kqv_lin.{t}.weight", module)
    bias = (
        torch.zeros(weight.shape[0]) if lin.bias is None else tensor_of(lin.bias, f"{where}.kqv_lin.{t}.bias", module)
    )
    return weight, bias


__all__ = ["hgt_round"]
