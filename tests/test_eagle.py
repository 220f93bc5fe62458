"""EAGLE drafting (decoders/trained/eagle.py) and its trainer (decoders/train/eagle.py).

A head is fitted in-test to tiny-random's own greedy text on the test prompts, so that drafts are
often accepted and every path (history catch-up, predicted features, tree parents, the target's
features handed back after verification) carries weight. Each drafted node's probability is then
recomputed from scratch, without any cache, and both methods are checked token for token against
autoregressive greedy.
"""

import argparse
import dataclasses
import json
import re

import pytest
import torch
from test_speculative import (
    CHI2_9DOF_1E3,
    bin_counts,
    next_token_probs,
    pit,
    sampled_second_tokens,
    uniformity_chi2,
)

from conftest import PROMPTS, greedy, matches_greedy, one_thread
from decoders import InvalidParameter, stream
from decoders.core.events import Commit, Draft, Forward, Verify
from decoders.train.corpus import Corpus
from decoders.train.eagle import fit_head
from decoders.train.states import Prepared, States, draft_vocabulary, target_states, windows
from decoders.trained.drafters import auto_draft
from decoders.trained.eagle import EagleHead, head_path, load_head, save_head


@pytest.fixture(autouse=True, scope="module")  # module scope: before `fitted` trains
def one_torch_thread():
    with one_thread():
        yield


def fit(tiny, tmp_path_factory, name: str, **eagle3):
    """(head, path): a head fitted to tiny-random's greedy continuations of the test prompts."""
    docs = []
    for prompt in PROMPTS:
        ref = greedy(tiny, prompt, 60, chat=False)
        docs.append(tiny.encode(prompt, chat=False) + list(ref.token_ids))
    corpus = Corpus(docs, ["code"] * len(docs))
    everything = list(range(len(docs)))  # fitted to these texts, and scored on them
    states = target_states(tiny, corpus, tuple(eagle3.get("fuse", ())))
    prep = Prepared(tiny, corpus, states, everything, everything, 0.0)
    args = argparse.Namespace(
        vocab=4096,
        window=32,
        batch_size=4,
        epochs=80 if eagle3.get("init") is None else 12,
        lr=1e-2,
        seed=0,
        cls_weight=1.0,
        warmup=0.05,
        max_steps=0,
        minutes=0.0,
        resume=False,
        **{"init": None, **eagle3},
    )
    head, result = fit_head(prep, args)  # no checkpoint: nothing written outside tmp
    path = tmp_path_factory.mktemp("eagle") / f"{name}.safetensors"
    save_head(head, path, {"model": tiny.model_id, "held_out_top1": result["held_out"]})
    return head, path


@pytest.fixture(scope="module")
def fitted(tiny, tmp_path_factory):
    return fit(tiny, tmp_path_factory, "fitted")


EAGLE3 = {"fuse": (1, 2), "unroll": 4, "reg_weight": 0.0, "step_decay": 0.8, "topk": 0}


@pytest.fixture(scope="module")
def fitted3(tiny, tmp_path_factory, fitted):
    """An EAGLE-3 head: tiny-random's states after layers 1 and 2 fused with its features,
    tokens only, a training-time test over 4 steps; grown from the fitted EAGLE-1 head (as the
    recipe grows the shipped one), so a few epochs suffice."""
    return fit(tiny, tmp_path_factory, "fitted3", **{**EAGLE3, "init": str(fitted[1])})


@pytest.fixture(params=["eagle", pytest.param("eagle3", marks=pytest.mark.slow)])
def either(request):
    """Each head in turn, for the checks that must hold for both (the fitted EAGLE-3 head in the
    full tier; the fast tier checks an untrained one below)."""
    return request.getfixturevalue("fitted" if request.param == "eagle" else "fitted3")


@pytest.fixture(scope="module")
def untrained3(tiny, tmp_path_factory):
    """(head, path): an untrained EAGLE-3 head whose fusion reads every layer it is given."""
    torch.manual_seed(4)
    head = EagleHead(tiny.model.config, torch.arange(0, 4096), EAGLE3["fuse"])
    torch.nn.init.normal_(head.fuse_fc.weight, std=0.05)
    path = tmp_path_factory.mktemp("eagle3") / "untrained.safetensors"
    save_head(head, path, {"model": tiny.model_id})
    return head, path


def spec(fitted) -> str:
    return f"eagle:{fitted[1]}"


def same_as_greedy(bundle, prompt, method, max_new_tokens, **params):
    return matches_greedy(bundle, prompt, max_new_tokens, method, chat=False, **params)


def accepted(res) -> int:
    return sum(len(e.accepted) for e in res.events if isinstance(e, Verify))


# --- the head and its file ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_fitted_head_drafts_what_the_target_writes(fitted, tiny):
    head = load_head(tiny, fitted[1])
    res = same_as_greedy(
        tiny, PROMPTS[0], "speculative", 40, draft=spec(fitted), gamma=4, schedule="fixed"
    )
    # Drafts are often right, so the accepted-path bookkeeping is exercised for real.
    assert res.stats["tokens_per_target_forward"] > 2.0, res.stats
    assert max(len(e.accepted) for e in res.events if isinstance(e, Verify)) == 4
    assert len(head.vocab) <= 4097 and head.vocab.tolist() == sorted(head.vocab.tolist())


@pytest.mark.parametrize("draft_dtype", [torch.float32, torch.bfloat16])
def test_an_eagle_3_head_drafts_what_it_computes_from_the_fused_layers(
    untrained3, tiny, draft_dtype
):
    """The target hands the drafter its states after the fused layers beside its features, in
    the order the head was trained on: every drafted probability is the head's from scratch
    (float32); in bfloat16 the fusion runs in it too, and the output stays greedy."""
    bundle = dataclasses.replace(tiny, draft_dtype=draft_dtype)
    params = {"shape": "dynamic", "depth": 3, "top_k": 2, "nodes": 6, "size": "fixed"}
    res = same_as_greedy(bundle, PROMPTS[5], "token_tree", 16, draft=spec(untrained3), **params)
    head = load_head(bundle, untrained3[1])
    assert head.fuse_fc.weight.dtype == draft_dtype
    if draft_dtype == torch.bfloat16:
        return
    check_probs_from_scratch(head, tiny, res, tiny.encode(PROMPTS[5], chat=False), steps=3)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["speculative", "token_tree"])
def test_an_eagle_3_head_drafts_from_the_fused_layers_and_stays_greedy(fitted3, tiny, method):
    head = load_head(tiny, fitted3[1])
    assert head.fused_layers == EAGLE3["fuse"]
    total = 0
    for prompt in PROMPTS:
        res = same_as_greedy(tiny, prompt, method, 40, draft=spec(fitted3))
        total += accepted(res)
        sources = {e.source for e in res.events if isinstance(e, Draft)}
        assert any(
            s.startswith("eagle-3 (1 trained layer on the target's layers 1, 2") for s in sources
        )
    assert total > len(PROMPTS) * 10  # it drafts what the target writes


def test_saved_heads_load_as_float16_files_with_their_card(fitted, tiny):
    head, path = fitted
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["model"] == tiny.model_id and card["held_out_top1"]["top1_code"] > 0.5
    loaded = load_head(tiny, path)
    assert loaded.vocab.tolist() == head.vocab.tolist()
    w = head.fc.weight.detach()
    assert torch.allclose(loaded.fc.weight.float(), w.half().float())


def test_draft_vocabulary_is_the_most_predicted_tokens_plus_eos(tiny):
    docs = [tiny.encode(p, chat=False) for p in PROMPTS]
    states = target_states(tiny, Corpus(docs, ["chat"] * len(docs)))
    vocab = draft_vocabulary(tiny, states, 5)
    predicted = (states.features.float() @ tiny.model.lm_head.weight.T).argmax(-1)
    top = torch.bincount(predicted).topk(1).indices.item()
    assert top in vocab.tolist() and set(tiny.eos_ids) <= set(vocab.tolist())
    assert len(vocab) <= 5 + len(tiny.eos_ids)


def test_training_windows_cover_every_pair_and_never_cross_documents():
    # Documents [0, 4), [4, 5) (one token: no pair), [5, 10); windows of at most 2 pairs.
    states = States(torch.zeros(10), [0, 4, 5], torch.zeros(10, 1), {}, ["code"] * 3)
    spans = windows(states, [0, 1, 2], 2)
    assert spans == [(0, 3), (2, 4), (5, 8), (7, 10)]
    pairs = [(i, i + 1) for a, b in spans for i in range(a, b - 1)]
    assert pairs == [(0, 1), (1, 2), (2, 3), (5, 6), (6, 7), (7, 8), (8, 9)]


@pytest.mark.parametrize("method", ["speculative", "token_tree"])
def test_a_bfloat16_head_drafts_and_the_output_stays_greedy(fitted, tiny, method):
    """Where the CPU multiplies bfloat16 natively the head drafts in it (packing.draft_dtype): the
    guesses may move, the output may not."""
    bf16 = dataclasses.replace(tiny, draft_dtype=torch.bfloat16)
    head = load_head(bf16, fitted[1])
    assert head.fc.weight.dtype == head.lm_head.weight.dtype == torch.bfloat16
    assert load_head(tiny, fitted[1]).fc.weight.dtype == torch.float32  # cached apart
    for prompt in PROMPTS[:3]:
        res = same_as_greedy(bf16, prompt, method, 32, draft=spec(fitted))
        assert accepted(res) > 0  # the bfloat16 drafts still land


def test_missing_head_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(InvalidParameter, match=r"no trained EAGLE head.*decoders.train eagle"):
        load_head(tiny, tmp_path / "none.safetensors")
    with pytest.raises(InvalidParameter, match="no trained EAGLE head"):
        stream(tiny, PROMPTS[0], "speculative", 8, draft=f"eagle:{tmp_path}/none.safetensors")


def test_a_head_for_another_shape_is_a_clear_error(fitted, embedded):
    with pytest.raises(InvalidParameter, match=r"EAGLE head: fitted\.safetensors does not fit"):
        load_head(embedded, fitted[1])


# --- drafting is what the head computes from scratch ----------------------------------------------


def reference_probs(head, bundle, context, path):
    """The head's draft distribution after `path` (draft tokens after x = context[-1]), computed
    without a cache: real target features for the context, then the head's own predictions."""
    ids = torch.tensor([context[:-1]])
    with torch.inference_mode():
        out = bundle.model.model(input_ids=ids, output_hidden_states=True)
        # hidden_states[ℓ]: after ℓ layers (the last one is the final norm's output)
        states = [out.hidden_states[ell] for ell in head.fused_layers] + [out.last_hidden_state]
        feats = list(head.fused(torch.cat(states, -1))[0])
        tokens = [*context[1:], *path]
        for i in range(len(path) + 1):
            n = len(context) - 1 + i
            embeds = bundle.model.model.embed_tokens(torch.tensor([tokens[:n]]))
            pred = head(embeds, torch.stack(feats[:n])[None], torch.arange(n)[None])[0, -1]
            feats.append(pred)
        logits = pred @ bundle.model.lm_head.weight[head.vocab].T
    probs = torch.zeros(bundle.model.config.vocab_size)
    probs[head.vocab] = torch.softmax(logits, -1)
    return probs


def check_probs_from_scratch(head, bundle, res, prompt_ids, steps: int) -> None:
    """Each drafted node's probability in the first `steps` steps (at least 3 drafted) is the
    head's own, run from scratch on its path (`reference_probs`)."""
    by_step = contexts_by_step(res, prompt_ids)
    assert len(by_step) >= 3
    for context, draft in list(by_step.values())[:steps]:
        for i, (token, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
            path = []
            while parent >= 0:
                path.insert(0, draft.tokens[parent])
                parent = draft.parents[parent]
            expected = float(reference_probs(head, bundle, context, path)[token])
            assert draft.probs[i] == pytest.approx(expected, abs=1e-4), (draft.step, i)


def contexts_by_step(res, prompt_ids):
    context, out = list(prompt_ids), {}
    for e in res.events:
        if isinstance(e, Draft):
            out[e.step] = (list(context), e)
        if isinstance(e, Commit):
            context += e.tokens
    return out


@pytest.mark.parametrize(
    "method, params",
    [
        ("speculative", {"gamma": 5, "schedule": "fixed"}),
        # Fixed size: sized to this machine, the tiny head's unsure drafts would rarely pay.
        ("token_tree", {"shape": "dynamic", "depth": 3, "top_k": 2, "nodes": 6, "size": "fixed"}),
        ("token_tree", {"shape": "static", "choices": "0 1 0.0 0.1 1.0 0.0.0"}),
    ],
)
def test_every_drafted_probability_matches_the_head_run_from_scratch(either, tiny, method, params):
    head = load_head(tiny, either[1])
    prompt_ids = tiny.encode(PROMPTS[5], chat=False)
    res = same_as_greedy(tiny, PROMPTS[5], method, 30, draft=spec(either), **params)
    check_probs_from_scratch(head, tiny, res, prompt_ids, steps=4)
    # Draft forwards are one layer deep and cheap; the first of a step carries the catch-up.
    drafts = [e for e in res.events if isinstance(e, Forward) and e.kind == "draft"]
    assert drafts and all(e.layers == 1 for e in drafts)


# --- lossless -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
@pytest.mark.parametrize(
    "gamma, schedule", [(1, "fixed"), (3, "fixed"), (4, "adaptive"), (12, "fixed")]
)
def test_speculative_with_eagle_is_lossless(fitted, tiny, prompt, gamma, schedule):
    same_as_greedy(
        tiny, PROMPTS[prompt], "speculative", 48, draft=spec(fitted), gamma=gamma, schedule=schedule
    )


@pytest.mark.slow
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
@pytest.mark.parametrize(
    "params",
    [
        {"shape": "dynamic"},
        {"shape": "dynamic", "depth": 8, "top_k": 1, "nodes": 8},
        {"shape": "dynamic", "depth": 2, "top_k": 4, "nodes": 16},
        {"shape": "static"},
    ],
)
def test_token_tree_with_eagle_is_lossless(fitted, tiny, prompt, params):
    same_as_greedy(tiny, PROMPTS[prompt], "token_tree", 48, draft=spec(fitted), **params)


@pytest.mark.parametrize("method", ["speculative", "token_tree"])
@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_eagle_drafts_never_run_past_the_budget(either, tiny, method, budget):
    params = {"gamma": 8, "schedule": "fixed"} if method == "speculative" else {"depth": 8}
    res = same_as_greedy(tiny, PROMPTS[0], method, budget, draft=spec(either), **params)
    assert len(res.token_ids) == budget
    for e in res.events:
        if isinstance(e, Draft):
            committed = sum(
                len(c.tokens) for c in res.events if isinstance(c, Commit) and c.step < e.step
            )
            assert max(depth_of(e.parents)) <= budget - committed - 1


def depth_of(parents):
    out = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


@pytest.mark.parametrize("method", ["speculative", "token_tree"])
def test_eos_inside_an_accepted_draft_stops_like_autoregressive(either, tiny, method):
    fixed = {"size": "fixed"} if method == "token_tree" else {}  # drafts even when unsure
    free = same_as_greedy(tiny, PROMPTS[0], method, 40, draft=spec(either), **fixed)
    # A token first committed as an accepted draft, not at the end of its step's commit.
    pos, eos, position = 0, None, None
    seen: set[int] = set()
    for e in (e for e in free.events if isinstance(e, Commit)):
        for j, (t, o) in enumerate(zip(e.tokens, e.origins, strict=True)):
            if eos is None and o == "draft" and j < len(e.tokens) - 1 and t not in seen:
                eos, position = t, pos + j
            seen.add(t)
        pos += len(e.tokens)
    assert eos is not None
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    res = same_as_greedy(bundle, PROMPTS[0], method, 40, draft=spec(either), **fixed)
    assert res.finish_reason == "eos" and res.token_ids == free.token_ids[: position + 1]


@pytest.mark.slow
@pytest.mark.parametrize("draft_dtype", [torch.float32, torch.bfloat16])
def test_eagle_sampling_follows_the_target_distribution(fitted, tiny, draft_dtype):
    """The second token (the first verified step) at temperature 1 follows the target exactly,
    whether the head drafts in float32 or bfloat16 (q is what the head gave, whatever its dtype)."""
    bundle = dataclasses.replace(tiny, draft_dtype=draft_dtype)
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    firsts, seconds, runs = sampled_second_tokens(
        bundle, prompt_ids, "speculative", range(200), 1.0, draft=spec(fitted), gamma=1
    )
    p = next_token_probs(tiny, [[*prompt_ids, t] for t in firsts], 1.0)
    u = pit(seconds, p, p, seed=1)
    assert uniformity_chi2(u) < CHI2_9DOF_1E3, bin_counts(u)
    kept = sum(bool(next(e for e in r.events if isinstance(e, Verify)).accepted) for r in runs)
    assert 0 < kept < len(runs)  # the rule both keeps and rejects


# --- the training command and the shipped heads ---------------------------------------------------


@pytest.mark.parametrize("model_id", ["tiny-random", "SmolLM2-135M-Instruct"])
def test_shipped_heads_exist_with_the_command_that_made_them(model_id):
    path = head_path(model_id)
    card = json.loads(path.with_suffix(".json").read_text())
    assert path.is_file() and card["model"] == model_id
    good = 0.0 if model_id == "tiny-random" else 0.4
    if card["command"].startswith("python -m decoders.train_eagle"):  # made before decoders.train
        assert card["held_out"]["top1"] >= good
    else:  # `python -m decoders.train eagle`: held-out agreement per corpus source
        assert card["command"].startswith("python -m decoders.train eagle --model ")
        top1 = {  # the first draft step's agreement (later steps, when reported, end in _d2, _d3)
            k: v
            for k, v in card["held_out_top1"].items()
            if k.startswith("top1_") and not re.search(r"_d\d+$", k)
        }
        # one score per corpus source, and the probe's (outside the corpus) where it was scored
        assert {k.removeprefix("top1_") for k in top1} - {"probe"} == set(card["data"]["documents"])
        assert sum(top1.values()) / len(top1) >= good, top1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["speculative", "token_tree"])
def test_the_defaults_draft_with_the_shipped_head_on_the_embedded_model(embedded, method):
    from test_prompt_lookup import humaneval

    assert auto_draft(embedded) == "eagle"
    res = same_as_greedy(embedded, humaneval(0), method, 64)  # every parameter at its default
    sources = {e.source for e in res.events if isinstance(e, Draft)}
    assert sources and all(s.startswith(("eagle (auto: ", "prompt lookup (n=")) for s in sources)
    assert any(s.startswith("eagle (auto: ") for s in sources)
    if method == "token_tree":  # auto = the head + a copied branch (lookup=16, trust=3)
        assert any("prompt lookup (n=" in s for s in sources)
    assert res.stats["tokens_per_target_forward"] > 1.5, res.stats


def test_eagle_head_shapes_follow_the_target(tiny):
    head = EagleHead(tiny.model.config, torch.arange(10))
    d = tiny.model.config.hidden_size
    assert head.fc.in_features == 2 * d and head.fc.out_features == d
