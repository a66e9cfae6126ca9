"""numpy references shared by the PE tests (a unique module name: tests import it by name)."""

import numpy as np


def dense(gd):
    """(ids, in_deg, out_deg, A) with A[i][j] = #edges j->i / in_deg(i) (dense indices)."""
    n = len(gd.ids)
    pos = {int(v): k for k, v in enumerate(gd.ids)}
    cnt = np.zeros((n, n))
    for s, d in zip(gd.src_ids, gd.dst_ids, strict=True):
        cnt[pos[int(d)], pos[int(s)]] += 1  # row = node, column = in-neighbour
    ind, outd = cnt.sum(1), cnt.sum(0)
    a = np.divide(cnt, ind[:, None], out=np.zeros_like(cnt), where=ind[:, None] > 0)
    return np.asarray(gd.ids), ind, outd, a


def psgs_matrix(a, ind, fanouts):
    """Quiver 4.1 literally: Q = 1 + sum_k A^(k-1) min(deg, l_k), with explicit matrix powers."""
    q = np.ones(len(ind))
    for k, l in enumerate(fanouts, start=1):
        q += np.linalg.matrix_power(a, k - 1) @ np.minimum(ind, l)
    return q
