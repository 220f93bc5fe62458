"""Early exit (decoders/trained/exits.py, calm.py, hash_ee.py) and SpecDec's relaxed verification.

- With thresholds that never exit (λ = 1; HASH EE with min_depth = 1) each method is autoregressive
  greedy token for token, on tiny-random (placeholder exits) and on the embedded model (trained);
- state propagation writes exactly the cache entries the skipped layers own, from the exited
  state; the "compute" fill reproduces the full model's cache;
- exits, thresholds, the hash, the trace checks, the views, the trainer;
- relaxed verification: β = 1 is the exact rule, β > 1 keeps top-β drafts within τ and marks them.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import pytest
import torch

import conftest
from conftest import KERNEL_TOL as TOL
from conftest import PROMPTS, close, one_thread
from decoders import METHODS, InvalidParameter, generate
from decoders.core.events import CatchUp, Commit, Forward, LayerExit, Verify
from decoders.core.runtime import forward, new_cache
from decoders.core.sampling import Relax
from decoders.core.verify import greedy_chain, greedy_tree
from decoders.methods.calm import threshold_at
from decoders.methods.hash_ee import hash_layers
from decoders.trained.exits import exit_forward, exit_logits, load_exits, propagate

NEVER = [
    ("calm", {"threshold": 1.0, "min_depth": 0.0}),
    ("calm", {"threshold": 1.0, "min_depth": 0.0, "confidence": "saturation"}),
    ("calm", {"threshold": 1.0, "min_depth": 0.0, "confidence": "classifier"}),
    ("calm", {"threshold": 1.0, "tau": 4.0, "fill": "compute"}),
    ("calm", {"threshold": 1.0, "min_depth": 0.0, "confidence": "oracle"}),
    ("hash_ee", {"min_depth": 1.0}),
    ("free", {"exit_layer": "2", "threshold": 1.0}),
]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    with one_thread():
        yield


greedy = partial(conftest.greedy, chat=False)  # the raw prompts, as the runs here


def exits_of(res) -> list[LayerExit]:
    return [e for e in res.events if isinstance(e, LayerExit)]


# --- never exiting = greedy ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("method", "params"), NEVER)
@pytest.mark.parametrize("prompt", PROMPTS[:4])
def test_thresholds_that_never_exit_are_greedy(tiny, method, params, prompt):
    res = generate(tiny, prompt, method, 24, chat=False, **params)
    ref = greedy(tiny, prompt, 24)
    assert res.token_ids == ref.token_ids and res.finish_reason == ref.finish_reason
    exits = exits_of(res)
    assert len(exits) == len(res.token_ids) - 1  # every token after the prefill's
    assert all(e.layer == e.n_layers == tiny.n_layers for e in exits)
    assert res.stats["layers_per_token"] == 1.0
    assert {o for e in res.events if isinstance(e, Commit) for o in e.origins} == {"target"}


@pytest.mark.parametrize(("method", "params"), [NEVER[0], *NEVER[-2:]])
@pytest.mark.parametrize("budget", [1, 2, 7])
def test_the_budget_ends_them_like_greedy(tiny, method, params, budget):
    res = generate(tiny, PROMPTS[0], method, budget, chat=False, **params)
    ref = greedy(tiny, PROMPTS[0], budget)
    assert res.token_ids == ref.token_ids and res.finish_reason == "length"


@pytest.mark.parametrize(
    ("method", "params"), [NEVER[0], *NEVER[-2:], ("calm", {"threshold": 0.0})]
)
def test_an_eos_stops_them_where_it_is_written(tiny, method, params):
    """The run ends at the first end token it writes, exited or not, and keeps it."""
    free = generate(tiny, PROMPTS[1], method, 20, chat=False, **params).token_ids
    eos = free[6]
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    res = generate(bundle, PROMPTS[1], method, 20, chat=False, **params)
    assert res.finish_reason == "eos" and res.token_ids == free[: free.index(eos) + 1]


# --- exiting -----------------------------------------------------------------------------------------


def test_a_zero_threshold_exits_every_token_at_the_first_open_exit(tiny):
    res = generate(tiny, PROMPTS[0], "calm", 16, chat=False, threshold=0.0, min_depth=0.0)
    exits = exits_of(res)
    first = load_exits(tiny).exit_layers[0]
    assert all(e.layer == first and e.layers == (first,) for e in exits)
    origins = [o for e in res.events if isinstance(e, Commit) for o in e.origins]
    assert origins == ["target"] + ["exit"] * 15
    forwards = [e for e in res.events if isinstance(e, Forward) and e.kind == "target"]
    assert all(f.layers == first for f in forwards)
    assert res.stats["layers_per_token"] == pytest.approx(first / tiny.n_layers)


def test_the_compute_fill_exits_the_same_way_but_runs_every_layer(tiny):
    kw = dict(chat=False, threshold=0.0, min_depth=0.0)
    cheap = generate(tiny, PROMPTS[2], "calm", 16, **kw)
    true = generate(tiny, PROMPTS[2], "calm", 16, fill="compute", **kw)
    assert cheap.stats["layers_per_token"] == pytest.approx(1 / tiny.n_layers)
    assert true.stats["layers_per_token"] == 1.0  # the skipped layers ran, for the cache only
    assert all(e.layer == 1 for e in exits_of(true))  # the token still comes from the exit


def test_min_depth_keeps_the_shallow_exits_closed(tiny):
    res = generate(tiny, PROMPTS[0], "calm", 12, chat=False, threshold=0.0, min_depth=0.5)
    assert all(min(e.layers) >= 2 and e.layer == 2 for e in exits_of(res))


def test_the_threshold_decays_as_calm_writes_it():
    assert threshold_at(0.9, 0.0, 10, 64) == pytest.approx(0.9)
    assert threshold_at(0.9, 4.0, 0, 64) == pytest.approx(0.9)
    late = threshold_at(0.9, 4.0, 64, 64)
    assert late == pytest.approx(0.9 * (0.9 + 0.1 * torch.exp(torch.tensor(-4.0)).item()))


def test_each_token_records_its_threshold_and_confidences(tiny):
    res = generate(tiny, PROMPTS[3], "calm", 20, chat=False, threshold=0.5, tau=4.0, min_depth=0)
    for e in exits_of(res):
        assert e.threshold == pytest.approx(threshold_at(0.5, 4.0, e.position, 20), abs=1e-6)
        assert len(e.confidences) == len(e.layers) and all(0 <= c <= 1 for c in e.confidences)
        passed = [c > e.threshold for c in e.confidences]
        # it leaves at the first exit above the threshold, or runs the full model
        assert passed.count(True) <= 1 and (e.layer < e.n_layers) == any(passed)
        if any(passed):
            assert e.layer == e.layers[passed.index(True)] == e.layers[-1]


def test_an_exited_token_is_the_argmax_of_its_exit(tiny):
    """Replay the run's first exited token: the exit's argmax on the state after ℓ layers."""
    res = generate(tiny, PROMPTS[0], "calm", 3, chat=False, threshold=0.0, min_depth=0.0)
    exits = load_exits(tiny)
    prompt = tiny.encode(PROMPTS[0], chat=False)
    first = res.token_ids[0]
    out = forward(tiny, new_cache(tiny), [*prompt, first], step=0, kind="prefill", hidden_at=(1,))
    logits, _ = exit_logits(tiny, exits, 0, out.hidden[1][-1:])
    assert res.token_ids[1] == int(logits[-1].argmax())


def test_the_oracle_exits_where_an_exit_first_gives_the_full_models_token(tiny):
    """CALM's oracle peeks at the full model's token, then leaves at the first exit that gives it.
    With the true cache for the skipped layers nothing drifts: greedy token for token, while tokens
    still leave early; the peek is drawn but not counted as computed."""
    for prompt in PROMPTS[:3]:
        res = generate(
            tiny, prompt, "calm", 24, chat=False, confidence="oracle", min_depth=0.0, fill="compute"
        )
        assert res.token_ids == greedy(tiny, prompt, 24).token_ids
        exits = exits_of(res)
        assert any(e.layer < tiny.n_layers for e in exits)
        for e in exits:
            assert set(e.confidences) <= {0.0, 1.0}
            sure = [c == 1.0 for c in e.confidences]
            assert (e.layer < e.n_layers) == any(sure)
            if any(sure):
                assert e.layer == e.layers[sure.index(True)]
        peeks = [f for f in res.events if isinstance(f, Forward) and f.kind == "oracle"]
        assert len(peeks) == 23 and all(f.layers == tiny.n_layers for f in peeks)
        assert res.stats["target_forwards"] == 24  # the peeks are not target passes
        # tokens left early, but the skipped layers ran for the cache
        assert res.stats["exit_depth"] < 1.0 == res.stats["layers_per_token"]


def test_the_oracle_with_propagation_counts_only_the_layers_up_to_each_exit(tiny):
    res = generate(tiny, PROMPTS[2], "calm", 24, chat=False, confidence="oracle", min_depth=0.0)
    depths = [e.layer for e in exits_of(res)]
    assert min(depths) < tiny.n_layers
    assert res.stats["layers_per_token"] == pytest.approx(
        sum(depths) / len(depths) / tiny.n_layers, abs=1e-4
    )
    assert res.stats["exit_depth"] == pytest.approx(res.stats["layers_per_token"], abs=1e-4)
    assert "oracle" in res.stats["time_ms"]  # its wall-clock is honest: the peeks cost time


# --- the cache of skipped layers -----------------------------------------------------------------


def forced_exit(bundle, ell: int, fill: str):
    """Prefill PROMPTS[0], then feed one token that exits after `ell` layers; return the cache and
    the exited state (h after ell layers), the token and its position."""
    exits = load_exits(bundle)
    ids = bundle.encode(PROMPTS[0], chat=False)
    cache = new_cache(bundle)
    forward(bundle, cache, ids[:-1], step=0, kind="prefill")
    seen = {}

    def stop(i, layer, h, below):
        if layer == ell:
            seen["h"] = h
            return exit_logits(bundle, exits, i, h)[0]
        return None

    _, depth, event = exit_forward(
        bundle, exits, cache, ids[-1], len(ids) - 1, stop, fill=fill, step=1
    )
    assert depth == ell and event.layers == (ell if fill == "propagate" else bundle.n_layers)
    return cache, seen["h"], ids


def test_propagation_fills_exactly_the_skipped_layers_entries(tiny):
    ell = 2
    cache, h, ids = forced_exit(tiny, ell, "propagate")
    full = new_cache(tiny)
    forward(tiny, full, ids, step=0, kind="prefill")
    n = len(ids)
    for i, (mine, theirs) in enumerate(zip(cache.layers, full.layers, strict=True)):
        assert mine.keys.shape == theirs.keys.shape and mine.keys.shape[-2] == n
        # every earlier position is untouched, and the layers the token ran are the model's own
        upto = n if i < ell else n - 1  # (a prefill of n - 1 against one of n: KERNEL_TOL)
        torch.testing.assert_close(mine.keys[..., :upto, :], theirs.keys[..., :upto, :], **TOL)
        torch.testing.assert_close(mine.values[..., :upto, :], theirs.values[..., :upto, :], **TOL)
    # the skipped layers' entries are their k/v projections of the exited state
    expect = new_cache(tiny)
    inner = tiny.model.model
    pos = torch.tensor([[n - 1]])
    rope = inner.rotary_emb(h.view(1, 1, -1), position_ids=pos)
    propagate(tiny, expect, h.view(1, 1, -1), rope, range(ell, tiny.n_layers))
    for i in range(ell, tiny.n_layers):
        torch.testing.assert_close(cache.layers[i].keys[..., -1:, :], expect.layers[i].keys)
        torch.testing.assert_close(cache.layers[i].values[..., -1:, :], expect.layers[i].values)
        # the first skipped layer's input IS the exited state, so its entries are the true ones
        # (up to the kernels' rounding: one row here, a prefill's row there); above it they are
        # stand-ins for states the token never reached, off by far more than any rounding
        mine, true = cache.layers[i].keys[..., -1:, :], full.layers[i].keys[..., -1:, :]
        if i == ell:
            assert close(mine, true), (i, float((mine - true).abs().max()))
        else:
            assert float((mine - true).abs().max()) > 1e-2, i


def test_the_compute_fill_reproduces_the_full_models_cache(tiny):
    cache, _, ids = forced_exit(tiny, 1, "compute")
    full = new_cache(tiny)
    forward(tiny, full, ids, step=0, kind="prefill")
    for mine, theirs in zip(cache.layers, full.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, **TOL)
        torch.testing.assert_close(mine.values, theirs.values, **TOL)


# --- HASH EE -----------------------------------------------------------------------------------------


def test_the_hash_sends_frequent_tokens_to_shallow_exits_in_equal_mass_buckets(tiny):
    exits = load_exits(tiny)
    table = hash_layers(exits, tiny.n_layers, 0.0)
    counts = exits.token_counts.float()
    layers = [*exits.exit_layers, tiny.n_layers]
    assert set(table.tolist()) <= set(layers)
    order = torch.argsort(counts, descending=True, stable=True)
    assert table[order].tolist() == sorted(table[order].tolist())  # more frequent: not deeper
    assert all(table[t] == tiny.n_layers for t in (counts == 0).nonzero().flatten().tolist())
    mass = {ell: float(counts[table == ell].sum()) for ell in layers}
    share = 1 / len(layers)
    assert all(abs(m / counts.sum() - share) < share for m in mass.values())


def test_hash_ee_exits_each_input_token_at_its_hashed_layer(tiny):
    res = generate(tiny, PROMPTS[0], "hash_ee", 20, chat=False, min_depth=0.0)
    table = hash_layers(load_exits(tiny), tiny.n_layers, 0.0)
    out = res.token_ids
    for e in exits_of(res):
        assert e.rule == "hash" and e.layers == () and e.layer == int(table[out[e.position - 1]])
    origins = [o for e in res.events if isinstance(e, Commit) for o in e.origins]
    assert origins[1:] == ["exit" if e.layer < e.n_layers else "target" for e in exits_of(res)]


# --- parameters, registry --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("calm", {"threshold": 1.5}, r"threshold.*\[0.0, 1.0\]"),
        ("calm", {"confidence": "entropy"}, r"confidence.*softmax, saturation, classifier"),
        ("calm", {"fill": "copy"}, r"fill.*propagate, compute"),
        ("calm", {"temperature": 0.5}, r"unknown parameter 'temperature'"),
        ("hash_ee", {"min_depth": -0.1}, r"min_depth"),
        ("calm", {"beta": 2}, r"unknown parameter 'beta'"),
    ],
)
def test_bad_parameters_are_refused_by_name(tiny, method, params, message):
    with pytest.raises(InvalidParameter, match=message):
        generate(tiny, PROMPTS[0], method, 4, **params)


def test_they_are_lossy_and_say_so():
    for name in ("calm", "hash_ee", "free"):
        m = METHODS[name]
        assert not m.lossless and not m.claims_lossless({}) and not m.relaxable
        assert "paper" in m.presets


def test_a_model_without_exits_is_told_how_to_train_them(tiny, monkeypatch):
    import decoders.trained.exits

    monkeypatch.setattr(decoders.trained.exits, "adapters_path", lambda model_id: ASSETS_NONE)
    with pytest.raises(InvalidParameter, match=r"python -m decoders\.train exits"):
        generate(dataclasses.replace(tiny, model_id="tiny-random-x"), PROMPTS[0], "calm", 4)


ASSETS_NONE = __import__("pathlib").Path("/nonexistent/exits.safetensors")


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


# --- relaxed verification --------------------------------------------------------------------------


def rows(*best: list[float]) -> torch.Tensor:
    """Logit rows over a 6-token vocabulary."""
    return torch.tensor([list(r) for r in best])


def test_beta_one_is_the_exact_rule():
    logits = rows([0, 5, 4.5, 0, 0, 0], [0, 0, 0, 5, 0, 0], [1, 0, 0, 0, 0, 0])
    exact = greedy_chain([2, 3], logits)
    same = greedy_chain([2, 3], logits, Relax(1, 10.0) or None)
    assert exact == same and exact.accepted == () and exact.correction == 1


def test_a_top_beta_draft_within_tolerance_is_kept_and_marked():
    logits = rows([0, 5, 4.5, 0, 0, 0], [0, 0, 0, 5, 0, 0], [1, 0, 0, 0, 0, 0])
    v = greedy_chain([2, 3], logits, Relax(2, 1.0))
    assert v.accepted == (0, 1) and v.relaxed == (0,) and v.tokens == (2, 3, 0)
    assert v.origins == ("relaxed", "draft", "bonus") and v.rule == "relaxed-top-2"
    # outside τ, or outside the top β: rejected as by the exact rule
    assert greedy_chain([2, 3], logits, Relax(2, 0.4)).accepted == ()
    assert greedy_chain([4, 3], logits, Relax(5, 0.1)).accepted == ()


def test_in_a_tree_the_exact_child_wins_then_the_likeliest_allowed_one():
    logits = rows([0, 5, 4.8, 4.9, 0, 0], [0] * 6, [0] * 6, [0] * 6)
    exact_first = greedy_tree([2, 1, 3], [-1, -1, -1], logits, Relax(3, 1.0))
    assert exact_first.accepted == (1,) and exact_first.relaxed == ()
    likeliest = greedy_tree([2, 3, 4], [-1, -1, -1], logits, Relax(3, 1.0))
    assert likeliest.accepted == (1,) and likeliest.relaxed == (1,)


@pytest.mark.parametrize("method", [n for n, m in METHODS.items() if m.relaxable])
def test_relaxed_runs_mark_what_the_exact_rule_would_have_rejected(tiny, method):
    res = generate(tiny, PROMPTS[5], method, 40, chat=False, beta=8, tolerance=20.0)
    relaxed = sum(len(e.relaxed) for e in res.events if isinstance(e, Verify))
    marked = sum(o == "relaxed" for e in res.events if isinstance(e, Commit) for o in e.origins)
    assert relaxed == marked  # (a relaxed node past the budget is not committed: none here)
    exact = generate(tiny, PROMPTS[5], method, 40, chat=False, beta=1)
    assert exact.token_ids == greedy(tiny, PROMPTS[5], 40).token_ids
    if relaxed:
        assert res.token_ids != exact.token_ids


def test_relaxed_verification_is_greedy_only_and_claims_nothing(tiny):
    with pytest.raises(InvalidParameter, match=r"relaxed verification .* greedy"):
        generate(tiny, PROMPTS[0], "speculative", 4, beta=2, temperature=0.7)
    m = METHODS["speculative"]
    assert m.claims_lossless({"beta": 1}) and not m.claims_lossless({"beta": 3})
    # Relaxing is a rule of verification: a method that verifies no draft has nothing to relax.
    for name, method in METHODS.items():
        assert not method.relaxable or "Verify" in method.events, name


# --- the embedded model ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "params", "chat"),
    [(*NEVER[0], False), (*NEVER[3], True), (*NEVER[4], False), ("free", {"threshold": 1.0}, True)],
)
def test_the_embedded_model_never_exiting_is_greedy(embedded, method, params, chat):
    # one prompt each: a code prompt and a chat turn in turn
    prompt = PROMPTS[1] if chat else PROMPTS[0]
    res = generate(embedded, prompt, method, 24, chat=chat, **params)
    assert res.token_ids == embedded_greedy(embedded, prompt, chat)


def embedded_greedy(embedded, prompt: str, chat: bool) -> list[int]:
    return greedy(embedded, prompt, 24, chat=chat).token_ids


@pytest.mark.slow
def test_the_embedded_models_trained_exits_exit_and_stay_close(embedded):
    res = generate(embedded, PROMPTS[5], "calm", 48, chat=False, threshold=0.9, min_depth=0.6)
    exits = exits_of(res)
    assert any(e.layer < e.n_layers for e in exits)  # the trained exits are used
    assert res.stats["layers_per_token"] < 1.0
    ref = greedy(embedded, PROMPTS[5], 48).token_ids
    same = sum(a == b for a, b in zip(res.token_ids, ref, strict=False))
    assert same >= 8  # the first tokens at least: a broken exit writes nonsense from token 2


@pytest.mark.slow
def test_the_embedded_models_oracle_is_greedy_with_the_true_cache(embedded):
    """The bound behind the README's CALM numbers: with perfect exit decisions and the true cache,
    the output is greedy's while many tokens leave early (propagation is what costs agreement)."""
    kw = dict(chat=False, confidence="oracle", min_depth=0.0)
    res = generate(embedded, PROMPTS[5], "calm", 40, fill="compute", **kw)
    assert res.token_ids == greedy(embedded, PROMPTS[5], 40).token_ids
    assert sum(e.layer < e.n_layers for e in exits_of(res)) >= 5


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


# --- FREE ------------------------------------------------------------------------------------------


def test_free_with_a_threshold_that_never_exits_is_greedy(tiny):
    for prompt in PROMPTS[:3]:
        res = generate(tiny, prompt, "free", 20, chat=False, exit_layer="2", threshold=1.0)
        assert res.token_ids == greedy(tiny, prompt, 20).token_ids
        assert not [e for e in res.events if isinstance(e, CatchUp)]
        assert res.stats["layers_per_token"] == 1.0


def free_run(tiny, **kw):
    """A FREE run where about half the tokens exit (tiny-random's confidences are tiny)."""
    probe = generate(tiny, PROMPTS[0], "free", 30, chat=False, exit_layer="2", threshold=0.0)
    confs = sorted(e.confidences[0] for e in exits_of(probe))
    params = dict(exit_layer="2", threshold=confs[len(confs) // 2], adaptive=False) | kw
    return generate(tiny, PROMPTS[0], "free", 30, chat=False, **params)


def test_free_holds_back_exited_tokens_until_the_next_deep_token_takes_them_along(tiny):
    res = free_run(tiny)
    held: list[int] = []
    caught = {e.step: e for e in res.events if isinstance(e, CatchUp)}
    syncs = {e.step: e for e in res.events if isinstance(e, Forward) and e.kind == "sync"}
    assert caught and syncs
    for e in exits_of(res):
        if e.layer == 2:
            held.append(e.position)
            assert e.step not in syncs
        else:
            assert e.layer == tiny.n_layers and e.step in syncs
            assert syncs[e.step].n_input_tokens == len(held) + 1  # one parallel pass
            assert syncs[e.step].layers == tiny.n_layers - 2
            if held:
                assert list(caught[e.step].positions) == held
            held = []


def test_the_parallel_catch_up_gives_the_deep_states_of_one_by_one(tiny):
    """Three tokens through layers 1..ℓ, then layers ℓ+1..L for all three in one pass: the deep
    keys, values and logits equal those of running each token's deep layers on its own."""
    from decoders.core.runtime import forward_from, forward_shallow

    ids = tiny.encode(PROMPTS[1], chat=False)
    feed = ids[-3:]
    ell = 2

    def prefilled():
        cache = new_cache(tiny)
        forward(tiny, cache, ids[:-3], step=0, kind="prefill")
        return cache

    together = prefilled()
    states = [
        forward_shallow(tiny, together, [t], ell, step=1, kind="target").hidden[ell] for t in feed
    ]
    bulk = forward_from(tiny, together, torch.cat(states), ell, step=1, kind="sync")
    alone = prefilled()
    rows = []
    for t in feed:
        h = forward_shallow(tiny, alone, [t], ell, step=1, kind="target").hidden[ell]
        rows.append(forward_from(tiny, alone, h, ell, step=1, kind="sync").logits[-1])
    torch.testing.assert_close(bulk.logits, torch.stack(rows), **TOL)
    for a, b in zip(together.layers, alone.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, **TOL)
        torch.testing.assert_close(a.values, b.values, **TOL)


def test_the_beta_mixture_threshold_sits_between_the_classes():
    from decoders.methods.free import MIN_SAMPLES, bmm_threshold

    with torch.random.fork_rng():  # seeded, and the global generator left as it was
        torch.manual_seed(0)
        right = torch.distributions.Beta(8.0, 1.5).sample((200,)).tolist()
        wrong = torch.distributions.Beta(1.5, 6.0).sample((200,)).tolist()
    samples = [(c, True) for c in right] + [(c, False) for c in wrong]
    lam = bmm_threshold(samples, 0.9, 0.5)
    assert 0.3 < lam < 0.9
    assert bmm_threshold(samples, 0.99, 0.5) > lam  # a stricter ζ, a higher λ
    few = [(0.9, True)] * (MIN_SAMPLES - 1) + [(0.1, False)] * 10
    assert bmm_threshold(few, 0.9, 0.42) == 0.42  # too few of a class: the starting λ


def test_free_adapts_its_threshold_from_what_the_catch_ups_showed(tiny):
    res = free_run(tiny, adaptive=True, zeta=0.6)
    start = exits_of(res)[0].threshold
    thresholds = [e.threshold for e in res.events if isinstance(e, CatchUp)]
    assert thresholds  # and each pass reports the λ the next tokens are weighed against
    later = [e.threshold for e in exits_of(res)]
    assert all(t in (start, *thresholds) for t in later)


def test_free_refuses_an_exit_layer_without_an_adapter(tiny):
    with pytest.raises(InvalidParameter, match=r"no trained exit at layer 4.*1, 2, 3"):
        generate(tiny, PROMPTS[0], "free", 4, exit_layer="4")
    with pytest.raises(InvalidParameter, match=r"'auto', 'shallow' or a layer number"):
        generate(tiny, PROMPTS[0], "free", 4, exit_layer="deep")
    from decoders.methods.free import resolve_exit_layer

    assert resolve_exit_layer(tiny, "auto") == 3 and resolve_exit_layer(tiny, "shallow") == 1


def test_free_views_draw_the_catch_ups(tiny):
    from visualizer.exit_view import catch_ups
    from visualizer.figures import forward_timeline

    res = free_run(tiny)
    texts = {t: tiny.token_text(t) for t in res.token_ids}
    step = next(e.step for e in res.events if isinstance(e, CatchUp))
    fig = catch_ups(res.events, texts, step)
    caught = [e for e in res.events if isinstance(e, CatchUp)]
    total = sum(fig.data[0].y) + sum(fig.data[1].y)
    assert total == sum(len(e.positions) for e in caught)
    # each axis names what it carries: counts on the left, the λ line on the right
    assert fig.layout.yaxis.title.text == "tokens caught up"
    assert fig.layout.yaxis2.title.text == "λ after the pass"
    lanes = {y for t in forward_timeline(res.events).data for y in t.y}
    assert "sync" in lanes


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
