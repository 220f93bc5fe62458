"""Early exit's trace checks and views: a lossy run's badge, corrupt layer exits, relaxed nodes
and catch-ups refused by name; the views draw where tokens left and why, what only the relaxation
accepted, and an early-exit run as a point on its benchmarked curve.
"""

from __future__ import annotations

import json

import pytest
from test_calm import (
    exits_of,
    one_torch_thread,  # noqa: F401  (autouse)
)

from conftest import PROMPTS
from decoders import METHODS, generate
from decoders.core.events import Verify

# --- trace checks and views ------------------------------------------------------------------------


def live_trace(method: str, **params):
    from ui.live import run_live

    *_, last = run_live("tiny-random", PROMPTS[0], method, 12, params, check_lossless=True)
    return last.trace


def test_a_lossy_run_gets_a_lossy_badge_never_identical():
    trace = live_trace("calm", threshold=0.0, min_depth=0.0)
    badge = trace.meta["lossless"]
    assert badge["status"] == "lossy" and 0 <= badge["agreement"] <= 1 and "rouge_l" in badge
    assert "nll" in badge and "nll_greedy" in badge


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e.update(layer=99), "layer must be in 1..n_layers"),
        (lambda e: e.update(n_layers=7), "layer must be in 1..n_layers"),
        (lambda e: e.update(layers=[3, 1], confidences=[0.1, 0.2]), "layers must rise"),
        (lambda e: e.update(confidences=[]), "one confidence each"),
        (lambda e: e.update(confidences=[1.5] * len(e["layers"])), r"probabilities must be in"),
        (lambda e: e.update(rule="magic"), "rule must be one of confidence, hash"),
        (lambda e: e.update(position=999), "position must be the"),
    ],
)
def test_a_corrupt_layer_exit_is_refused_with_a_message(change, message):
    from decoders.core.errors import TraceError
    from ui.traces import read_trace

    data = json.loads(live_trace("calm", threshold=0.0, min_depth=0.0).to_json())
    first = next(e for e in data["events"] if e["type"] == "LayerExit")
    change(first)
    with pytest.raises(TraceError, match=message):
        read_trace(json.dumps(data))


def test_two_exits_in_one_step_are_refused():
    from decoders.core.errors import TraceError
    from ui.traces import read_trace

    data = json.loads(live_trace("hash_ee", min_depth=0.0).to_json())
    i, first = next((i, e) for i, e in enumerate(data["events"]) if e["type"] == "LayerExit")
    data["events"].insert(i, dict(first))
    with pytest.raises(TraceError, match="exits twice"):
        read_trace(json.dumps(data))


def test_the_views_draw_where_tokens_left_and_why(tiny):
    from visualizer.exit_view import exit_confidence, exit_heatmap
    from visualizer.exit_view import hash_layers as hash_table
    from visualizer.panels import extra_panels, method_panel

    res = generate(tiny, PROMPTS[0], "calm", 16, chat=False, threshold=0.3, min_depth=0.0)
    texts = {t: tiny.token_text(t) for t in res.token_ids}
    heat = exit_heatmap(res.events, texts, 5)
    marks = next(t for t in heat.data if t.name == "left the model here")
    now = next(e for e in exits_of(res) if e.step == 5)
    near = [e for e in exits_of(res) if e.position <= now.position + 8]  # the window around it
    assert list(marks.x) == [e.position for e in near] and heat.data[0].type == "heatmap"
    assert list(marks.y) == [f"ℓ {e.layer}" if e.layer < 4 else "4 (full)" for e in near]
    assert "shown: tokens" in heat.layout.title.subtitle.text.replace("<br>", " ")  # it says so
    long = generate(tiny, PROMPTS[0], "calm", 48, chat=False, threshold=0.3, min_depth=0.0)
    window = exit_heatmap(long.events, texts, 2)
    first, last = window.data[-1].x[0], window.data[-1].x[-1]
    assert f"shown: tokens {first}–{last}" in window.layout.title.subtitle.text.replace("<br>", " ")
    conf = exit_confidence(res.events, texts, 5)
    assert list(conf.data[0].y) == list(now.confidences)
    assert any(s.y0 == pytest.approx(now.threshold) for s in conf.layout.shapes)  # the λ_t line
    subtitle = conf.layout.title.subtitle.text.replace("\u00a0", " ")
    assert f"λ_t = {now.threshold:.3f}" in subtitle  # its value, in the subtitle
    assert (
        method_panel(METHODS["calm"].views, res.events, texts, 5).layout.title.text
        == heat.layout.title.text
    )
    assert [
        f.layout.title.text for f in extra_panels(METHODS["calm"].views, res.events, texts, 5)
    ] == [conf.layout.title.text]

    # The oracle weighs no confidence (1 = the exit gives the full model's token): no λ_t line.
    peeked = generate(tiny, PROMPTS[0], "calm", 16, chat=False, confidence="oracle", min_depth=0.0)
    step = next(e.step for e in exits_of(peeked) if e.layers)
    oracle = exit_confidence(peeked.events, texts, step)
    assert not oracle.layout.shapes and "λ" not in oracle.layout.title.subtitle.text
    assert "the full model's token" in oracle.layout.title.subtitle.text
    assert oracle.layout.yaxis.title.text == "oracle score"
    heat = exit_heatmap(peeked.events, texts, step)
    assert (
        "λ" not in heat.layout.title.subtitle.text and "oracle" in heat.layout.title.subtitle.text
    )
    assert heat.data[0].colorbar.title.text == "oracle score"
    assert "λ" not in " ".join(h for row in heat.data[0].text for h in row)

    hashed = generate(tiny, PROMPTS[0], "hash_ee", 16, chat=False, min_depth=0.0)
    table = hash_table(hashed.events, texts, 3)
    inputs, layers, _ = table.data[0].cells.values
    assert len(inputs) == len(set(hashed.token_ids[:15])) and all(layers)
    # views of another method's trace say so instead of drawing nothing
    other = generate(tiny, PROMPTS[0], "autoregressive", 4, chat=False)
    message = exit_heatmap(other.events, texts, 1).layout.annotations[0].text
    assert "not a calm, free or hash_ee run" in message.replace("<br>", " ")


def test_the_draft_views_mark_what_only_the_relaxation_accepted(tiny):
    from visualizer.figures import draft_panel
    from visualizer.tokens import COLOURS
    from visualizer.tree_view import token_tree

    # The tree at a fixed size: sized to this machine, tiny-random's unsure drafts would not pay.
    for method, view, extra in (
        ("speculative", draft_panel, {}),
        ("token_tree", token_tree, {"size": "fixed"}),
    ):
        res = generate(tiny, PROMPTS[5], method, 40, chat=False, beta=10, tolerance=20.0, **extra)
        texts = {t: tiny.token_text(t) for t in res.token_ids}
        steps = [e.step for e in res.events if isinstance(e, Verify) and e.relaxed]
        assert steps, method  # β = 10 within 20 nats keeps some of tiny-random's drafts
        fig = view(res.events, texts, steps[0])
        colours = [
            c
            for t in fig.data
            for c in (
                t.marker.color if isinstance(t.marker.color, tuple | list) else [t.marker.color]
            )
        ]
        assert COLOURS["relaxed"] in colours, method


def test_a_trace_whose_relaxed_nodes_were_not_accepted_is_refused(tiny):
    from decoders.core.errors import TraceError
    from ui.live import run_live
    from ui.traces import read_trace

    params = {"beta": 10, "tolerance": 20.0}
    *_, last = run_live("tiny-random", PROMPTS[5], "speculative", 24, params, check_lossless=False)
    data = json.loads(last.trace.to_json())
    verify = next(e for e in data["events"] if e["type"] == "Verify")
    verify["relaxed"] = [len(verify["accepted"])]  # a node past the accepted path
    with pytest.raises(TraceError, match="relaxed nodes must be among the accepted"):
        read_trace(json.dumps(data))


def test_a_catch_up_of_a_token_that_never_left_early_is_refused(tiny):
    from decoders.core.errors import TraceError
    from ui.live import run_live
    from ui.traces import read_trace

    params = {"exit_layer": "2", "threshold": 0.0016}
    *_, last = run_live("tiny-random", PROMPTS[0], "free", 30, params, check_lossless=False)
    data = json.loads(last.trace.to_json())
    read_trace(json.dumps(data))  # as recorded: fine
    full = {e["position"] for e in data["events"] if e["type"] == "LayerExit" and e["layer"] == 4}
    catch = [e for e in data["events"] if e["type"] == "CatchUp"][-1]  # a late one
    earlier = [p for p in sorted(full) if p < catch["positions"][0]]
    assert earlier
    catch["positions"] = sorted([earlier[0], *catch["positions"]])
    catch["agreed"] = [True, *catch["agreed"]]
    with pytest.raises(TraceError, match="tokens that left at an early exit"):
        read_trace(json.dumps(data))


def test_an_early_exit_run_is_drawn_as_a_point_on_its_benchmarked_curve(monkeypatch, tmp_path):
    import ui.common
    from ui.run_views import result_panel

    trace = live_trace("calm", threshold=0.0, min_depth=0.0)
    points = [
        {"spec": "calm", "method": "calm", "agreement": 0.8, "layers_per_token": 0.97},
        {"spec": "calm:threshold=0.9", "method": "calm", "agreement": 0.4, "layers_per_token": 0.9},
        {"spec": "hash_ee", "method": "hash_ee", "agreement": 0.1, "layers_per_token": 0.95},
    ]
    (tmp_path / "tiny-random.json").write_text(json.dumps({"points": points}))
    monkeypatch.setattr(ui.common, "QUALITY", tmp_path)
    fig = result_panel(trace)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["calm (benchmark)"].x) == [0.9, 0.97]  # the curve, in order of compute
    star = by_name["this run"]
    assert list(star.y) == [trace.meta["lossless"]["agreement"]]
    assert list(star.x) == [trace.stats["layers_per_token"]]
    (tmp_path / "tiny-random.json").write_text("{not json")
    assert "this run" in {t.name for t in result_panel(trace).data}  # a bad file: the point alone
    other = live_trace("prompt_lookup")
    assert result_panel(other).layout.title.text == "Acceptance"
