"""The lossless check knows float near-ties: a first difference where greedy's top two logits are
closer than the dtype's noise (engine.NEAR_TIE) is said as "identical up to a float near-tie at
token k" and counted apart from a real difference, in the API, the Run tab's badge and Compare."""

import pytest

from decoders import engine
from decoders.engine import NEAR_TIE, compare_tokens, greedy_reference, near_tie_gap, with_near_tie
from ui.compare import headline
from ui.live import greedy_check
from visualizer.tokens import lossless_badge_html

PROMPT = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def reference(tiny):
    return greedy_reference(tiny, PROMPT, 8)


def flipped(reference: list[int], k: int) -> list[int]:
    return [*reference[:k], (reference[k] + 1) % 1000, *reference[k + 1 :]]


def test_the_gap_is_greedys_top_two_margin_at_the_difference(tiny, reference):
    gap = near_tie_gap(tiny, PROMPT, reference[:3])
    assert gap > NEAR_TIE["float32"]  # the tiny model is peaked: no near-ties on it
    check = with_near_tie(tiny, PROMPT, reference, compare_tokens(reference, flipped(reference, 3)))
    assert (check.first_divergence, check.gap, check.near_tie) == (3, gap, False)
    assert check.describe() == "differs from greedy at generated token 3"


def test_a_difference_on_a_tie_is_counted_apart(tiny, reference, monkeypatch):
    monkeypatch.setattr(engine, "near_tie_gap", lambda *a: 2e-4)
    check = with_near_tie(tiny, PROMPT, reference, compare_tokens(reference, flipped(reference, 5)))
    assert check.near_tie and not check.identical
    assert check.describe().startswith("identical up to a float near-tie at generated token 5")
    badge = greedy_check(tiny, PROMPT, reference, flipped(reference, 5))
    assert badge["status"] == "near_tie" and badge["first_divergence"] == 5
    html = lossless_badge_html(badge)
    assert "identical up to a float near-tie at token 5" in html and "✗" not in html
    # a tie needs the gap inside the tolerance: at the tolerance itself it is a real difference
    monkeypatch.setattr(engine, "near_tie_gap", lambda *a: NEAR_TIE["float32"])
    assert greedy_check(tiny, PROMPT, reference, flipped(reference, 5))["status"] == "differs"


def test_compares_headline_names_a_tie_apart_from_a_difference():
    row = {"speedup": 1.5, "identical": False, "first_divergence": 7, "lossy": False}
    rows = [
        {"method": "autoregressive", "speedup": 1.0, "identical": True, "lossy": False},
        {**row, "method": "lookahead", "near_tie": True},
        {**row, "method": "jacobi", "near_tie": False, "first_divergence": 2},
    ]
    text = headline(rows)
    assert "lookahead identical up to a float near-tie at token 7" in text
    assert "jacobi differs at token 2" in text and "0 of 2 outputs identical" in text
