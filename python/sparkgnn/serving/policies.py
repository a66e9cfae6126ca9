"""SRPE recomputation policies (OMEGA section 5.2): which candidates to recompute within budget
gamma. A registry, so the mode, the CLI and the benchmark pick a policy by name.

Candidates R = the existing vertices that are inputs of the last layer, i.e. sources of request
edges into Q (the only vertices whose stored value enters the queries' answers directly). Each
policy scores R; the top ceil(gamma |R|) are recomputed (ties: lower index first). The selection
is global over the request (equivalent to OMEGA's all-gather of recomputation targets).

    qer     top-query-edges-ratio |N_Q(u)| / |N(u)| (the paper's policy, section 5.2.2): N_Q(u)
            the in-edges of u from Q, N(u) all in-edges of u in the union graph
    is      importance score IS(u) = 1/deg(u) * sum_{v in N(u)} 1/deg(v) (G in-degrees)
    random  uniform, seeded by (seed, request id)
    ae      oracle: the true approximation error sum_{l<k} ||h_u^(l) - PE_u^(l)||, from EXACT's
            recomputation of the candidates (evaluation only: it costs more than FULL's answer)
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from sparkgnn import npsets
from sparkgnn.registry import Registry
from sparkgnn.serving.modes import ModeError

POLICIES: Registry = Registry("SRPE policy", ModeError)


def register_policy(name: str):
    return POLICIES.register(name)


def candidates(prep, ctx=None) -> np.ndarray:
    """Sorted G vertices with a request edge into a query."""
    n = prep.num_g
    sel = (prep.dst >= n) & (prep.src < n)
    return ctx.sets.unique(prep.src[sel]) if ctx is not None else npsets.unique(prep.src[sel])


def select(scores: np.ndarray, cands: np.ndarray, gamma: float) -> np.ndarray:
    budget = min(len(cands), int(math.ceil(gamma * len(cands) - 1e-9)))
    if budget <= 0:
        return np.empty(0, np.int64)
    order = np.lexsort((cands, -scores))  # score descending, then index
    return np.sort(cands[order[:budget]])


@register_policy("qer")
def qer_scores(ctx, prep, cands, mode) -> np.ndarray:
    n = prep.num_g
    into_g = prep.dst[(prep.dst < n) & (prep.src >= n)]
    pos = ctx.sets.positions(cands, into_g)
    nq = np.bincount(pos[pos >= 0], minlength=len(cands))
    deg = ctx.g_in_degree()[cands] + nq
    return np.where(deg > 0, nq / np.maximum(deg, 1), 0.0)


@register_policy("is")
def is_scores(ctx, prep, cands, mode) -> np.ndarray:
    if getattr(ctx, "_importance", None) is None:
        deg = ctx.g_in_degree().astype(np.float64)
        inv = np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0)
        dst = np.repeat(np.arange(ctx.num_nodes), np.diff(ctx.indptr))
        ctx._importance = inv * np.bincount(dst, weights=inv[ctx.in_src], minlength=ctx.num_nodes)
    return ctx._importance[cands]


@register_policy("random")
def random_scores(ctx, prep, cands, mode) -> np.ndarray:
    rng = np.random.default_rng([mode.seed, zlib.crc32(prep.request.request_id.encode())])
    return rng.random(len(cands))


@register_policy("ae")
def ae_scores(ctx, prep, cands, mode) -> np.ndarray:
    return mode.approximation_errors(ctx, prep, cands)
