"""Early exit (decoders/trained/exits.py, calm.py, hash_ee.py).

- With thresholds that never exit (λ = 1; HASH EE with min_depth = 1) each method is autoregressive
  greedy token for token, on tiny-random (placeholder exits) and on the embedded model (trained);
- state propagation writes exactly the cache entries the skipped layers own, from the exited
  state; the "compute" fill reproduces the full model's cache;
- exits, thresholds, the hash, the parameters.

SpecDec's relaxed verification and FREE: test_calm_free.py; the trace checks and the views:
test_calm_views.py.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch

import conftest
from conftest import KERNEL_TOL as TOL
from conftest import PROMPTS, close, one_thread
from decoders import METHODS, InvalidParameter, generate
from decoders.core.events import Commit, Forward, LayerExit
from decoders.core.runtime import forward, new_cache
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
