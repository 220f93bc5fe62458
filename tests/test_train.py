"""decoders.train on tiny-random, on one module's target states: the training loop, every
artifact's round trip through its method's loader (and lossless decoding with it), EAGLE's
unrolled training-time test, warm starts, and the probe's scored positions. (The corpus and the
command line: test_train_corpus.py; what needs no shared states: test_train_options.py.)

tiny-random is a random model: its drafters are never good, so nothing here assumes a draft is
accepted. The cache (corpus, states, checkpoints) goes to a temporary DECODING_LAB_CACHE, and the
artifacts to a temporary stand-in for assets/.
"""

import copy
import dataclasses

import pytest
import torch

import decoders.trained.artifacts
import decoders.trained.kangaroo
from conftest import KERNEL_TOL, PROMPTS, ROOT, assert_greedy, one_thread
from decoders import InvalidParameter, generate
from decoders.train import eagle as eagle_trainer
from decoders.train import kangaroo as kangaroo_trainer
from decoders.train import medusa as medusa_trainer
from decoders.train.corpus import Corpus
from decoders.train.loop import Loop, init_weights, warm_start
from decoders.train.states import draft_vocabulary, target_states, windows
from decoders.trained.artifacts import artifact_path, read_card, save_artifact
from decoders.trained.eagle import EagleHead, load_head
from decoders.trained.kangaroo import KangarooAdapter, load_adapter
from decoders.trained.medusa_heads import MedusaHeads, load_heads

KINDS = ("eagle", "kangaroo", "medusa")
ELL = 2  # the Kangaroo exit layer trained here (tiny-random has 4 layers)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    with one_thread():
        yield


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    """Corpus, states and checkpoints in a temporary cache, never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DECODING_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def states(tiny):
    """The target's states over its own greedy continuations of the test prompts, two sources."""
    docs = []
    for prompt in PROMPTS:
        ref = generate(tiny, prompt, "autoregressive", 40, chat=False, record=False)
        docs.append(tiny.encode(prompt, chat=False) + list(ref.token_ids))
    sources = ["chat", "code"] * (len(docs) // 2)
    return target_states(tiny, Corpus(docs, sources), layers=(1, ELL))


@pytest.fixture(scope="module")
def vocab(tiny, states):
    return draft_vocabulary(tiny, states, 512)


def every_doc(states) -> list[int]:
    return list(range(len(states.starts)))


def fresh(kind: str, bundle, vocab, seed: int = 0, fuse=()) -> torch.nn.Module:
    """An untrained module of `kind`, as its trainer starts it (`fuse`: an EAGLE-3 head's)."""
    torch.manual_seed(seed)
    if kind == "eagle":
        return EagleHead(bundle.model.config, vocab, fuse)
    if kind == "kangaroo":
        return KangarooAdapter.from_target(bundle, ELL, vocab)
    return MedusaHeads(bundle.model.config, 3, vocab)


def loss(kind: str, module, bundle, states, spans, noise: float = 0.0) -> dict:
    """The trainer's own loss for `kind` on `spans` (EAGLE: `noise` on its input features)."""
    w = bundle.model.lm_head.weight[module.vocab].detach()
    if kind == "eagle":
        embed = bundle.model.model.embed_tokens
        pred = eagle_trainer.run_head(module, embed, states, spans, noise)
        return eagle_trainer.losses(w, *pred, cls_weight=1.0)
    if kind == "kangaroo":
        return kangaroo_trainer.losses(w, *kangaroo_trainer.run_adapter(module, states, ELL, spans))
    out = medusa_trainer.losses(w, *medusa_trainer.run_heads(module, states, spans))
    return {k: v for k, v in out.items() if not k.startswith("n_")}


NOISE = {"eagle": eagle_trainer.FEATURE_NOISE, "kangaroo": 0.0, "medusa": 0.0}


# --- the loop -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_few_steps_lower_the_loss_on_a_fixed_batch(kind, tiny, states, vocab):
    batch = windows(states, every_doc(states), 16)[:4]
    module = fresh(kind, tiny, vocab)
    top1 = "top1_head1" if kind == "medusa" else "top1"

    def held_out() -> dict[str, float]:
        out = loss(kind, module, tiny, states, batch)
        return {"loss": float(out["loss"].detach()), "top1": float(out[top1])}

    with torch.no_grad():
        before = held_out()
    result = Loop(epochs=25, lr=1e-2).fit(
        module, [batch], lambda b: loss(kind, module, tiny, states, b, NOISE[kind]), held_out
    )
    after = held_out()
    # The soft cross-entropy cannot fall below the target's own entropy (high on a random model),
    # so the loss falls by a fraction of a nat while agreement with the target's top-1 climbs.
    assert after["loss"] < before["loss"] - 0.2, (before, after)
    assert after["top1"] > before["top1"] + 0.25, (before, after)
    assert result["steps"] == 25 and [h["epoch"] for h in result["history"]] == list(range(1, 26))
    assert result["held_out"]["loss"] == pytest.approx(after["loss"])
    assert not module.training  # handed back in eval mode


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    kind, tiny, states, vocab, tmp_path
):
    spans = windows(states, every_doc(states), 8)
    batches = [spans[i : i + 2] for i in range(0, 6, 2)]  # 3 steps an epoch, 9 in all

    def run(module, checkpoint=None, resume=False, stop_at_call=0):
        calls = []

        def step_loss(batch):
            calls.append(batch)
            if len(calls) == stop_at_call:
                raise Interrupted
            return loss(kind, module, tiny, states, batch, NOISE[kind])

        loop = Loop(
            epochs=3, lr=3e-3, seed=1, checkpoint=checkpoint, resume=resume, checkpoint_every=2
        )
        result = loop.fit(module, batches, step_loss, lambda: {"n": len(calls)})
        return result, calls

    torch.manual_seed(7)  # EAGLE's feature noise draws from the global generator
    whole, _ = run(uninterrupted := fresh(kind, tiny, vocab))

    checkpoint = tmp_path / "run.ckpt"
    torch.manual_seed(7)
    with pytest.raises(Interrupted):  # cut during step 5: the last checkpoint is step 4's
        run(fresh(kind, tiny, vocab), checkpoint, stop_at_call=5)
    assert torch.load(checkpoint, weights_only=False)["step"] == 4

    torch.manual_seed(123)  # the checkpoint restores the generator too
    resumed = fresh(kind, tiny, vocab, seed=1)  # other initial weights: the checkpoint's win
    result, calls = run(resumed, checkpoint, resume=True)
    assert len(calls) == 5 and result["steps"] == 9  # steps 5..9 only
    assert [h["step"] for h in result["history"]] == [h["step"] for h in whole["history"]]
    assert uninterrupted.state_dict().keys() == resumed.state_dict().keys()
    for name, a in uninterrupted.state_dict().items():
        assert torch.equal(a, resumed.state_dict()[name]), name


def test_max_steps_stops_the_run_and_scores_it(tiny, states, vocab):
    batches = [[span] for span in windows(states, every_doc(states), 8)[:3]]
    module = fresh("medusa", tiny, vocab)
    result = Loop(epochs=3, lr=1e-3, max_steps=4).fit(
        module, batches, lambda b: loss("medusa", module, tiny, states, b), lambda: {"x": 1.0}
    )
    assert result["steps"] == 4
    assert [(h["epoch"], h["step"]) for h in result["history"]] == [(1, 3), (2, 4)]


# --- artifacts: saved, loaded by the method, decoded with ------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny, states, vocab, tmp_path_factory):
    """assets/-like folder holding an EAGLE head, a Kangaroo adapter (ℓ = ELL) and Medusa heads,
    each fitted for a few epochs to the states (so their weights are far from the initial ones),
    and the modules as they were before saving."""
    assets = tmp_path_factory.mktemp("assets")
    spans = windows(states, every_doc(states), 16)
    batches = [spans[i : i + 4] for i in range(0, len(spans), 4)]
    modules = {}
    for kind in KINDS:
        module = modules[kind] = fresh(kind, tiny, vocab)
        Loop(epochs=8, lr=1e-2).fit(
            module, batches, lambda b, k=kind, m=module: loss(k, m, tiny, states, b), dict
        )
        name = artifact_path(kind, tiny.model_id, f"l{ELL}" if kind == "kangaroo" else "").name
        save_artifact(module, assets / kind / name, {"model": tiny.model_id, "artifact": kind})
    return assets, modules


@pytest.fixture
def assets(trained, monkeypatch):
    """The trained artifacts where the methods look for shipped ones (this test only)."""
    monkeypatch.setattr(decoders.trained.artifacts, "ASSETS", trained[0])
    monkeypatch.setattr(decoders.trained.kangaroo, "ASSETS", trained[0])  # its shipped-ℓ listing
    return trained[0]


def load_back(kind: str, bundle):
    """`kind`'s artifact through its method's own loader (the default path: assets/)."""
    if kind == "eagle":
        return load_head(bundle)
    if kind == "kangaroo":
        return load_adapter(bundle, ELL)
    return load_heads(bundle)


def outputs(kind: str, module, bundle, states) -> torch.Tensor:
    a, b = states.span(1)
    positions = torch.arange(b - a)[None]
    with torch.no_grad():
        if kind == "eagle":
            embeds = bundle.model.model.embed_tokens(states.tokens[a:b][None])
            return module(embeds, states.features[a:b][None].float(), positions)
        if kind == "kangaroo":
            return module(states.layers[ELL][a:b][None].float(), positions)
        return module(states.features[a:b].float())


@pytest.mark.parametrize("kind", KINDS)
def test_a_saved_artifact_loads_back_through_its_method(kind, tiny, states, trained, assets):
    before = trained[1][kind]
    loaded = load_back(kind, tiny)
    assert loaded.vocab.tolist() == before.vocab.tolist()
    path = artifact_path(kind, tiny.model_id, f"l{ELL}" if kind == "kangaroo" else "")
    assert path.parent == assets / kind and read_card(path)["artifact"] == kind
    untrained = fresh(kind, tiny, before.vocab).state_dict()
    assert any(not torch.equal(v, untrained[k]) for k, v in before.state_dict().items())
    # float16 on disk: the loaded module computes what the trained one does with its weights
    # rounded to float16.
    rounded = copy.deepcopy(before).eval()
    for value in rounded.state_dict().values():
        if value.is_floating_point():
            value.copy_(value.half().float())
    expected = outputs(kind, rounded, tiny, states)
    got = outputs(kind, loaded, tiny, states)
    assert torch.allclose(got, expected, **KERNEL_TOL), (got - expected).abs().max()
    # ... and drafts through the target's own LM head, cut to the draft vocabulary.
    rows = tiny.model.lm_head.weight[before.vocab]
    assert torch.equal(loaded.lm_head.weight, rows)
    if kind == "kangaroo":
        assert int(loaded.exit_layer) == ELL


def same_as_greedy(bundle, prompt, method, max_new_tokens, **params):
    res = generate(bundle, prompt, method, max_new_tokens, chat=False, record=False, **params)
    ref = generate(bundle, prompt, "autoregressive", max_new_tokens, chat=False, record=False)
    assert_greedy(bundle, res, ref.token_ids)  # near-ties: conftest
    if res.token_ids == ref.token_ids:
        assert res.finish_reason == ref.finish_reason
    return res


# (method, params) that decode with each artifact; long drafts and short budgets on purpose.
DECODES = [
    ("speculative", {"draft": "eagle", "gamma": 3, "schedule": "fixed"}),
    ("speculative", {"draft": "eagle", "gamma": 12, "schedule": "fixed"}),
    ("token_tree", {"draft": "eagle", "shape": "dynamic", "depth": 6, "top_k": 2, "nodes": 10}),
    ("kangaroo", {"exit_layer": str(ELL), "eta": 0.0, "gamma": 8}),
    ("kangaroo", {"exit_layer": str(ELL), "eta": 0.6, "gamma": 3}),
    ("medusa", {}),
    ("blockwise", {"k": 3}),
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [0, 3, 5])
@pytest.mark.parametrize("budget", [2, 5, 24])
@pytest.mark.parametrize("method, params", DECODES)
def test_decoding_with_the_saved_artifacts_is_lossless(
    tiny, assets, method, params, budget, prompt
):
    same_as_greedy(tiny, PROMPTS[prompt], method, budget, **params)


@pytest.mark.parametrize("method, params", DECODES)
def test_the_methods_read_their_artifacts_from_the_stand_in(tiny, method, params, monkeypatch):
    # With an empty stand-in every method refuses, so the tests above decode with the files the
    # `trained` fixture wrote, not with the shipped ones.
    monkeypatch.setattr(decoders.trained.artifacts, "ASSETS", ROOT / "no-such-assets")
    monkeypatch.setattr(decoders.trained.kangaroo, "ASSETS", ROOT / "no-such-assets")
    with pytest.raises(InvalidParameter, match="no trained"):
        generate(tiny, PROMPTS[0], method, 4, chat=False, record=False, **params)


@pytest.mark.parametrize("method, params", DECODES)
def test_an_eos_the_target_writes_stops_them_like_autoregressive(tiny, assets, method, params):
    greedy = generate(tiny, PROMPTS[0], "autoregressive", 24, chat=False, record=False).token_ids
    eos = next(t for i, t in enumerate(greedy) if i >= 3 and t not in greedy[:i])
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    res = same_as_greedy(bundle, PROMPTS[0], method, 24, **params)
    assert res.finish_reason == "eos" and res.token_ids[-1] == eos


# --- EAGLE's training-time test (--unroll) --------------------------------------------------------


@pytest.mark.parametrize("fuse, depth", [((), 3), ((1,), 7)])
def test_the_unrolled_training_pass_is_what_the_head_computes_when_it_drafts(
    tiny, states, vocab, fuse, depth
):
    """Depth k at position j of one masked training pass = the head's k-th draft step begun
    after entry j - k + 1, run the way EagleDrafter runs it: real entries (an EAGLE-3 head:
    the fused layers' states) into its cache, then one entry per step fed what it predicted the
    step before."""
    from transformers import DynamicCache

    head = fresh("eagle", tiny, vocab, seed=3, fuse=fuse).eval()
    if fuse:  # away from the identity on the final features, so the fused layers count
        torch.nn.init.normal_(head.fuse_fc.weight, std=0.05)
    embed = tiny.model.model.embed_tokens
    a, b = states.span(0)
    with torch.no_grad():
        pred, _, valid = eagle_trainer.run_head(head, embed, states, [(a, b)], 0.0, depth)
        real = [states.layers[ell][a : b - 1] for ell in fuse] + [states.features[a : b - 1]]
        feats = head.fused(torch.cat(real, -1).float())
        ids = states.tokens[a + 1 : b]
        for start in (0, 5, 11):  # the draft begins after real entry `start`
            cache = DynamicCache()
            out = head(
                embed(ids[None, : start + 1]),
                feats[None, : start + 1],
                torch.arange(start + 1)[None],
                None,
                cache,
            )[0, -1]
            torch.testing.assert_close(pred[0, 0, start], out, **KERNEL_TOL)
            for k in range(2, depth + 1):
                j = start + k - 1
                out = head(
                    embed(ids[None, j : j + 1]), out[None, None], torch.tensor([[j]]), None, cache
                )[0, -1]
                assert valid[0, k - 1, j]
                torch.testing.assert_close(pred[0, k - 1, j], out, **KERNEL_TOL)
    assert not valid[0, 1, 0] and not valid[0, 2, 1] and valid[0, 2, 2]


@pytest.mark.parametrize(
    "fuse, weights",
    [
        ((), {}),
        # EAGLE-3: fused input, tokens only, 0.8^i per step; with HASS's top-K loss
        ((1,), {"reg_weight": 0.0, "step_decay": 0.8, "topk": 8}),
    ],
)
def test_unrolled_training_lowers_every_depth_s_loss(tiny, states, vocab, fuse, weights):
    batch = windows(states, every_doc(states), 16)[:4]
    head = fresh("eagle", tiny, vocab, fuse=fuse)
    w = tiny.model.lm_head.weight[head.vocab].detach()
    embed = tiny.model.model.embed_tokens

    def losses(b):
        return eagle_trainer.losses(
            w, *eagle_trainer.run_head(head, embed, states, b, 0.0, 3), 1.0, **weights
        )

    def scores():
        with torch.no_grad():
            return losses(batch)

    before = scores()
    Loop(epochs=25, lr=1e-2).fit(head, [batch], losses, lambda: {})
    after = scores()
    assert after["loss"] < before["loss"] - 0.2
    for key in ("top1", "top1_d2", "top1_d3"):
        assert after[key] > before[key] + 0.2, (key, before, after)
    if fuse:  # the fused layers' part of the input map learned something
        assert head.fuse_fc.weight[:, : -tiny.model.config.hidden_size].abs().max() > 1e-3


def test_step_weights_and_top_k_shape_the_token_loss(tiny, states, vocab):
    """Step k weighs decay^k (positions pooled); top-K adds the K likeliest target tokens' term."""
    head = fresh("eagle", tiny, vocab, fuse=(1,))
    w = tiny.model.lm_head.weight[head.vocab].detach()
    batch = windows(states, every_doc(states), 16)[:2]
    with torch.no_grad():
        out = eagle_trainer.run_head(head, tiny.model.model.embed_tokens, states, batch, 0.0, 2)
        pred, nexts, valid = out
        one = [
            eagle_trainer.losses(w, pred[:, k : k + 1], nexts, valid[:, 1:2], 1.0) for k in (0, 1)
        ]
        valid1 = valid.clone()
        valid1[:, 0] = valid[:, 1]  # equal position counts per step: a weighted mean of the two
        mixed = eagle_trainer.losses(w, pred, nexts, valid1, 1.0, step_decay=0.5)
        expected = (one[0]["cls"] + 0.5 * one[1]["cls"]) / 1.5
        torch.testing.assert_close(mixed["cls"], expected, rtol=1e-4, atol=1e-5)
        full = eagle_trainer.losses(w, *out, 1.0)["cls"]
        hass = eagle_trainer.losses(w, *out, 1.0, topk=1)["cls"]
        # HASS adds the target's likeliest token's term once more: -p_top log q_top, averaged
        p = torch.softmax(nexts[:, None].expand_as(pred)[valid] @ w.T, -1)
        q = torch.log_softmax(pred[valid] @ w.T, -1)
        top, at = p.max(-1)
        extra = -(top * q.gather(-1, at[:, None])[:, 0]).mean()
        torch.testing.assert_close(hass - full, extra, rtol=1e-4, atol=1e-5)


def test_an_eagle_1_head_grows_into_an_eagle_3_head_that_starts_the_same(
    tiny, states, vocab, tmp_path
):
    old = fresh("eagle", tiny, vocab, seed=5)
    path = tmp_path / "eagle1.safetensors"
    save_artifact(old, path, {"model": "tiny-random"})
    same, grown = fresh("eagle", tiny, vocab, seed=6), fresh("eagle", tiny, vocab, 6, fuse=(1,))
    warm_start(same, str(path))
    warm_start(grown, str(path))
    embed = tiny.model.model.embed_tokens
    batch = windows(states, every_doc(states), 16)[:2]
    with torch.no_grad():
        before = eagle_trainer.run_head(same, embed, states, batch, 0.0, 2)[0]
        after = eagle_trainer.run_head(grown, embed, states, batch, 0.0, 2)[0]
    torch.testing.assert_close(after, before, **KERNEL_TOL)
    with pytest.raises(SystemExit, match="fuse"):  # a fused head for other layers
        other = tmp_path / "other.safetensors"
        save_artifact(fresh("eagle", tiny, vocab, fuse=(2,)), other, {"model": "tiny-random"})
        warm_start(fresh("eagle", tiny, vocab, fuse=(1,)), str(other))


def test_a_warm_start_loads_every_weight_but_the_rebuilt_vocabulary(tiny, vocab, tmp_path):
    trained = KangarooAdapter.from_target(tiny, ELL, vocab)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / "adapter.safetensors"
    save_artifact(trained, path, {"model": "tiny-random"})

    fresh = KangarooAdapter.from_target(tiny, ELL, vocab[:-1])  # this corpus's vocabulary
    warm_start(fresh, str(path))
    saved = init_weights(str(path))  # as stored (the artifact's dtype)
    for name, p in fresh.named_parameters():
        assert torch.equal(p, saved[name].to(p.dtype)), name
    start = KangarooAdapter.from_target(tiny, ELL, vocab).self_attn.q_proj.weight
    assert not torch.equal(fresh.self_attn.q_proj.weight, start)  # the weights moved
    assert len(fresh.vocab) == len(vocab) - 1  # rebuilt, not loaded

    with pytest.raises(SystemExit, match="exit_layer"):  # trained for another ℓ
        warm_start(KangarooAdapter.from_target(tiny, ELL - 1, vocab), str(path))
    with pytest.raises(SystemExit, match="not this artifact's shape"):  # another artifact
        warm_start(MedusaHeads(tiny.model.config, 2, vocab), str(path))


def test_a_warm_started_exit_adapter_keeps_this_corpus_token_counts(tiny, vocab, tmp_path):
    """HASH EE's token counts, like the draft vocabulary, come from the run's own corpus: a warm
    start from adapters trained on another corpus loads their weights and keeps them."""
    from decoders.trained.exits import ExitAdapters

    config = tiny.model.config
    counts = torch.arange(config.vocab_size)
    trained = ExitAdapters(config, [1], 4, vocab, token_counts=counts)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / "exits.safetensors"
    save_artifact(trained, path, {"model": "tiny-random"})

    fresh = ExitAdapters(config, [1], 4, vocab, token_counts=counts.flip(0))
    warm_start(fresh, str(path))
    assert torch.equal(fresh.up[0].weight, trained.up[0].weight.half().float())
    assert torch.equal(fresh.token_counts, counts.flip(0))  # this corpus's, not the artifact's
    with pytest.raises(SystemExit, match=r"its layers is \[1\], this run's \[2\]"):
        warm_start(ExitAdapters(config, [2], 4, vocab), str(path))


@pytest.mark.parametrize("kind", KINDS)
def test_positions_the_probe_does_not_score_are_not_scored(kind, tiny, states, vocab):
    """Every trainer's valid mask follows `scored`: only the scored positions' predictions count
    (EAGLE's entry j predicts the feature at j + 1; a Medusa head at t needs t and t + k)."""
    span = states.span(0)
    module = fresh(kind, tiny, vocab)
    w = tiny.model.lm_head.weight[module.vocab].detach()
    cut = dataclasses.replace(states, scored=torch.zeros(len(states.tokens), dtype=torch.bool))
    cut.scored[span[0] + 10 : span[1]] = True
    if kind == "eagle":
        embed = tiny.model.model.embed_tokens
        *_, valid = eagle_trainer.run_head(module, embed, cut, [span], 0.0)
        expect = cut.scored[span[0] + 1 : span[1]]
        assert valid[0, 0].tolist() == expect.tolist()
    elif kind == "kangaroo":
        *_, valid = kangaroo_trainer.run_adapter(module, cut, ELL, [span])
        assert valid[0].tolist() == cut.scored[span[0] : span[1]].tolist()
    else:
        out = medusa_trainer.losses(
            w, *medusa_trainer.run_heads(module, cut, [span]), per_head=True
        )
        n = span[1] - span[0] - 10  # scored positions
        assert [int(out[f"n_head{k}"]) for k in (1, 2, 3)] == [n - 1, n - 2, n - 3]
