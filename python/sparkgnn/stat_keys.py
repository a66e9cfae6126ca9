"""Keys of the per-vertex statistics (layers/stats.py) as a conv reads them: a statistic's name
plus whether the conv's edge weights count in it.

Why keyed: one engine run carries statistics for several convs, and a conv converted without edge
weights (PyG forward `conv(x, edge_index)`) normalises by degrees that count every edge as 1,
while a weighted one sums the weights; both can read `gcn_degree` in the same model. The batch
engine's prepared layouts, the pruned runs and the Spark refresh all key them this way. No torch
here: the engine's Spark tasks import it.
"""

from __future__ import annotations

WEIGHTED_SUFFIX = "_w"


def stat_key(conv, name: str) -> str:
    """The key of statistic `name` as `conv` reads it: `<name>_w` when the conv's edge weights count
    (its statistics sum them), `name` when they do not (every edge counts 1, PyG's forward without
    edge_weight). Engines that carry statistics for several convs key them this way, so a layer
    converted without weights never reads a weighted degree."""
    return f"{name}{WEIGHTED_SUFFIX}" if conv.uses_edge_weight else name


def stat_keys(convs) -> tuple[str, ...]:
    """Every statistic key (stat_key) the convs read, sorted."""
    return tuple(sorted({stat_key(conv, name) for conv in convs for name in conv.required_stats}))


def split_key(key: str) -> tuple[str, bool]:
    """(statistic name, whether edge weights count) of a stat_key."""
    if key.endswith(WEIGHTED_SUFFIX):
        return key[: -len(WEIGHTED_SUFFIX)], True
    return key, False


def conv_stats(conv, keyed: dict) -> dict:
    """{name: values} of the statistics `conv` reads, from values keyed by stat_key; a missing key is
    a KeyError naming it."""
    return {name: keyed[stat_key(conv, name)] for name in conv.required_stats}
