"""Kangaroo (decoders/methods/kangaroo.py): lossless against greedy, the double early exit, budget/EOS
edges, exact sampling, parameters, and the embedded model. Drafts the target accepts (runners-up,
the shallow layers run once per token): test_kangaroo_mirror.py; its two views:
test_kangaroo_views.py.

The shipped tiny-random adapters are placeholders (untrained): nothing here assumes they draft
well. Where a test needs drafts the target accepts, it builds a *transparent* target (tiny-random
whose layers after ℓ add nothing to the residual stream, so its output is lm_head(norm(h_ℓ))) and a
*mirror* adapter (adds nothing, then the target's own final norm, over the whole vocabulary): the
mirror's q is then the transparent target's p, and every draft should be accepted. Both are built
here (test_layerskip.py uses them too).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from functools import partial

import pytest
import torch
from torch import nn

from conftest import PROMPTS, matches_greedy, one_thread
from decoders import METHODS, InvalidParameter, generate
from decoders.core import models
from decoders.core.events import Commit, Done, Draft, DraftStop, Forward, Verify
from decoders.core.runtime import forward, new_cache
from decoders.core.sampling import Sampler
from decoders.core.tree import chain
from decoders.trained.artifacts import vocab_head
from decoders.trained.kangaroo import KangarooAdapter, best_exit_layer, shipped_exit_layers


@pytest.fixture(autouse=True)
def one_torch_thread():
    with one_thread():
        yield


same_as_greedy = partial(matches_greedy, method="kangaroo", chat=False)


def by_step(events) -> dict[int, dict]:
    steps: dict[int, dict] = defaultdict(lambda: {"forwards": []})
    for e in events:
        if isinstance(e, Forward):
            steps[e.step]["forwards"].append(e)
        elif isinstance(e, Draft | Verify | Commit | DraftStop):
            key = type(e).__name__.lower()
            assert key not in steps[e.step], f"two {key} events in step {e.step}"
            steps[e.step][key] = e
    return dict(sorted(steps.items()))


def check_steps(
    res,
    exit_layer,
    eta,
    gamma,
    budget,
    n_layers=4,
    eos=frozenset({2}),
    siblings=None,
    prefill_head=True,
    source="kangaroo",
):
    """Each step: one (ℓ + exit head)-layer draft forward per drafted token, a draft that ends for
    the reason it names, one verify forward over x, the draft and its runners-up (at most
    `siblings` beside each drafted token, as leaves; default: the run's), and a commit within
    budget. `prefill_head`: the exit head reads the prompt at step 0 (Kangaroo's adapter; not
    LayerSkip's shared head); `source`: how the drafts' source begins."""
    siblings = res.params["siblings"] if siblings is None else siblings
    done = 0
    for step, ev in by_step(res.events).items():
        commit = ev["commit"]
        if step == 0:
            kinds = [(f.kind, f.layers) for f in ev["forwards"]]
            # the model, then the adapter (its cache reads the prompt)
            assert kinds == [("prefill", n_layers)] + [("draft", 1)] * prefill_head
            done += len(commit.tokens)
            continue
        stop, draft = ev["draftstop"], ev.get("draft")
        drafted = draft.tokens[: len(stop.confidences)] if draft else ()
        leaves = draft.tokens[len(drafted) :] if draft else ()
        assert len(leaves) <= siblings * len(drafted)
        room = min(gamma, budget - done - 1)
        assert 0 <= len(drafted) <= room
        assert len(stop.confidences) == len(drafted) and stop.threshold == eta
        drafts = [f for f in ev["forwards"] if f.kind == "draft"]
        assert [(f.layers, f.n_input_tokens) for f in drafts] == [(exit_layer + 1, 1)] * len(
            drafted
        )
        if draft:
            assert draft.source.startswith(source)
            assert draft.parents[: len(drafted)] == chain(len(drafted))
            assert draft.probs[: len(drafted)] == stop.confidences  # q(d) is the top-1 probability
            beside = Counter(draft.parents[len(drafted) :])  # runners-up: leaves beside d_j
            for j, n in beside.items():
                assert 0 <= j + 1 < len(drafted) and n <= siblings
            for i, (t, parent) in enumerate(
                zip(leaves, draft.parents[len(drafted) :], strict=True)
            ):
                assert t != drafted[parent + 1]  # never the drafted token again
                assert draft.probs[len(drafted) + i] <= stop.confidences[parent + 1]
        # Why the draft ended: the first token below η (kept), γ, an end token, or the budget.
        assert all(c >= eta for c in stop.confidences[:-1])
        if stop.reason == "confidence":
            assert stop.confidences[-1] < eta
        elif stop.reason == "max_draft":
            assert len(drafted) == gamma
        elif stop.reason == "eos":
            assert drafted[-1] in eos
        else:
            assert stop.reason == "budget" and len(drafted) == room < gamma
        verify = [f for f in ev["forwards"] if f.kind in ("verify", "target")]
        assert len(verify) == 1 and verify[0].n_input_tokens == len(drafted) + len(leaves) + 1
        assert verify[0].layers == n_layers  # the last input ran layers 1..ℓ first
        assert verify[0].kind == ("verify" if drafted else "target")
        done += len(commit.tokens)
    assert done == len(res.token_ids) <= budget


def run(bundle, prompt, budget, **params):
    return same_as_greedy(bundle, prompt, budget, **params)


# --- lossless on tiny-random (placeholder adapters) ------------------------------------------------

# ℓ × η × γ for the paper's chain (siblings = 0) and the default runner-up, then more runners-up
GRID = [
    (layer, eta, gamma, siblings)
    for layer in (1, 2)
    for eta in (0.0, 0.6, 1.0)
    for gamma in (1, 3, 6)
    for siblings in (0, 1)
] + [(2, eta, gamma, siblings) for siblings in (2, 4) for eta in (0.0, 0.6) for gamma in (1, 4)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "exit_layer", "eta", "gamma", "siblings"),
    [(i, *c) for i, c in enumerate(GRID)],
    ids=[f"l{layer}-eta{eta}-g{gamma}-s{s}" for layer, eta, gamma, s in GRID],
)
def test_lossless_grid_on_tiny(tiny, case, exit_layer, eta, gamma, siblings):
    for prompt in (PROMPTS[case % len(PROMPTS)], PROMPTS[(case + 3) % len(PROMPTS)]):
        for budget in (5, 24):  # 5: drafts and their runners-up cut by the budget
            kw = dict(exit_layer=str(exit_layer), eta=eta, gamma=gamma, siblings=siblings)
            res = run(tiny, prompt, budget, **kw)
            check_steps(res, exit_layer, eta, gamma, budget, siblings=siblings)
            if eta == 1.0:  # no top-1 probability reaches 1: every draft is one token
                stops = (e for e in res.events if isinstance(e, DraftStop))
                assert all(len(e.confidences) <= 1 for e in stops)
            drafts = [e for e in res.events if isinstance(e, Draft)]
            trees = [e for e in drafts if tuple(e.parents) != chain(len(e.tokens))]
            assert bool(trees) == bool(siblings), (len(trees), siblings)


def test_auto_is_the_sweeps_choice_else_the_smallest_shipped(tiny):
    assert shipped_exit_layers("tiny-random") == [1, 2]
    assert best_exit_layer("tiny-random") == 1  # no sweep card: the smallest shipped ℓ
    res = run(tiny, PROMPTS[2], 12)  # defaults: exit_layer=auto, η = 0.6, γ = 6
    check_steps(res, 1, 0.6, 6, 12)
    assert next(e for e in res.events if isinstance(e, Draft)).source.startswith(
        "kangaroo: exit at layer 1 + adapter"  # (+ runners-up, where there were any)
    )


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 5, 7, 9])
def test_budget_ends_mid_draft_and_drafts_never_outrun_it(tiny, budget):
    res = run(tiny, PROMPTS[3], budget, exit_layer="2", eta=0.0, gamma=6)
    assert len(res.token_ids) == budget and res.finish_reason == "length"
    check_steps(res, 2, 0.0, 6, budget)
    if budget == 1:  # the prefill alone decides the only token
        assert not any(isinstance(e, DraftStop | Draft | Verify) for e in res.events)
    if 2 < budget < 8:  # a draft longer than what is left is cut to it
        assert any(e.reason == "budget" for e in res.events if isinstance(e, DraftStop))


def test_eos_inside_a_rejected_draft(tiny):
    # A token the adapter drafts mid-draft becomes the end token: drafting stops right after it,
    # and the output still ends exactly where autoregressive greedy ends.
    free = run(tiny, PROMPTS[0], 40, exit_layer="1", eta=0.0, gamma=4, siblings=0)
    draft = next(e for e in free.events if isinstance(e, Draft) and len(e.tokens) >= 3)
    eos = draft.tokens[1]
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    out = run(bundle, PROMPTS[0], 40, exit_layer="1", eta=0.0, gamma=4, siblings=0)
    check_steps(out, 1, 0.0, 4, 40, eos=bundle.eos_ids)
    assert any(e.reason == "eos" for e in out.events if isinstance(e, DraftStop))
    for e in out.events:
        if isinstance(e, Draft):
            assert eos not in e.tokens[:-1]  # nothing is drafted after an end token


# --- a transparent target and a mirror adapter: drafts that are accepted --------------------------


def transparent_target(exit_layer: int, count: bool = False):
    """A private tiny-random (never the shared one) whose layers after ℓ write nothing to the
    residual stream. With `count`, each decoder layer also counts the tokens it runs
    (`bundle.counts[i]`), through a wrapper module on this private copy."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DECODING_LAB_PACK", "0")  # plain weights, so zeroing them takes effect
        bundle = models._load("tiny-random", torch.device("cpu"), torch.float32)
    inner = bundle.model.model
    for layer in inner.layers[exit_layer:]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    counts: Counter[int] = Counter()
    if count:
        for i, layer in enumerate(inner.layers):
            inner.layers[i] = Counted(layer, counts, i)
    return bundle, counts


class Counted(nn.Module):
    """A decoder layer that counts the tokens it is run on."""

    def __init__(self, layer: nn.Module, counts: Counter, index: int) -> None:
        super().__init__()
        self.layer, self.counts, self.index = layer, counts, index

    def forward(self, hidden_states, *args, **kwargs):
        self.counts[self.index] += hidden_states.shape[1]
        return self.layer(hidden_states, *args, **kwargs)


def mirror_adapter(bundle, exit_layer: int) -> KangarooAdapter:
    """An adapter whose attention adds nothing and whose norm is the target's final norm, over the
    whole vocabulary: on the transparent target, q = p."""
    config = bundle.model.config
    adapter = KangarooAdapter(config, exit_layer, torch.arange(config.vocab_size))
    with torch.no_grad():
        adapter.self_attn.o_proj.weight.zero_()
        adapter.norm.weight.copy_(bundle.model.model.norm.weight)
    adapter.eval().requires_grad_(False)
    adapter.lm_head = vocab_head(bundle, adapter.vocab)
    return adapter


# --- sampling: the exact rejection rule with q = the adapter's distribution -----------------------


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at 1 - 0.001 (z = 3.09), Wilson-Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("siblings", "rule"), [(0, "speculative-sampling"), (2, "sample-tree")], ids=["chain", "tree"]
)
def test_sampling_follows_the_targets_distribution(tiny, siblings, rule):
    """The first two tokens over many seeds ~ p(t0) p(t1 | t0): t0 from the prefill, t1 from the
    first draft-and-verify step (a draft from the placeholder adapter, kept with min(1, p/q), else
    drawn from norm(max(0, p - q)); with runners-up, the top three of q as point masses, each kept
    with its share of the residual). Chi-square over the likely (t0, t1) pairs, the rest pooled."""
    temperature, n = 0.2, 400
    sampler = Sampler(temperature=temperature)
    ids = tiny.encode(PROMPTS[1], False)
    p0 = sampler.distribution(
        forward(tiny, new_cache(tiny), ids, step=0, kind="prefill", logits_to_keep=1).logits[-1]
    )
    expected: dict[tuple[int, int] | str, float] = {}
    for t0 in torch.topk(p0, 4).indices.tolist():
        logits = forward(tiny, new_cache(tiny), [*ids, t0], step=0, kind="prefill").logits[-1]
        p1 = sampler.distribution(logits)
        for t1 in torch.topk(p1, 5).indices.tolist():
            expected[(t0, t1)] = float(p0[t0] * p1[t1])
    expected = {k: v for k, v in expected.items() if v * n >= 5}
    expected["other"] = 1.0 - sum(expected.values())
    counts: Counter = Counter()
    kept = 0
    for seed in range(n):
        res = generate(
            tiny,
            ids,
            "kangaroo",
            3,
            exit_layer="2",
            eta=0.0,
            gamma=1,
            siblings=siblings,
            temperature=temperature,
            seed=seed,
        )
        pair = tuple(res.token_ids[:2])
        counts[pair if pair in expected else "other"] += 1
        verify = next(e for e in res.events if isinstance(e, Verify))
        assert verify.rule == rule
        kept += len(verify.accepted)
    chi2 = sum((counts[k] - n * p) ** 2 / (n * p) for k, p in expected.items())
    assert chi2 < chi2_critical(len(expected) - 1), (chi2, counts, expected)
    assert kept < n  # the residual was drawn from too (an untrained adapter is often rejected)


def test_sampling_is_reproducible_per_seed(tiny):
    kw = dict(eta=0.0, gamma=3, temperature=1.0, seed=5)
    a = generate(tiny, PROMPTS[1], "kangaroo", 16, **kw)
    b = generate(tiny, PROMPTS[1], "kangaroo", 16, **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16
    untimed = [[e for e in r.events if not isinstance(e, Forward | Done)] for r in (a, b)]
    assert untimed[0] == untimed[1]


# --- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"exit_layer": "3"}, r"exit_layer 3: no trained Kangaroo adapter.*ship for: 1, 2"),
        ({"exit_layer": "0"}, r"exit_layer 0: no trained Kangaroo adapter"),
        ({"exit_layer": "two"}, r"'auto' or a layer number.*1, 2"),
        ({"eta": 1.5}, r"eta.*\[0.0, 1.0\]"),
        ({"gamma": 0}, r"gamma.*\[1, 16\]"),
        ({"gamma": 17}, r"gamma.*\[1, 16\]"),
        ({"siblings": 5}, r"siblings.*\[0, 4\]"),
        ({"siblings": -1}, r"siblings.*\[0, 4\]"),
    ],
)
def test_invalid_parameters_are_clear_errors(tiny, params, message):
    with pytest.raises(InvalidParameter, match=message):
        generate(tiny, PROMPTS[0], "kangaroo", 8, **params)


def test_a_model_without_adapters_is_told_how_to_train_one():
    other = models.load_model("tiny-random-2")
    with pytest.raises(InvalidParameter, match=r"no trained adapter for tiny-random-2.*train"):
        generate(other, PROMPTS[0], "kangaroo", 8)


def test_registry_entry():
    m = METHODS["kangaroo"]
    exact = {
        "beta": 1,
        "tolerance": 1.0,
        "synthetic": 0.0,
    }  # relaxed verification off: a preset resets it
    paper = {"exit_layer": "auto", "eta": 0.6, "gamma": 6, "siblings": 0, **exact}
    assert m.preset("paper") == paper
    assert m.preset("defaults") == {**paper, "siblings": 1}  # one runner-up beside each draft
    assert m.lossless and m.sampling


# --- the embedded model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_lossless_on_the_embedded_model(embedded):
    res = run(embedded, "Give me three tips for writing clear emails.", 48, chat=True, eta=0.0)
    layer = best_exit_layer(embedded.model_id)
    check_steps(res, layer, 0.0, 6, 48, n_layers=embedded.n_layers)
    # The defaults (one runner-up beside each draft token) and several: the target takes some
    prompt = 'def running_max(values):\n    """Return the running maximum of a list."""\n'
    took = 0
    for siblings in (1, 3):
        res = run(embedded, prompt, 64, siblings=siblings)
        check_steps(res, layer, 0.6, 6, 64, n_layers=embedded.n_layers)
        stops = {e.step: len(e.confidences) for e in res.events if isinstance(e, DraftStop)}
        for v in (e for e in res.events if isinstance(e, Verify)):
            took += bool(v.accepted) and v.accepted[-1] >= stops[v.step]
    assert took > 0
