"""Kangaroo (decoders/methods/kangaroo.py): lossless against greedy, the double early exit, the shallow
layers run once per token, budget/EOS edges, exact sampling, parameters, and its two views.

The shipped tiny-random adapters are placeholders (untrained): nothing here assumes they draft
well. Where a test needs drafts the target accepts, it builds a *transparent* target (tiny-random
whose layers after ℓ add nothing to the residual stream, so its output is lm_head(norm(h_ℓ))) and a
*mirror* adapter (adds nothing, then the target's own final norm, over the whole vocabulary): the
mirror's q is then the transparent target's p, and every draft should be accepted.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from functools import partial

import pytest
import torch
from torch import nn

from conftest import PROMPTS, greedy, matches_greedy, one_thread
from decoders import METHODS, InvalidParameter, generate
from decoders.core import models
from decoders.core.events import Commit, Done, Draft, DraftStop, Forward, Prefill, Verify
from decoders.core.runtime import forward, new_cache
from decoders.core.sampling import Sampler
from decoders.core.tree import chain
from decoders.trained import kangaroo
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


class SwapTopTwo(nn.Module):
    """A draft head whose two best scores trade places: its top-1 is the target's runner-up."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, x):
        logits = self.head(x).clone()
        top = logits.topk(2, dim=-1)
        logits.scatter_(-1, top.indices, top.values.flip(-1))
        return logits


@pytest.fixture(params=[1, 2], ids=["l1", "l2"])
def mirrored(request, monkeypatch):
    """(bundle, ℓ, layer counts): the transparent target, decoding with the mirror adapter."""
    exit_layer = request.param
    bundle, counts = transparent_target(exit_layer, count=True)
    adapter = mirror_adapter(bundle, exit_layer)
    monkeypatch.setattr(kangaroo, "load_adapter", lambda b, layer=None: adapter)
    return bundle, exit_layer, counts


@pytest.mark.slow
@pytest.mark.parametrize("siblings", [0, 1])
@pytest.mark.parametrize(("gamma", "budget"), [(1, 9), (3, 17), (6, 40), (6, 11)])
def test_accepted_drafts_stay_lossless(mirrored, gamma, budget, siblings):
    bundle, exit_layer, _ = mirrored
    for prompt in PROMPTS[:3]:
        kw = dict(exit_layer=str(exit_layer), eta=0.0, gamma=gamma, siblings=siblings)
        res = run(bundle, prompt, budget, **kw)
        check_steps(res, exit_layer, 0.0, gamma, budget)
        # Full acceptance: the next step's adapter pass also reads the last draft's state.
        verifies = [e for e in res.events if isinstance(e, Verify)]
        drafts = [e for e in res.events if isinstance(e, DraftStop) and e.confidences]
        full = sum(
            len(v.accepted) == len(d.confidences) for v, d in zip(verifies, drafts, strict=True)
        )
        assert full >= 0.9 * len(verifies), (full, len(verifies))
        assert res.stats["tokens_per_target_forward"] > 1.5
        if siblings:  # the drafts always won: no runner-up was ever taken
            assert all(
                i < len(d.confidences)
                for v, d in zip(verifies, drafts, strict=True)
                for i in v.accepted
            )


def test_a_bfloat16_adapter_drafts_and_the_output_stays_greedy(mirrored):
    """The adapter in bfloat16 (as load_artifact gives drafting heads where the CPU has it) reads
    the target's float32 layer-ℓ states; the shallow states the target reuses stay float32."""
    bundle, exit_layer, _ = mirrored
    kangaroo.load_adapter(bundle).to(torch.bfloat16)
    for prompt in PROMPTS[:3]:
        res = run(bundle, prompt, 24, exit_layer=str(exit_layer), eta=0.0, gamma=4)
        check_steps(res, exit_layer, 0.0, 4, 24)
        assert res.stats["accepted_drafts"] > 0


def test_the_shallow_layers_run_once_per_token(mirrored):
    """Every token runs layers 1..ℓ exactly once (drafting, or the verify pass for the last draft
    token) and layers ℓ+1..L once per verify pass: counted in the layers themselves and read back
    from the Forward events alike."""
    bundle, exit_layer, counts = mirrored
    prompt = bundle.encode(PROMPTS[5], chat=False)
    counts.clear()
    res = generate(bundle, prompt, "kangaroo", 30, exit_layer=str(exit_layer), eta=0.0, gamma=4)
    ran = [counts[i] for i in range(bundle.n_layers)]
    assert res.token_ids == greedy(bundle, prompt, 30, chat=None).token_ids
    verify_inputs = 0
    for step, ev in by_step(res.events).items():
        if step == 0:
            continue
        target = next(f for f in ev["forwards"] if f.kind in ("verify", "target"))
        shallow = sum(f.n_input_tokens for f in ev["forwards"] if f.kind == "draft") + 1
        if "draft" in ev:  # the runners-up run layers 1..ℓ in the verify pass
            shallow += len(ev["draft"].tokens) - len(ev["draftstop"].confidences)
        assert shallow == target.n_input_tokens  # x, d_1 .. d_{n-1} drafting; d_n verifying
        verify_inputs += target.n_input_tokens
    expected = len(prompt) + verify_inputs
    assert ran == [expected] * bundle.n_layers
    assert res.stats["accepted_drafts"] > 0  # the catch-up of accepted last drafts was exercised


@pytest.mark.parametrize("gamma", [1, 3])
def test_a_runner_up_the_target_takes_commits_and_the_caches_follow_it(mirrored, gamma):
    """The mirror with its top two swapped: every drafted token is the target's second choice
    (rejected) and its runner-up the target's first (accepted, a leaf). Each step then commits
    that runner-up and the target's token after it: the caches must keep the runner-up's keys
    (not d_1's), and the adapter must read its layer-ℓ state next step, or the output drifts."""
    bundle, exit_layer, counts = mirrored
    adapter = kangaroo.load_adapter(bundle)
    adapter.lm_head = SwapTopTwo(adapter.lm_head)
    prompt = bundle.encode(PROMPTS[2], chat=False)
    counts.clear()
    kw = dict(exit_layer=str(exit_layer), eta=0.0, gamma=gamma, siblings=1)
    res = generate(bundle, prompt, "kangaroo", 31, **kw)
    ran = [counts[i] for i in range(bundle.n_layers)]  # before the reference runs them too
    assert res.token_ids == greedy(bundle, prompt, 31).token_ids
    check_steps(res, exit_layer, 0.0, gamma, 31, siblings=1)
    steps = [ev for step, ev in by_step(res.events).items() if step > 0]
    for ev in steps[:-1]:  # the last step may be cut by the budget
        draft, verify = ev["draft"], ev["verify"]
        assert verify.accepted == (gamma,)  # the runner-up beside d_1 (after the γ drafts)
        assert draft.parents[gamma] == -1 and ev["commit"].origins == ("draft", "bonus")
    assert res.stats["tokens_per_target_forward"] > 1.9
    # Runners-up ran layers 1..ℓ once, in the verify pass; nothing ran them twice.
    verify_inputs = sum(
        f.n_input_tokens for ev in steps for f in ev["forwards"] if f.kind in ("verify", "target")
    )
    assert ran[exit_layer:] == [len(prompt) + verify_inputs] * (bundle.n_layers - exit_layer)
    drafted = sum(f.n_input_tokens for ev in steps for f in ev["forwards"] if f.kind == "draft")
    leaves = sum(len(ev["draft"].tokens) - len(ev["draftstop"].confidences) for ev in steps)
    assert ran[:exit_layer] == [len(prompt) + drafted + len(steps) + leaves] * exit_layer


def test_eos_as_an_accepted_runner_up_ends_the_output(mirrored):
    """An end token the target takes as a runner-up (a leaf, not the drafted token): the output
    ends on it, exactly where greedy ends, with no bonus token after it."""
    bundle, exit_layer, _ = mirrored
    adapter = kangaroo.load_adapter(bundle)
    adapter.lm_head = SwapTopTwo(adapter.lm_head)
    kw = dict(exit_layer=str(exit_layer), eta=0.0, gamma=3, siblings=1)
    free = run(bundle, PROMPTS[4], 30, **kw)
    # A token whose first appearance in the output is a runner-up the target took (every step's
    # first committed token is one here; a later token may first appear as a bonus instead).
    position, at = None, 0
    for e in (e for e in free.events if isinstance(e, Commit)):
        if e.step > 0 and free.token_ids.index(e.tokens[0]) == at and position is None:
            position = at
        at += len(e.tokens)
    assert position is not None
    eos = free.token_ids[position]
    stopping = dataclasses.replace(bundle, eos_ids=frozenset({eos}))
    out = run(stopping, PROMPTS[4], 30, **kw)
    check_steps(out, exit_layer, 0.0, 3, 30, eos=stopping.eos_ids)
    assert out.finish_reason == "eos" and out.token_ids == free.token_ids[: position + 1]
    last = [e for e in out.events if isinstance(e, Commit)][-1]
    assert last.tokens[-1] == eos and last.origins[-1] == "draft"


def test_runners_up_through_live_layers_leave_every_cache_true(tiny, monkeypatch):
    """On tiny-random itself (every layer live, unlike the transparent target), a draft head
    whose second choice is always the greedy token: every step the target rejects d_1 and takes
    the runner-up beside it. The deep layers' compacted keys must be the runner-up's (else the
    output drifts from greedy), and the adapter must end up having read, at every position, the
    layer-ℓ state of the token the output has there (its cache is what later drafts attend to)."""
    exit_layer, budget = 2, 30
    prompt = tiny.encode(PROMPTS[1], chat=False)
    seq = [*prompt, *greedy(tiny, prompt, budget).token_ids]
    adapter = kangaroo.load_adapter(tiny, exit_layer)
    vocab = tiny.model.config.vocab_size
    reads: dict[int, torch.Tensor] = {}
    real_forward = adapter.forward

    def recording(hidden, positions, mask=None, cache=None):
        for row, pos in zip(hidden[0], positions[0].tolist(), strict=True):
            reads[pos] = row.float().clone()  # a later read (after a rejection) replaces it
        return real_forward(hidden, positions, mask, cache)

    monkeypatch.setattr(adapter, "forward", recording)
    real_head = kangaroo._draft_head

    def greedy_second(bundle, adapter, cache, behind, position):
        head = real_head(bundle, adapter, cache, behind, position)  # the adapter still runs

        def scores(h):
            logits = head(h)
            want = seq[position + 1] if position + 1 < len(seq) else 0
            ranked = torch.full_like(logits, -5.0)
            ranked[..., want] = 1.0
            ranked[..., (want + 1) % vocab] = 2.0  # a wrong top-1: the draft is rejected
            return ranked

        return scores

    monkeypatch.setattr(kangaroo, "_draft_head", greedy_second)
    res = run(tiny, prompt, budget, exit_layer=str(exit_layer), eta=0.0, gamma=2, siblings=1)
    check_steps(res, exit_layer, 0.0, 2, budget)
    verifies = [e for e in res.events if isinstance(e, Verify)]
    assert all(v.accepted == (2,) for v in verifies[:-1])  # the runner-up beside d_1, each step
    truth = forward(tiny, new_cache(tiny), seq, step=0, kind="prefill", hidden_at=(exit_layer,))
    states = truth.hidden[exit_layer].float()
    # Up to the last step that drafted, every position holds the output's own state; after it,
    # a runner-up's state may ride along to a pass that never comes (the budget ended the run).
    last = max(e.step for e in res.events if isinstance(e, Forward) and e.kind == "draft")
    settled = len(prompt) + sum(
        len(e.tokens) for e in res.events if isinstance(e, Commit) and e.step < last
    )
    assert settled >= len(seq) - 4 and sorted(reads)[:settled] == list(range(settled))
    for pos in range(settled):
        assert torch.allclose(reads[pos], states[pos], atol=2e-2, rtol=2e-2), pos


def test_sampling_with_runners_up_uses_the_point_mass_tree_rule(mirrored):
    """With runners-up the drafts are the adapter's top tokens, verified as point masses by the
    multi-draft residual rule; the mirror's swapped top two make the runner-up the likely one."""
    bundle, exit_layer, _ = mirrored
    adapter = kangaroo.load_adapter(bundle)
    adapter.lm_head = SwapTopTwo(adapter.lm_head)
    res = generate(
        bundle,
        PROMPTS[5],
        "kangaroo",
        30,
        exit_layer=str(exit_layer),
        eta=0.0,
        gamma=2,
        siblings=1,
        temperature=0.3,
        seed=3,
    )
    verifies = [e for e in res.events if isinstance(e, Verify)]
    assert {e.rule for e in verifies} == {"sample-tree"}
    drafts = {e.step: e for e in res.events if isinstance(e, Draft)}
    assert any(v.accepted and v.accepted[-1] >= 2 for v in verifies)  # a runner-up was kept
    assert all(len(d.tokens) == 4 for d in list(drafts.values())[:-1])


def test_eos_inside_an_accepted_draft(mirrored):
    bundle, exit_layer, _ = mirrored
    free = run(bundle, PROMPTS[1], 40, exit_layer=str(exit_layer), eta=0.0, gamma=6)
    # A token that first appears inside an accepted draft, not at its end.
    seen: set[int] = set(free.token_ids[:1])
    eos = None
    for e in free.events:
        if isinstance(e, Commit) and e.step > 0:
            for t, o in zip(e.tokens[:-2], e.origins[:-2], strict=True):
                if o == "draft" and t not in seen and eos is None:
                    eos = t
            seen |= set(e.tokens)
    assert eos is not None
    position = free.token_ids.index(eos)
    stopping = dataclasses.replace(bundle, eos_ids=frozenset({eos}))
    out = run(stopping, PROMPTS[1], 40, exit_layer=str(exit_layer), eta=0.0)
    check_steps(out, exit_layer, 0.0, 6, 40, eos=stopping.eos_ids)
    assert out.finish_reason == "eos" and out.token_ids == free.token_ids[: position + 1]
    stops = [e for e in out.events if isinstance(e, DraftStop)]
    assert stops[-1].reason == "eos"  # the draft ended on the end token, and it was accepted
    assert [e for e in out.events if isinstance(e, Commit)][-1].origins[-1] == "draft"


def test_sampling_with_the_mirror_accepts_nearly_everything(mirrored):
    """q = p: a draft is kept with probability min(1, p/q) = 1. Catches a q row that is
    misaligned, untempered or untruncated."""
    bundle, exit_layer, _ = mirrored
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        res = generate(
            bundle,
            PROMPTS[5],
            "kangaroo",
            40,
            exit_layer=str(exit_layer),
            eta=0.0,
            gamma=4,
            siblings=0,  # the chain's rule, with q (runners-up make drafts point masses)
            temperature=temperature,
            top_p=top_p,
            seed=1,
        )
        assert {e.rule for e in res.events if isinstance(e, Verify)} == {"speculative-sampling"}
        assert res.stats["draft_acceptance_rate"] >= 0.95, res.stats


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
