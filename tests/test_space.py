"""SPACE (decoders/methods/space.py, decoders/trained/mask_model.py). Its trainer
(decoders/train/space.py): test_space_train.py.

Lossless against the ORIGINAL model's greedy output, token for token: the adapter acts on mask
rows only, and no real row sees a mask. tiny-random's shipped adapter is trained on a tiny corpus
of a random model, so its guesses are rarely right; an oracle (mask rows replaced by the true next
tokens) drives the accept-everything path, and a statistical test checks the sampling rule.
"""

import dataclasses
import itertools
from functools import partial

import pytest
import torch
from test_speculative import CHI2_9DOF_1E3, bin_counts, next_token_probs, pit, uniformity_chi2

import decoders.methods.space as space
from conftest import KERNEL_TOL, PROMPTS, greedy, matches_greedy, one_thread, oracle_masks
from decoders import METHODS, InvalidParameter, generate
from decoders.core import models
from decoders.core.events import AttentionMask, Commit, Draft, Forward, MaskGroups, Verify
from decoders.trained.mask_model import MaskAdapter, load_adapter, masked_forward


@pytest.fixture(autouse=True)
def one_torch_thread():
    with one_thread():
        yield


same_as_greedy = partial(matches_greedy, method="space")


# --- the layout -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "k"), [(0, 1), (0, 3), (2, 2), (3, 4), (5, 5)])
def test_the_layout_hides_every_group_and_positions_count_what_an_input_sees(m, k):
    in_cache = 7
    real, positions, mask, group = space.layout(m, k, in_cache)
    n = len(group)
    assert n == 1 + k + m * (k + 1) and len(real) == m + 1
    sees = mask[0, 0, :, in_cache:] == 0
    assert (mask[0, 0, :, :in_cache] == 0).all()  # the cache is visible to every input
    for row in range(n):
        visible = sees[row].nonzero().flatten().tolist()
        # Position = how many inputs (cached or new) it sees besides itself.
        assert positions[row] == in_cache + len(visible) - 1
        for col in visible:
            assert col <= row  # causal
            if group[col] >= 0:  # a mask is seen only by the later masks of its own group
                assert group[row] == group[col]
        if group[row] < 0:
            assert visible == real[: real.index(row) + 1]  # exactly plain decoding's view


# --- lossless -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("k", "groups"), [(0, 0), (1, 1), (2, 1), (3, 3), (3, 2), (2, 5)])
def test_lossless_on_tiny(tiny, k, groups):
    for prompt in PROMPTS[:4]:
        res = same_as_greedy(tiny, prompt, 32, k=k, groups=groups)
        kk = k or load_adapter(tiny).k
        verifies = [e for e in res.events if isinstance(e, Verify)]
        assert all(v.rule == "greedy-chain" for v in verifies)
        for f in res.events:
            if isinstance(f, Forward) and f.kind in ("verify", "target"):
                m = (f.n_input_tokens - 1 - kk) // (kk + 1)
                assert f.n_input_tokens == 1 + kk + m * (kk + 1)
                assert m <= (groups or kk)


def test_real_rows_never_see_the_adapter(tiny):
    """The same inputs through an untrained adapter and a scrambled one: every real row's logits
    are bit-identical (the adapter only writes mask rows, and no real row attends to a mask)."""
    torch.manual_seed(1)
    quiet = MaskAdapter(tiny.model.config, 3, 4, 8)
    loud = MaskAdapter(tiny.model.config, 3, 4, 8)
    with torch.no_grad():
        for p in loud.parameters():
            p.normal_(0, 0.5)
    ids = tiny.encode(PROMPTS[0], chat=False)
    real, positions, mask, _ = space.layout(3, 3, 0)
    tokens = [*ids[:4], *[0] * 12]
    out = {}
    for name, adapter in (("quiet", quiet), ("loud", loud)):
        with torch.no_grad():
            out[name] = masked_forward(
                tiny,
                adapter,
                None,
                torch.tensor([tokens]),
                4,
                torch.tensor([positions]),
                mask,
            )[0]
    assert torch.equal(out["quiet"][real], out["loud"][real])
    assert not torch.allclose(out["quiet"][4:], out["loud"][4:])
    # And the real rows are the plain model's.
    with torch.no_grad():
        plain = tiny.model(input_ids=torch.tensor([ids[:4]])).logits[0]
    torch.testing.assert_close(tiny.model.lm_head(out["loud"][real]), plain, **KERNEL_TOL)


@pytest.mark.parametrize("packed", [True, False])
def test_a_frozen_adapter_fuses_its_groups_to_the_same_guesses(tiny, packed):
    """Decoding's adapter (frozen: each group's A's stacked for one product; packed, under the
    group's first base projection in one linear) gives the mask rows the per-projection adapter's
    values, and the real rows the base linears' (up to the kernels' rounding: another shape)."""
    if packed and not tiny.packed:
        pytest.skip("no oneDNN packing in this torch build")
    torch.manual_seed(2)
    trained = MaskAdapter(tiny.model.config, 3, 4, 8)
    with torch.no_grad():
        for p in trained.parameters():
            p.normal_(0, 0.3)
    frozen = MaskAdapter(tiny.model.config, 3, 4, 8)
    frozen.load_state_dict(trained.state_dict())
    frozen.requires_grad_(False).freeze(tiny.model, packed)
    assert trained.fused is None and len(frozen.fused) == tiny.n_layers
    stacked, a, outputs = frozen.fused[0]["qkv"]
    assert [b.shape for b, _ in outputs] == [(4, 64), (4, 32), (4, 32)]
    if packed:  # q's base weight and the three A's in one linear (k, v: the model's own)
        assert (stacked.out_features, stacked.in_features) == (64 + 3 * 4, 64)
        assert a is None  # the A's live in that linear only
    else:  # no copy of a base weight; the A's stacked for one product
        assert stacked is None and a.shape == (64, 3 * 4)
    assert frozen.state_dict().keys() == trained.state_dict().keys()  # nothing new to save
    ids = tiny.encode(PROMPTS[0], chat=False)
    real, positions, mask, _ = space.layout(3, 3, 0)
    tokens = torch.tensor([[*ids[:4], *[0] * 12]])
    with torch.no_grad():
        one, fused = (
            masked_forward(tiny, m, None, tokens, 4, torch.tensor([positions]), mask)[0]
            for m in (trained, frozen)
        )
    torch.testing.assert_close(one[real], fused[real], **KERNEL_TOL)  # another weight shape
    torch.testing.assert_close(one[4:], fused[4:], **KERNEL_TOL)  # summed in another order
    assert not torch.allclose(one[4:], fused[4:].roll(1, 0))  # the mask rows do differ
    # It serves the model it copied from, and no other.
    assert frozen.freeze(tiny.model, packed) is frozen
    with pytest.raises(RuntimeError, match="another model"):
        frozen.freeze(models._load("tiny-random", torch.device("cpu"), torch.float32).model)


def test_a_loaded_adapter_belongs_to_the_model_object_it_was_loaded_for(tiny):
    """Artifacts are cached per loaded model, not per model id: a second bundle of the same id
    with other weights gets its own adapter, frozen for its own weights."""
    private = models._load("tiny-random", torch.device("cpu"), torch.float32)
    mine, theirs = load_adapter(tiny), load_adapter(private)
    assert mine is load_adapter(tiny) and theirs is not mine
    assert mine.frozen_for() is tiny.model and theirs.frozen_for() is private.model


@pytest.fixture()
def oracle(monkeypatch, tiny):
    """Mask rows predict the true greedy continuation: a mask at absolute position P gets a
    one-hot on the reference token at P + 1. Returns the list to fill with the reference."""
    return oracle_masks(monkeypatch, space)


@pytest.mark.parametrize(("k", "groups", "budget"), [(3, 3, 40), (3, 2, 23), (2, 2, 7)])
def test_perfect_guesses_are_all_accepted(tiny, oracle, k, groups, budget):
    prompt_ids = tiny.encode(PROMPTS[1])
    ref = greedy(tiny, PROMPTS[1], budget)
    oracle.extend([*prompt_ids, *ref.token_ids])
    res = same_as_greedy(tiny, PROMPTS[1], budget, k=k, groups=groups)
    commits = [e for e in res.events if isinstance(e, Commit)]
    done = 1
    for c in commits[1:]:
        want = min(groups, budget - done - 1)  # every candidate accepted, plus the bonus
        assert len(c.tokens) == want + 1, (done, c)
        assert c.origins == ("draft",) * want + ("bonus" if want else "target",)
        done += len(c.tokens)
    assert done == budget
    assert res.stats["tokens_per_target_forward"] > 1.9


def test_an_eos_inside_the_guesses_stops_like_autoregressive(tiny, oracle):
    free = greedy(tiny, PROMPTS[2], 40)
    # Each step commits 4 guesses and a bonus (output indices 5, 10, ...): stop on a guess.
    eos_at = next(i for i in range(6, 40) if i % 5 and free.token_ids[i] not in free.token_ids[:i])
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({free.token_ids[eos_at]}))
    oracle.extend([*tiny.encode(PROMPTS[2]), *free.token_ids])
    res = same_as_greedy(bundle, PROMPTS[2], 40, k=3, groups=3)
    assert res.finish_reason == "eos" and res.token_ids == free.token_ids[: eos_at + 1]
    last = [e for e in res.events if isinstance(e, Commit)][-1]
    verify = [e for e in res.events if isinstance(e, Verify)][-1]
    assert last.origins[-1] == "draft"  # the EOS was a guess, accepted, and ended the output
    assert len(verify.accepted) >= len(last.tokens)


@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_guesses_never_run_past_the_budget(tiny, oracle, budget):
    ref = greedy(tiny, PROMPTS[0], budget)
    oracle.extend([*tiny.encode(PROMPTS[0]), *ref.token_ids, *ref.token_ids])
    res = same_as_greedy(tiny, PROMPTS[0], budget, k=3, groups=3)
    for d in (e for e in res.events if isinstance(e, Draft)):
        done = sum(len(c.tokens) for c in res.events if isinstance(c, Commit) and c.step < d.step)
        assert len(d.tokens) <= budget - done - 1


# --- the relay's events ---------------------------------------------------------------------------


def test_each_step_records_its_groups_its_mask_and_the_handover(tiny):
    res = same_as_greedy(tiny, PROMPTS[3], 24, k=3)
    relay = [e for e in res.events if isinstance(e, MaskGroups)]
    masks = {e.step: e for e in res.events if isinstance(e, AttentionMask)}
    verifies = {e.step: e for e in res.events if isinstance(e, Verify)}
    assert relay[0].step == 0 and len(relay[0].groups) == 1
    for before, now in itertools.pairwise(relay):
        # The guesses handed over are what the next step verifies.
        assert now.candidates == before.guesses[: len(now.candidates)]
        assert len(now.groups) == len(now.candidates) + 1
        accepted = len(verifies[now.step].accepted) if now.step in verifies else 0
        assert now.handed == accepted
        assert now.guesses == now.groups[now.handed]  # greedy: the group's argmaxes
        mask = masks[now.step]
        assert mask.labels[0] == "x" and mask.branches.count("mask") == 3 * len(now.groups)
    # A step's relay comes before its Commit: the page, drawn at each Commit while streaming (or
    # left there by Stop), always has the relay of the step it shows.
    for i, e in enumerate(res.events):
        if isinstance(e, Commit) and e.step > 0:
            assert any(isinstance(g, MaskGroups) and g.step == e.step for g in res.events[:i])


def test_more_masks_than_the_adapter_was_trained_with_is_a_clear_error(tiny):
    with pytest.raises(InvalidParameter, match="trained with k = 3"):
        generate(tiny, "hi", "space", 4, k=4)


def test_a_model_without_an_adapter_is_a_clear_error():
    from decoders import load_model

    with pytest.raises(InvalidParameter, match="train one with"):
        generate(load_model("tiny-random-2"), "hi", "space", 4)


def test_a_model_that_is_not_llama_style_is_a_clear_error(tiny, monkeypatch):
    from decoders.trained.mask_model import load_adapter

    monkeypatch.setattr(tiny.model.config, "model_type", "gpt2")
    with pytest.raises(InvalidParameter, match="Llama-style"):
        load_adapter(tiny)


# --- sampling -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sampling_follows_the_target_distribution(tiny):
    """Temperature 1: the second token (the first one verified from a mask's guess) follows the
    target's exact distribution given the first."""
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    runs = [
        generate(tiny, prompt_ids, "space", 3, temperature=1.0, seed=s, k=3) for s in range(240)
    ]
    assert all(len(r.token_ids) == 3 for r in runs)
    contexts = [[*prompt_ids, r.token_ids[0]] for r in runs]
    p = next_token_probs(tiny, contexts, 1.0)
    seconds = [r.token_ids[1] for r in runs]
    u = pit(seconds, p, p, seed=7)
    assert uniformity_chi2(u) < CHI2_9DOF_1E3, bin_counts(u)
    # Every second token went through the rule: a drafted guess, verified in step 1.
    assert all(
        any(isinstance(e, Verify) and e.step == 1 for e in r.events)
        and any(isinstance(e, Draft) and e.step == 1 for e in r.events)
        for r in runs
    )


# --- the views ------------------------------------------------------------------------------------


def test_the_relay_and_the_real_mask_are_drawn_for_every_step(tiny, oracle):
    from visualizer.mask_view import attention_mask
    from visualizer.panels import extra_panels, method_panel
    from visualizer.space_view import RELAY_STATUS, relay

    ref = greedy(tiny, PROMPTS[1], 20)
    oracle.extend([*tiny.encode(PROMPTS[1]), *ref.token_ids[:9]])  # right, then on its own
    res = same_as_greedy(tiny, PROMPTS[1], 20, k=3)
    texts = {t: tiny.tokenizer.decode([t]) for e in res.events for t in _ids(e)}
    steps = sorted({e.step for e in res.events if isinstance(e, MaskGroups)})
    handed_code = list(RELAY_STATUS).index("handed")
    for step in steps:
        fig = relay(res.events, texts, step)
        groups = next(e for e in res.events if isinstance(e, MaskGroups) and e.step == step)
        z = fig.data[0].z
        row = groups.handed + (2 if step else 0)  # after step 0: guesses, committed, groups
        assert handed_code in z[row] and sum(handed_code in r for r in z) == 1
        assert method_panel(METHODS["space"].views, res.events, texts, step).layout.title.text
        if step:
            (mask_fig,) = extra_panels(METHODS["space"].views, res.events, texts, step)
            assert "mask" in mask_fig.layout.title.text or mask_fig.data
            assert attention_mask(res.events, texts, step).data[0].z
            words = mask_fig.layout.title.subtitle.text + " ".join(d.name for d in mask_fig.data)
            assert "lookahead" not in words and "n-gram" not in words  # SPACE's own names
    assert "no SPACE relay" in str(relay([], {}, 1).layout.annotations[0].text)


def _ids(event):
    from decoders.core.events import token_ids

    return token_ids(event)


def test_a_saved_adapter_loads_back_to_the_same_guesses(tiny, tmp_path):
    from decoders.trained.artifacts import save_artifact

    torch.manual_seed(4)
    adapter = MaskAdapter(tiny.model.config, 3, 4, 8)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_(0, 0.1)
    path = tmp_path / "space.safetensors"
    save_artifact(adapter, path, {"model": "tiny-random", "artifact": "space"})
    loaded = load_adapter(tiny, path)
    assert (loaded.k, loaded.rank, loaded.scale) == (3, 4, 2.0)
    ids = tiny.encode(PROMPTS[0], chat=False)
    inputs = torch.tensor([ids + [0] * 3])
    with torch.no_grad():
        a, b = (
            masked_forward(tiny, m, None, inputs, len(ids), torch.arange(len(ids) + 3)[None], None)
            for m in (adapter.half().float(), loaded)  # the file holds float16 weights
        )
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# --- the embedded model ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("prompt", "chat"), [(PROMPTS[0], False)])  # raw code; chat: test_lossless
def test_lossless_on_the_embedded_model(embedded, prompt, chat):
    for params in ({}, {"k": 2, "groups": 1}, {"groups": 2}):
        res = same_as_greedy(embedded, prompt, 48, chat=chat, **params)
    assert res.stats["tokens_per_target_forward"] > 1.0  # the trained guesses are sometimes right
