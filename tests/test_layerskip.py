"""LayerSkip (decoders/methods/layerskip.py, decoders/trained/exit_tuned.py, decoders/train/layerskip.py): the
exit-tuned model as a model of its own (the delta merged exactly, named ids, a missing delta named),
self-speculation lossless against that model's greedy output with the budget and EOS edges, the
shallow layers run once per token, and the trainer's layer dropout and card.

The loop itself (drafting, runners-up, verification, both caches) is Kangaroo's and is tested at
length in test_kangaroo.py; here, what LayerSkip adds: the shared exit head (the model's own final
norm and LM head, on its draft vocabulary or whole) and the tuned model."""

from __future__ import annotations

import dataclasses
import itertools
from functools import partial

import pytest
import torch
from test_kangaroo import check_steps, transparent_target

from conftest import PROMPTS, assert_greedy, close, greedy, matches_greedy, one_thread
from decoders import METHODS, InvalidParameter, ModelLoadError, generate, load_model
from decoders.core import models
from decoders.core.events import Commit, Draft, DraftStop, Forward, Verify
from decoders.methods import layerskip
from decoders.trained import exit_tuned

TUNED = "tiny-random-exit-tuned"


@pytest.fixture(autouse=True)
def one_torch_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def tuned():
    return load_model(TUNED)


same_as_greedy = partial(matches_greedy, method="layerskip", chat=False)


# --- the tuned model ---------------------------------------------------------------------------


def test_the_tuned_model_is_its_base_plus_the_merged_delta(tuned):
    """Each linear is W + (α/r)·B·A from the shipped delta, each norm the delta's; the shared exit
    head (embeddings, final norm, LM head) stays the base's. A different model from its base."""
    base = load_model("tiny-random")
    state = exit_tuned.load_delta("tiny-random")
    scale = float(state["alpha"]) / int(state["rank"])
    layer, tuned_layer = base.model.model.layers[1], tuned.model.model.layers[1]
    for name in exit_tuned.LINEARS:
        a = state[f"layers.1.{name}.A"].float()
        b = state[f"layers.1.{name}.B"].float()
        want = layer.get_submodule(name).weight + scale * (b @ a)
        assert torch.equal(tuned_layer.get_submodule(name).weight, want), name
    for name in exit_tuned.NORMS:
        assert torch.equal(
            tuned_layer.get_submodule(name).weight, state[f"layers.1.{name}.weight"].float()
        )
    assert torch.equal(tuned.model.lm_head.weight, base.model.lm_head.weight)
    assert torch.equal(tuned.model.model.norm.weight, base.model.model.norm.weight)
    ids = tuned.encode(PROMPTS[0], chat=False)
    assert greedy(tuned, ids, 12).token_ids != greedy(base, ids, 12).token_ids


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("tiny-random-exit-tuned", TUNED),
        ("TINY-RANDOM-Exit-Tuned", TUNED),
        ("embedded-exit-tuned", models.TUNED_ID),
        ("smollm2-135m-instruct-exit-tuned", models.TUNED_ID),
        ("someone/else-exit-tuned", "someone/else-exit-tuned"),  # not a built-in base: a hub id
    ],
)
def test_tuned_ids_are_spelled_one_way(given, canonical):
    assert models.canonical_id(given) == canonical


def test_a_missing_or_misfitting_delta_is_refused_by_name(monkeypatch, tmp_path):
    monkeypatch.setattr(exit_tuned, "delta_path", lambda base: tmp_path / "none.safetensors")
    with pytest.raises(ModelLoadError, match=r"none\.safetensors.*decoders\.train layerskip"):
        models._load(TUNED, torch.device("cpu"), torch.float32)
    from safetensors.torch import save_file

    save_file({"rank": torch.tensor(4), "alpha": torch.tensor(8.0)}, str(tmp_path / "x.st"))
    monkeypatch.setattr(exit_tuned, "delta_path", lambda base: tmp_path / "x.st")
    with pytest.raises(ModelLoadError, match="does not fit tiny-random"):
        models._load(TUNED, torch.device("cpu"), torch.float32)


def test_dropout_rises_exponentially_to_p_max():
    rates = exit_tuned.dropout_rates(30, 0.2)
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.2)
    assert all(a < b for a, b in itertools.pairwise(rates))
    assert rates[15] == pytest.approx(0.2 * (2 ** (15 / 29) - 1))


# --- self-speculation, lossless ---------------------------------------------------------------

GRID = [
    dict(exit_layer=str(e), eta=eta, gamma=g, siblings=s, vocab=v)
    for e, eta, g, s, v in [
        (1, 0.0, 1, 0, "draft"),
        (1, 0.4, 8, 1, "draft"),
        (2, 0.0, 3, 0, "full"),
        (2, 0.4, 3, 2, "full"),
        (3, 1.0, 4, 1, "draft"),
        (3, 0.0, 16, 0, "draft"),
    ]
]


@pytest.mark.parametrize("params", GRID, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("budget", [5, 24])
def test_lossless_on_the_tuned_tiny_model(tuned, params, budget):
    for prompt in (PROMPTS[0], PROMPTS[1]):
        res = same_as_greedy(tuned, prompt, budget, **params)
        check_steps(
            res, int(params["exit_layer"]), params["eta"], params["gamma"], budget, **_shared()
        )


def _shared() -> dict:
    """check_steps' expectations where LayerSkip differs from Kangaroo: no adapter pass over the
    prompt at step 0, and the drafts' source."""
    return {"prefill_head": False, "source": "layerskip"}


def test_on_a_transparent_model_every_draft_is_accepted_and_each_layer_runs_once_per_token():
    """A model whose layers after E add nothing: the shared head on the layer-E state is the
    model's own output, so every draft is the greedy token. Each decoder layer then sees every
    output token exactly once (drafting ran 1..E, verification E+1..L on the drafts' states)."""
    exit_layer = 2
    bundle, counts = transparent_target(exit_layer, count=True)
    ids = bundle.encode(PROMPTS[5], chat=False)
    ref = greedy(bundle, ids, 30)
    counts.clear()
    kw = dict(exit_layer=str(exit_layer), eta=0.0, gamma=4, siblings=0)  # runners-up: more inputs
    res = generate(bundle, ids, "layerskip", 30, **kw)
    assert res.token_ids == ref.token_ids
    assert res.stats["tokens_per_target_forward"] > 3
    verifies = [e for e in res.events if isinstance(e, Verify)]
    assert all(len(v.accepted) == 4 for v in verifies[:-1])
    out = len(res.token_ids)
    for i in range(bundle.n_layers):  # prompt + each committed token (the last one is never fed)
        assert len(ids) + out - 1 <= counts[i] <= len(ids) + out + 4, (i, counts[i])
    assert counts[0] == counts[bundle.n_layers - 1]


def test_eos_inside_a_draft_ends_the_output_there():
    exit_layer = 2
    bundle, _ = transparent_target(exit_layer)
    ids = bundle.encode(PROMPTS[4], chat=False)
    free = greedy(bundle, ids, 30).token_ids
    # a token first seen past the first draft: the output must end exactly there
    at = next(i for i in range(5, len(free)) if free[i] not in free[:i])
    stopping = dataclasses.replace(bundle, eos_ids=frozenset({free[at]}))
    res = same_as_greedy(stopping, ids, 30, exit_layer=str(exit_layer), eta=0.0, gamma=6)
    assert res.finish_reason == "eos" and res.token_ids == free[: at + 1]
    eos = free[at]
    stops = [e for e in res.events if isinstance(e, DraftStop)]
    assert any(s.reason == "eos" for s in stops)
    last = [e for e in res.events if isinstance(e, Commit)][-1]
    assert last.tokens[-1] == eos and last.origins[-1] == "draft"


def test_the_budget_cuts_the_draft():
    bundle, _ = transparent_target(2)
    ids = bundle.encode(PROMPTS[2], chat=False)
    res = same_as_greedy(bundle, ids, 7, exit_layer="2", eta=0.0, gamma=16, siblings=0)
    drafts = [e for e in res.events if isinstance(e, Draft)]
    assert [len(d.tokens) for d in drafts] == [5]  # 7 - 1 (the first) - 1 (the target's own)
    assert next(e for e in res.events if isinstance(e, DraftStop)).reason == "budget"


def test_the_draft_head_scores_the_draft_vocabulary_of_the_tuned_model(tuned):
    vocab = exit_tuned.load_delta("tiny-random")["vocab"]
    res = same_as_greedy(tuned, PROMPTS[3], 24, exit_layer="2", eta=0.0, gamma=4, siblings=2)
    drafted = {t for e in res.events if isinstance(e, Draft) for t in e.tokens}
    assert drafted and drafted <= set(vocab.tolist())
    draft_forward = next(e for e in res.events if isinstance(e, Forward) and e.kind == "draft")
    assert draft_forward.layers == 2 + 1  # E layers and the exit head


def test_sampling_is_seeded_and_never_claims_greedy(tuned):
    kw = dict(temperature=0.9, seed=3, exit_layer="1", eta=0.0, gamma=3)
    a = generate(tuned, PROMPTS[1], "layerskip", 20, chat=False, **kw)
    b = generate(tuned, PROMPTS[1], "layerskip", 20, chat=False, **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20


@pytest.mark.parametrize("bad", ["0", "4", "nine", "-1"])
def test_a_bad_exit_layer_is_refused_by_name(tuned, bad):
    with pytest.raises(InvalidParameter, match="exit_layer"):
        generate(tuned, "x", "layerskip", 4, exit_layer=bad)


def test_auto_reads_the_chosen_layer_from_the_card_else_a_quarter(tuned, monkeypatch):
    assert layerskip.resolve_exit_layer(load_model("tiny-random"), "auto") == 1  # 4 layers / 4
    monkeypatch.setattr(layerskip, "read_card", lambda path: {"exit_layer": 3})
    assert layerskip.resolve_exit_layer(tuned, "auto") == 3


# --- the trainer --------------------------------------------------------------------------------


def test_a_skipped_layer_passes_its_input_on_and_the_others_run():
    """Per-token layer dropout: where a token skips a layer (p = 1) its state goes on unchanged;
    at p = 0 the layer runs as in the model's own forward."""
    from decoders.train.layerskip import forward_states

    model = load_model("tiny-random").model
    plain = type(model)(model.config)
    plain.load_state_dict(model.state_dict())
    ids = torch.tensor([[5, 6, 7, 8]])
    final, kept = forward_states(plain, ids, {1, 2}, [0.0, 1.0, 0.0, 0.0])
    assert torch.equal(kept[2], kept[1])  # layer 2 skipped by every token
    ref = plain.model(input_ids=ids).last_hidden_state
    final0, _ = forward_states(plain, ids, set(), None)
    assert close(final0, ref)  # our layer loop against the model's own forward
    assert not torch.allclose(final, ref, atol=1e-3)


# --- the exit-tuned embedded model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned_embedded(embedded):
    """The tuned delta on the embedded model, priced by the embedded model's table (the same
    shapes cost the same; measuring a table of its own took a fresh machine about 90 s)."""
    from dataclasses import replace

    from decoders.core import costs

    tuned = load_model(models.TUNED_ID)
    costs.set_table(tuned, replace(costs.price_table(embedded), model=tuned.model_id))
    return tuned


@pytest.mark.slow
def test_the_exit_tuned_embedded_model_is_lossless_against_its_own_greedy(tuned_embedded):
    """The shipped delta on the embedded model: LayerSkip at its defaults (the card's exit
    layer) on a chat prompt and at the paper's settings on a code prompt gives the tuned model's
    greedy tokens, never the original's."""
    assert layerskip.resolve_exit_layer(tuned_embedded, "auto") == int(
        layerskip.read_card(exit_tuned.delta_path(models.EMBEDDED_ID))["exit_layer"]
    )
    for prompt, chat, params in (  # the defaults on chat, the paper's settings on code
        ("Give me three tips for writing clear emails.", True, {}),
        (PROMPTS[5], False, METHODS["layerskip"].preset("paper")),
    ):
        ids = tuned_embedded.encode(prompt, chat=chat)
        expected = greedy(tuned_embedded, ids, 40).token_ids
        res = generate(tuned_embedded, ids, "layerskip", 40, **params)
        assert_greedy(tuned_embedded, res, expected)
        assert res.stats["verify_steps"] > 0
