"""Kangaroo's two views (the confidence view: η and the verdicts; the layer view: the tokens
through each part of the model), on synthetic traces, a migrated version-1 trace, a runner-up the
target took, a very deep model, and a real run.
"""

from __future__ import annotations

import pytest
from test_kangaroo import (
    by_step,
    one_torch_thread,  # noqa: F401  (autouse)
    run,
)

from conftest import PROMPTS
from decoders import METHODS
from decoders.core.events import Commit, Draft, DraftStop, Forward, Prefill, Verify
from decoders.core.tree import chain

# --- the views -----------------------------------------------------------------------------------

TEXTS = {5: "a", 6: " the", 7: " quick", 8: "\n", 9: " fox", 10: " jumps", 11: " brown"}


def synthetic_run(n_layers: int = 30, exit_layer: int = 2) -> list:
    """A prefill, then one step that drafts five tokens (the last below η) and accepts three."""
    return [
        Prefill((1, 2, 3)),
        Forward(0, "prefill", 3, n_layers, 40.0),
        Forward(0, "draft", 3, 1, 1.0),  # the adapter reads the prompt's layer-ℓ states
        Commit(0, (5,), ("target",), (0.9,)),
        *(Forward(1, "draft", 1, exit_layer + 1, 4.0, exit_layer, 1) for _ in range(5)),
        DraftStop(1, 0.6, (0.95, 0.9, 0.8, 0.7, 0.4), "confidence"),
        Draft(1, "kangaroo: exit at layer 2 + adapter", (6, 7, 8, 9, 10), chain(5), (0.9,) * 5),
        Forward(1, "verify", 6, n_layers, 20.0, exit_layer, 1),  # d5 runs layers 1..ℓ here
        Verify(1, (0, 1, 2), 11, "greedy-chain"),
        Commit(1, (6, 7, 8, 11), ("draft",) * 3 + ("correction",), (0.5,) * 4),
    ]


def notes(fig) -> str:
    text = " ".join(a.text for a in fig.layout.annotations)
    return text.replace("<br>", " ").replace("\u00a0", " ")


def test_confidence_view_draws_eta_and_the_verdicts():
    from visualizer.panels import method_panel
    from visualizer.tokens import COLOURS

    fig = method_panel(METHODS["kangaroo"].views, synthetic_run(), TEXTS, 1)
    bars, eta = fig.data
    assert list(bars.y) == [0.95, 0.9, 0.8, 0.7, 0.4]
    assert list(bars.marker.color) == [COLOURS["draft"]] * 3 + [
        COLOURS["rejected"],
        COLOURS["pending"],
    ]
    assert set(eta.y) == {0.6} and eta.line.dash == "dash" and eta.name.startswith("η = 0.60")
    assert fig.layout.title.text == "Step 1: drafted 5, accepted 3"
    text = notes(fig)
    assert "' jumps'" in text and "0.40 is below η = 0.60" in text
    assert "layers 1–2 + the adapter" in text and "20% of the time" in text  # 4 ms of 20 ms
    assert "step 0 is the prefill" in notes(
        method_panel(METHODS["kangaroo"].views, synthetic_run(), TEXTS, 0)
    )


def test_layer_view_counts_the_tokens_through_each_part():
    from visualizer.panels import extra_panels

    (fig,) = extra_panels(METHODS["kangaroo"].views, synthetic_run(), TEXTS, 1)
    drafting, verifying = fig.data
    assert (drafting.name, verifying.name) == ("drafting", "the verify pass")
    rows = list(drafting.y)  # bottom to top: the shallow layers, the adapter, the deep layers
    assert rows == ["layer 1", "layer 2", "adapter + head", *(f"layer {i}" for i in range(3, 31))]
    assert list(drafting.x) == [5, 5, 5] + [0] * 28  # x, d1..d4 through layers 1-2 and the adapter
    assert list(verifying.x) == [1, 1, 0] + [6] * 28  # d5 through 1-2, all six through 3-30
    assert fig.layout.title.text == "Step 1: exit at layer 2 of 30"
    text = notes(fig)
    assert "5 forwards of layers 1–2 and the adapter" in text and "(20.0 ms in all)" in text
    assert "layers 3–30 over 6 tokens" in text and "Every token ran layers 1–2 once." in text
    assert {a.text for a in fig.layout.annotations} >= {"shallow (drafting)", "verifying"}
    # Step 0: the prefill ran the prompt through every layer, the adapter read its states.
    (prefill,) = extra_panels(METHODS["kangaroo"].views, synthetic_run(), TEXTS, 0)
    adapter, full = prefill.data
    assert list(adapter.x) == [0, 0, 3] + [0] * 28 and list(full.x) == [3, 3, 0] + [3] * 28


def runner_up_run() -> list:
    """A prefill, then one step that drafts three tokens with a runner-up beside each, rejects
    the second drafted token and takes the runner-up beside it."""
    return [
        *synthetic_run()[:4],
        *(Forward(1, "draft", 1, 3, 4.0, 2, 1) for _ in range(3)),
        DraftStop(1, 0.3, (0.95, 0.5, 0.2), "confidence"),
        Draft(
            1,
            "kangaroo: exit at layer 2 + adapter + runners-up",
            (6, 7, 8, 9, 10, 11),
            (-1, 0, 1, -1, 0, 1),
            (0.95, 0.5, 0.2, 0.03, 0.3, 0.1),
        ),
        Forward(1, "verify", 7, 30, 21.0, 2, 4),  # d3 and the three runners-up through 1..ℓ
        Verify(1, (0, 4), 5, "greedy-tree"),
        Commit(1, (6, 10, 5), ("draft", "draft", "correction"), (0.5,) * 3),
    ]


def test_a_version_1_trace_is_migrated_to_say_where_its_passes_were_split():
    """Traces written before Forward said where a pass was split (schema version 1) still open:
    the split and the shallow inputs are filled in on reading, in one place, as they were
    inferred then; the views read the fields only."""
    import dataclasses
    import json

    from decoders.core.tracefile import trace_from_json, trace_to_dict

    new = synthetic_run()
    old = [dataclasses.replace(e, split=0, shallow=0) if isinstance(e, Forward) else e for e in new]
    data = trace_to_dict({"method": "kangaroo"}, old) | {"version": 1}
    _, events = trace_from_json(json.dumps(data))
    assert events == new
    _, others = trace_from_json(json.dumps(data | {"method": "token_tree"}))
    assert others == old  # only the methods that split their passes had anything to fill in
    with pytest.raises(Exception, match="schema version 0 is not supported"):
        trace_from_json(json.dumps(data | {"version": 0}))


def test_views_show_the_runner_up_the_target_took():
    from visualizer.panels import extra_panels, method_panel
    from visualizer.tokens import COLOURS

    fig = method_panel(METHODS["kangaroo"].views, runner_up_run(), TEXTS, 1)
    bars = fig.data[0]
    assert list(bars.y) == [0.95, 0.5, 0.2]  # the drafted chain only: runners-up are not bars
    assert list(bars.marker.color) == [COLOURS["draft"], COLOURS["rejected"], COLOURS["pending"]]
    text = notes(fig)
    assert (
        "3 runners-up" in text and "took ' jumps', the adapter's 2nd choice at position 2" in text
    )
    assert fig.layout.title.text == "Step 1: drafted 3, accepted 1 + a runner-up"
    (layers,) = extra_panels(METHODS["kangaroo"].views, runner_up_run(), TEXTS, 1)
    drafting, verifying = layers.data
    assert list(drafting.x)[:3] == [3, 3, 3]  # x, d1, d2 drafting
    assert list(verifying.x) == [4, 4, 0] + [7] * 28  # d3 and the 3 runners-up; all 7 deep
    assert "the last draft token and 3 runners-up ran layers 1–2 there" in notes(layers)
    assert "Every token ran layers 1–2 once." in notes(layers)


def test_layer_view_of_a_very_deep_model_draws_three_blocks():
    from visualizer.kangaroo_view import kangaroo_layers

    fig = kangaroo_layers(synthetic_run(n_layers=1000, exit_layer=7), TEXTS, 1)
    assert list(fig.data[0].y) == ["layers 1–7", "adapter + head", "layers 8–1000"]
    assert list(fig.data[1].x) == [1, 0, 6]
    assert fig.layout.height < 600


def test_views_of_a_real_run(tiny):
    from visualizer.panels import extra_panels, method_panel

    res = run(tiny, PROMPTS[4], 14, exit_layer="2", eta=0.0, gamma=3)
    steps = by_step(res.events)
    for step, ev in steps.items():
        conf = method_panel(METHODS["kangaroo"].views, res.events, {}, step)
        (layers,) = extra_panels(METHODS["kangaroo"].views, res.events, {}, step)
        assert layers.layout.title.text == f"Step {step}: exit at layer 2 of 4"
        by_name = {t.name: list(t.x) for t in layers.data}
        if step == 0:
            assert conf.layout.title.text == "Step 0"
            continue
        drafted = len(ev["draft"].tokens) if "draft" in ev else 0
        shallow = by_name.get("drafting", [0] * 5)[0] + by_name["the verify pass"][0]
        assert shallow == by_name["the verify pass"][-1] == drafted + 1  # never twice
        if drafted:
            assert list(conf.data[0].y) == list(ev["draftstop"].confidences)
        else:
            assert conf.layout.title.text == f"Step {step}: no draft"
