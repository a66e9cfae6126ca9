"""`Registry`: decorator and direct registration, a name registered twice is refused, an unknown
name is refused as the registry's own error type listing the known names; and the registries
built on it keep that behaviour."""

import pytest

from sparkgnn.registry import Registry


class WidgetError(ValueError):
    pass


def test_decorator_and_direct_forms():
    reg = Registry("widget", WidgetError)

    @reg.register("b")
    def make_b():
        return "b"

    direct = object()
    assert reg.register("a", direct) is direct  # direct form returns the object
    assert make_b() == "b"  # decorator form returns it unchanged
    assert reg.lookup("a") is direct and reg.lookup("b") is make_b
    assert reg.names() == ["a", "b"]
    # still a plain dict for callers that index or iterate
    assert "a" in reg and reg["b"] is make_b and sorted(reg) == ["a", "b"]


def test_registering_a_name_twice_is_refused():
    reg = Registry("widget", WidgetError)
    reg.register("a", 1)
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        reg.register("a", 2)
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        reg.register("a")(lambda: None)
    assert reg["a"] == 1  # the first registration stands


def test_unknown_name_is_the_given_error_listing_the_known_names():
    reg = Registry("widget", WidgetError)
    reg.register("beta", 2)
    reg.register("alpha", 1)
    with pytest.raises(WidgetError) as info:
        reg.lookup("gamma")
    assert str(info.value) == "unknown widget 'gamma'; known: alpha, beta"
    with pytest.raises(WidgetError, match="unknown widget"):
        reg.lookup(["not", "hashable"])


def test_default_error_is_value_error_and_empty_registry():
    reg = Registry("widget")
    with pytest.raises(ValueError, match=r"^unknown widget 'x'; known: $"):
        reg.lookup("x")


def test_sparkgnn_registries_refuse_with_their_own_error_types():
    from sparkgnn.datasets.registry import DATASETS, entry
    from sparkgnn.layers.aggregators import get_aggregator
    from sparkgnn.layers.base import build_conv
    from sparkgnn.layers.nodeops import ActivationOp, build_node_op
    from sparkgnn.layers.selfloops import apply_self_loops
    from sparkgnn.serving.modes import ModeError, get_mode
    from sparkgnn.serving.policies import POLICIES
    from sparkgnn.streaming.grouping import GroupingError, get_grouping

    cases = [
        (lambda: get_aggregator("lstm"), ValueError, "unknown aggregator 'lstm'; known: concat, max, mean"),
        (lambda: build_conv({"kind": "chebyshev"}), ValueError, "unknown conv kind 'chebyshev'; known: appnp"),
        (lambda: build_node_op({"op": "dropout"}), ValueError, "unknown node op 'dropout'; known: activation"),
        (lambda: ActivationOp("swish"), ValueError, "unknown activation 'swish'; known: elu, gelu"),
        (
            lambda: apply_self_loops([0], [1], None, 2, "all"),
            ValueError,
            "unknown self-loop policy 'all'; known: none, remaining, remove, replace",
        ),
        (lambda: get_mode("magic", None), ModeError, "unknown serving mode 'magic'; known: "),
        (lambda: POLICIES.lookup("best"), ModeError, "unknown SRPE policy 'best'; known: "),
        (lambda: get_grouping("sjf"), GroupingError, "unknown grouping policy 'sjf'; known: degree, fifo"),
        (lambda: entry("citeseer"), KeyError, "unknown dataset 'citeseer'; known: cora, imdb, lastfm"),
    ]
    for call, error, text in cases:
        with pytest.raises(error) as info:
            call()
        assert text in str(info.value), (text, str(info.value))
    assert isinstance(DATASETS, Registry)
