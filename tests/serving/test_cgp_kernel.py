"""cgp_kernel.merge_partials: a single block holding one row per target, in target order, is the
merged state itself (what merging it with the identity gives); any other set of blocks is merged
by the aggregator. Checked against the aggregator's own merge for every aggregator family."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.serving.cgp_kernel import merge_partials

WIDTH = 6  # message width; softmax with 2 heads reads 2 logits + 2 x 2 channels


def conv_with(name: str, **options):
    agg = get_aggregator(name, **options)
    return SimpleNamespace(aggregator=agg, msg_width=lambda pre_transform: WIDTH)


def block(agg, index: np.ndarray, num: int, seed: int) -> torch.Tensor:
    """A partial state for targets `index` (each with two messages) as the kernel builds one."""
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(2 * len(index), WIDTH, generator=gen)
    local = torch.from_numpy(np.repeat(np.arange(len(index)), 2))
    return agg.partial(m, local, len(index))


AGGREGATORS = [("sum", {}), ("mean", {}), ("max", {}), ("min", {}), ("var", {}), ("softmax", {"heads": 2})]


@pytest.mark.parametrize("name,options", AGGREGATORS, ids=[a for a, _ in AGGREGATORS])
def test_one_block_covering_every_target_in_order_is_the_merged_state(name, options):
    conv = conv_with(name, **options)
    agg = conv.aggregator
    index = np.arange(5)
    state = block(agg, index, 5, seed=1)
    merged = merge_partials(conv, [state], [index], 5)
    expected = agg.merge(state, torch.from_numpy(index), 5)
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name,options", AGGREGATORS, ids=[a for a, _ in AGGREGATORS])
@pytest.mark.parametrize(
    "index",
    [np.array([0, 1, 3, 4]), np.array([1, 2, 3, 4, 0]), np.array([0, 1, 1, 4, 4])],
    ids=["a target without a row", "rows out of order", "a target twice"],
)
def test_a_block_that_does_not_cover_each_target_once_in_order_is_merged(name, options, index):
    conv = conv_with(name, **options)
    agg = conv.aggregator
    state = block(agg, index, 5, seed=2)
    merged = merge_partials(conv, [state], [index], 5)
    expected = agg.merge(state, torch.from_numpy(index), 5)
    assert merged.shape[0] == 5
    torch.testing.assert_close(merged, expected, rtol=0, atol=0)


def test_several_blocks_are_merged_even_when_each_covers_every_target():
    conv = conv_with("sum")
    agg = conv.aggregator
    index = np.arange(4)
    a, b = block(agg, index, 4, seed=3), block(agg, index, 4, seed=4)
    merged = merge_partials(conv, [a, b], [index, index], 4)
    torch.testing.assert_close(merged, a + b)


def test_a_half_precision_block_comes_back_as_float32():
    conv = conv_with("mean")
    index = np.arange(3)
    state = block(conv.aggregator, index, 3, seed=5).to(torch.float16)
    merged = merge_partials(conv, [state], [index], 3)
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged, state.to(torch.float32), rtol=0, atol=0)
