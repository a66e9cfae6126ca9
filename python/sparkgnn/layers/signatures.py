"""What two layers have in common: the keys model batching (layers/bundle.py) shares work by.

WHY keys and not numerical probes: two layers may share the node payload they ship to edges, or
the whole aggregation, only when they compute the SAME function of their input, for every input.
That is decided from what defines the function: the layer's code path (kind and mode), the options
it reads and the bytes of the weights it uses. Equal keys promise equal results bit for bit (same
code, same tensors); different keys only cost sharing, never correctness.

  payload_key(conv, pre)  what prepare_src computes from a node's input row (and its statistics):
                          equal keys -> one payload column block for both layers
  message_key(conv, pre)  what message computes from that payload (and the destination payload,
                          the edge weight): equal keys plus equal payloads and aggregators ->
                          one aggregation for both layers
  module_key(module)      a whole module (conv or node-op stack): config + every tensor, so two
                          equal modules fed the same rows produce the same rows

Keys are registered by conv kind (PAYLOAD_KEYS, MESSAGE_KEYS); a kind without one shares
nothing, which is always exact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Hashable

import torch

from sparkgnn.registry import Registry

KeyFn = Callable[[torch.nn.Module, bool], Hashable]
PAYLOAD_KEYS: Registry[KeyFn] = Registry("payload key", ValueError)
MESSAGE_KEYS: Registry[KeyFn] = Registry("message key", ValueError)


def digest(*tensors: torch.Tensor | None) -> str:
    """sha256 over dtype, shape and bytes of each tensor (None allowed): equal digests, equal tensors."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"\0none")
            continue
        t = t.detach().to("cpu").contiguous()
        h.update(f"\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def module_key(module: torch.nn.Module | None) -> Hashable:
    """Config (when the module has one) + every parameter and buffer, by name."""
    if module is None:
        return None
    describe = getattr(module, "config", None)
    config = describe() if callable(describe) else type(module).__name__
    state = module.state_dict()
    names = sorted(state)
    return (json.dumps(config, sort_keys=True), tuple(names), digest(*(state[n] for n in names)))


def _unique(conv) -> Hashable:
    return ("unique", id(conv))


def payload_key(conv, pre: bool) -> Hashable:
    """Key of prepare_src in the mode the layer really runs (a kind without a key: its own)."""
    fn = PAYLOAD_KEYS.get(conv.kind)
    return fn(conv, conv._pre(pre)) if fn is not None else _unique(conv)


def message_key(conv, pre: bool) -> Hashable:
    fn = MESSAGE_KEYS.get(conv.kind)
    return fn(conv, conv._pre(pre)) if fn is not None else _unique(conv)


# Raw rows: prepare_src returns its input unchanged (SAGE, GIN, GAT / GATv2 / ResGated / LE in raw
# mode, GCN without normalisation); any two such layers ship the same payload.
ROWS = ("rows",)
# The message is the source payload itself, or the payload times the edge weight.
PAYLOAD = ("payload",)
WEIGHTED_PAYLOAD = ("payload", "weighted")


@PAYLOAD_KEYS.register("sage")
def _sage_payload(conv, pre: bool) -> Hashable:
    base = ("linear", digest(conv.weight_l)) if pre else ROWS
    if getattr(conv, "project", False):  # relu(lin(x)) first, on every source row
        return ("sage_project", digest(conv.weight_p, conv.bias_p), base)
    return base


@PAYLOAD_KEYS.register("gin")
def _gin_payload(conv, pre: bool) -> Hashable:
    return ("linear", digest(conv.nn.first_linear().weight)) if pre else ROWS


@PAYLOAD_KEYS.register("gcn")
def _gcn_payload(conv, pre: bool) -> Hashable:
    # rows (or rows x W) times deg^-1/2 of the named statistic; the statistic's values depend on
    # whether edge weights count, so that is part of the key
    scale = (conv.required_stats[0], conv.uses_edge_weight) if conv.normalize else None
    base = ("linear", digest(conv.weight)) if pre else ROWS
    return base if scale is None else ("deg_inv_sqrt", scale, base)


@PAYLOAD_KEYS.register("gat")
def _gat_payload(conv, pre: bool) -> Hashable:
    if not pre:
        return ROWS
    return ("gat", conv.heads, conv.channels, digest(conv.weight, conv.att_src))


@MESSAGE_KEYS.register("sage")
def _sage_message(conv, pre: bool) -> Hashable:
    if conv.aggr == "softmax":
        return ("sage_softmax", json.dumps(conv.aggr_options, sort_keys=True), conv._scale_logits)
    return PAYLOAD


@MESSAGE_KEYS.register("gin")
def _gin_message(conv, pre: bool) -> Hashable:
    return PAYLOAD


@MESSAGE_KEYS.register("gcn")
def _gcn_message(conv, pre: bool) -> Hashable:
    return WEIGHTED_PAYLOAD if conv.uses_edge_weight else PAYLOAD


@MESSAGE_KEYS.register("gat")
def _gat_message(conv, pre: bool) -> Hashable:
    # the logit reads the destination payload (weight_dst or weight, att_dst) and, in raw mode,
    # forms the source payload per edge (weight, att_src)
    tensors = digest(conv.weight, conv.weight_dst, conv.att_src, conv.att_dst)
    return ("gat", pre, conv.heads, conv.channels, conv.negative_slope, tensors)


@PAYLOAD_KEYS.register("gatv2")
def _gatv2_payload(conv, pre: bool) -> Hashable:
    return ("gatv2", digest(conv.weight_src, conv.bias_src)) if pre else ROWS


@MESSAGE_KEYS.register("gatv2")
def _gatv2_message(conv, pre: bool) -> Hashable:
    # the logit reads the destination payload (weight_dst/bias_dst, or the source linear when
    # shared) and, in raw mode, forms the source payload per edge (weight_src, bias_src)
    tensors = digest(conv.weight_src, conv.bias_src, conv.weight_dst, conv.bias_dst, conv.att)
    return ("gatv2", pre, conv.heads, conv.channels, conv.negative_slope, conv.share_weights, tensors)


@PAYLOAD_KEYS.register("resgated")
def _resgated_payload(conv, pre: bool) -> Hashable:
    if not pre:
        return ROWS
    return ("resgated", digest(conv.weight_query, conv.bias_query, conv.weight_value, conv.bias_value))


@MESSAGE_KEYS.register("resgated")
def _resgated_message(conv, pre: bool) -> Hashable:
    # the gate reads the destination payload (key linear) and, in raw mode, forms query and
    # value per edge
    tensors = digest(
        conv.weight_key, conv.bias_key, conv.weight_query, conv.bias_query, conv.weight_value, conv.bias_value
    )
    return ("resgated", pre, json.dumps(conv.act.config(), sort_keys=True), tensors)


@PAYLOAD_KEYS.register("le")
def _le_payload(conv, pre: bool) -> Hashable:
    return ("le", digest(conv.weight_1, conv.bias_1)) if pre else ROWS


@MESSAGE_KEYS.register("le")
def _le_message(conv, pre: bool) -> Hashable:
    # (source payload - destination's W_2 x_i) [* weight]; raw mode applies W_1 (+ b_1) per edge
    return ("le", pre, conv.uses_edge_weight, digest(conv.weight_1, conv.bias_1, conv.weight_2))


@PAYLOAD_KEYS.register("graphconv")
def _graphconv_payload(conv, pre: bool) -> Hashable:
    return ("linear", digest(conv.weight_rel)) if pre else ROWS


@MESSAGE_KEYS.register("graphconv")
def _graphconv_message(conv, pre: bool) -> Hashable:
    return WEIGHTED_PAYLOAD if conv.uses_edge_weight else PAYLOAD


def _hop_payload(conv, pre: bool) -> Hashable:
    # the first `width` columns of the row (all of it when the row carries nothing else) times
    # deg^-1/2 of the named statistic, as a weightless GCN round ships them
    base = ROWS if conv.carry == 0 else ("columns", conv.width)
    scale = (conv.required_stats[0], conv.uses_edge_weight) if conv.normalize else None
    return base if scale is None else ("deg_inv_sqrt", scale, base)


for _kind in ("tag_round", "appnp_round"):
    PAYLOAD_KEYS.register(_kind, _hop_payload)
    MESSAGE_KEYS.register(_kind, _gcn_message)


@PAYLOAD_KEYS.register("edge")
def _edge_payload(conv, pre: bool) -> Hashable:
    return ROWS


@MESSAGE_KEYS.register("edge")
def _edge_message(conv, pre: bool) -> Hashable:
    # nn over [x_i | x_j - x_i]: the destination payload is the row itself
    return ("edge", module_key(conv.nn))


@PAYLOAD_KEYS.register("transformer")
def _transformer_payload(conv, pre: bool) -> Hashable:
    if not pre:
        return ROWS
    return ("transformer", digest(conv.weight_key, conv.bias_key, conv.weight_value, conv.bias_value))


@MESSAGE_KEYS.register("transformer")
def _transformer_message(conv, pre: bool) -> Hashable:
    # the logit reads the destination's query and, in raw mode, forms key and value per edge;
    # with edge_dim lin_edge of the edge's attributes is added to both
    tensors = digest(
        conv.weight_key,
        conv.bias_key,
        conv.weight_query,
        conv.bias_query,
        conv.weight_value,
        conv.bias_value,
        conv.weight_edge,
    )
    return ("transformer", pre, conv.heads, conv.channels, conv.edge_attr_dim, tensors)


@PAYLOAD_KEYS.register("gen")
def _gen_payload(conv, pre: bool) -> Hashable:
    # lin_src of the row (in != out), else the row itself
    return ROWS if conv.weight_src is None else ("linear_bias", digest(conv.weight_src, conv.bias_src))


@MESSAGE_KEYS.register("gen")
def _gen_message(conv, pre: bool) -> Hashable:
    # relu(payload [+ lin_edge(e)]) + eps, with the softmax logits scaled by t
    options = json.dumps(conv.aggr_options, sort_keys=True)
    tensors = digest(conv.weight_edge, conv.bias_edge)
    return ("gen", conv.aggr, options, conv.eps, conv.edge_attr_dim, tensors)


@PAYLOAD_KEYS.register("pna")
def _pna_payload(conv, pre: bool) -> Hashable:
    return ROWS


@MESSAGE_KEYS.register("pna")
def _pna_message(conv, pre: bool) -> Hashable:
    # the towers' pre stacks over [destination row | source row | edge_encoder(e)]
    towers = (conv.towers, conv.divide_input, conv.f_in)
    return ("pna", towers, tuple(module_key(nn) for nn in conv.pre_nns), module_key(conv.edge_encoder))
