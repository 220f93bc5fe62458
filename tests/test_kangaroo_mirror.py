"""Kangaroo with drafts the target accepts: the transparent target and the mirror adapter
(test_kangaroo.py builds them) keep accepted drafts lossless, in bfloat16 too, run the shallow
layers once per token, and commit a runner-up the target takes with every cache following it;
EOS inside accepted drafts and runners-up, and sampling with the mirror.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_kangaroo import (
    by_step,
    check_steps,
    mirror_adapter,
    one_torch_thread,  # noqa: F401  (autouse)
    run,
    transparent_target,
)
from torch import nn

from conftest import PROMPTS, greedy
from decoders import generate
from decoders.core.events import Commit, Draft, DraftStop, Forward, Verify
from decoders.core.runtime import forward, new_cache
from decoders.trained import kangaroo


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
