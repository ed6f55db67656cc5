"""The largest other layer of a step (rules/layers.py), against its plain definition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.rules.layers import NO_STEP, LayerGroup, is_bias

TAGS = [f"grad_norm/l{i}" for i in range(6)]


def brute(
    latest: dict[str, tuple[int, float]], step: int, previous: int, than: str
) -> float | None:
    """Each other layer's newest value, if logged at this step or the step before."""
    since = previous if previous != NO_STEP else step
    values = [v for t, (s, v) in latest.items() if t != than and s >= since]
    return max(values) if values else None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(TAGS), st.integers(0, 3), st.floats(0, 10)),
        min_size=1,
        max_size=60,
    )
)
def test_the_largest_is_the_newest_values_largest(pushes: list[tuple[str, int, float]]) -> None:
    group, latest = LayerGroup(), {}
    step = previous = NO_STEP
    at = 0
    for tag, advance, value in pushes:
        at += advance  # steps never go back here (a rewind is tested below)
        if at > step:
            previous, step = step, at
        latest[tag] = (at, value)
        group.push(tag, at, value)
        for than in TAGS:
            found = group.largest(than)
            assert (found[1] if found else None) == brute(latest, step, previous, than)


def test_a_rewind_compares_afresh() -> None:
    group = LayerGroup()
    group.push("a", 100, 5.0)
    group.push("b", 100, 1.0)
    group.push("b", 50, 1.0)  # resumed from a checkpoint
    assert group.largest("b") is None


def test_biases_by_their_names() -> None:
    assert is_bias("grad_2.0_norm/net.0.bias")
    assert is_bias("grad_norm/encoder.self_attn.in_proj_bias")
    assert is_bias("grad_norm/lstm.bias_ih_l0")
    assert is_bias("grad_norm/bias")
    assert not is_bias("grad_norm/net.0.weight")
    assert not is_bias("probe/grad_norm/biased_head")
    assert not is_bias("grad_norm/encoder.layers.0")
