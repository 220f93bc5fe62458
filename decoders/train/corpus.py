"""The training corpus every trained drafter shares: what the target itself writes, on chat and on
code, offline, and none of it benchmark data.

Chat (self-distillation, Magpie-style, Xu et al. 2024):
- user turns: the chat template up to the start of a user turn, then the model samples the user's
  message itself; kept when it ends on its own, deduplicated;
- task turns: instructions of the kinds people give a chat model about a text (summarise,
  translate, extract, rewrite, answer from a passage), wrapped around passages the model wrote
  itself in the first round, so the drafters also see long prompts that the answer copies from;
- every turn answered greedily by the target: the drafters learn what *this* model writes.
Code: documented functions from the standard library (and optionally installed packages) cut
after their docstring and continued greedily by the target, plus raw source chunks.

Everything is decontaminated against Spec-Bench's questions and HumanEval's prompts: a document
that shares any word 8-gram with them is dropped, and the card reports how many were.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from decoders.core.models import ModelBundle, cache_dir

# The corpus's parts, each a module of its own; their names stay importable from here.
from decoders.train.code_sources import (  # noqa: F401
    SKIP_DIRS,
    _file_prompts,
    _python_files,
    code_chunks,
    function_prompts,
    source_files,
)
from decoders.train.decontamination import (  # noqa: F401
    BENCHMARKS_ENV,
    NGRAM,
    _words,
    benchmark_files,
    benchmark_ngrams,
    benchmark_sources,
    benchmark_texts,
    benchmarks_against,
    contaminated,
    ngrams,
)
from decoders.train.generation import (  # noqa: F401
    _greedy,
    answer,
    chat_prefix,
    complete,
    magpie_turns,
    pre_query,
)

TASKS = (  # (kind, template); {text} is a passage the model wrote itself
    ("summarize", "Summarize the following text in two or three sentences.\n\n{text}"),
    ("summarize", "Write a one-paragraph summary of this:\n\n{text}"),
    ("translate", "Translate the following text into French:\n\n{text}"),
    ("translate", "Translate this into Spanish:\n\n{text}"),
    ("translate", "Translate the following text into German:\n\n{text}"),
    ("extract", "List the main points of the text below as a bulleted list.\n\n{text}"),
    ("extract", "Extract the key facts from this text as JSON.\n\n{text}"),
    ("rewrite", "Rewrite the following text so that it is shorter and clearer:\n\n{text}"),
    ("rewrite", "Make this text more formal:\n\n{text}"),
    ("qa", "Read the passage and answer: what is its main idea?\n\nPassage:\n{text}"),
    ("title", "Suggest a title for this text and explain your choice.\n\n{text}"),
)


@dataclass
class Corpus:
    """Documents as token ids (chat documents include the chat template), each with its source:
    "chat", "task" or "code"."""

    docs: list[list[int]]
    sources: list[str]
    report: dict = field(default_factory=dict)

    def split(self, held_out: float, seed: int) -> tuple[list[int], list[int]]:
        """Document indices (train, held-out), the held-out share taken within each source so
        agreement can be reported per source."""
        rng = random.Random(seed)
        train, held = [], []
        for source in sorted(set(self.sources)):
            ids = [i for i, s in enumerate(self.sources) if s == source]
            rng.shuffle(ids)
            k = max(1, round(len(ids) * held_out)) if len(ids) > 1 else 0
            held += ids[:k]
            train += ids[k:]
        return sorted(train), sorted(held)

    def share(self, fraction: float, seed: int) -> Corpus:
        """A seeded `fraction` of the documents of each source, in the corpus's order (the
        report counts what was kept): a smaller CPU run on the same corpus."""
        if fraction >= 1:
            return self
        rng = random.Random(seed)
        keep: list[int] = []
        for source in sorted(set(self.sources)):
            ids = [i for i, s in enumerate(self.sources) if s == source]
            keep += rng.sample(ids, max(1, round(len(ids) * fraction)))
        keep.sort()
        docs = [self.docs[i] for i in keep]
        sources = [self.sources[i] for i in keep]
        kept = {s: sources.count(s) for s in sorted(set(sources))}
        return Corpus(docs, sources, {**self.report, "share": fraction, "kept_documents": kept})


def add_corpus_arguments(ap: argparse.ArgumentParser) -> None:
    """The corpus options every `python -m decoders.train NAME` shares (same defaults, one cache)."""
    g = ap.add_argument_group("corpus")
    g.add_argument("--chat", type=int, default=640, help="self-generated user turns (Magpie)")
    g.add_argument("--tasks", type=int, default=192, help="task turns over self-written passages")
    g.add_argument("--answer-tokens", type=int, default=160, help="max tokens per chat answer")
    g.add_argument("--code", type=int, default=256, help="function prompts continued by the target")
    g.add_argument("--code-tokens", type=int, default=128)
    g.add_argument("--chunks", type=int, default=128, help="raw source chunks")
    g.add_argument("--chunk-chars", type=int, default=1500)
    g.add_argument("--sources", default="stdlib", help="code: stdlib and/or installed packages")
    g.add_argument("--gen-batch", type=int, default=64, help="generation batch")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--probe-tokens",
        type=int,
        default=128,
        help="the probe: tokens of the target's answer to each tuning prompt on which every "
        "drafter is also scored, outside the corpus (0: no probe)",
    )
    g.add_argument(
        "--deadline",
        type=float,
        default=0,
        help="seconds from the command's start: stop generating by then and keep what is done, "
        "each part by its share of the work (a device call must end in time; the report counts "
        "what was cut, the longest prompts first); 0 = none",
    )
    g.add_argument(
        "--require-benchmarks",
        action="store_true",
        help="refuse to build unless both Spec-Bench's questions and HumanEval's prompts are here "
        f"to decontaminate against (${BENCHMARKS_ENV}: a folder with both)",
    )
    g.add_argument("--no-cache", action="store_true", help="rebuild the corpus, do not cache it")
    g.add_argument(
        "--corpus-share",
        type=float,
        default=1.0,
        help="train on this seeded share of each source's documents (a CPU run's budget: the "
        "target's states over the whole corpus cost as much as its generation)",
    )
    g.add_argument(
        "--corpus-from",
        default=None,
        metavar="DATASTORE",
        help="take the corpus a datastore file ships (assets/sam/<model>.safetensors, built from "
        "the corpus its card names) instead of generating one: a CPU session trains on it at once; "
        "the other corpus options must be the card's",
    )


KEY_OPTIONS = (  # the options that name a corpus (with the model)
    "chat",
    "tasks",
    "answer_tokens",
    "code",
    "code_tokens",
    "chunks",
    "chunk_chars",
    "sources",
    "seed",
)


def corpus_key(bundle: ModelBundle, args: argparse.Namespace) -> str:
    parts = [bundle.model_id, *(getattr(args, k) for k in KEY_OPTIONS)]
    if getattr(args, "corpus_share", 1.0) < 1:  # (whole corpora keep the keys they had)
        parts.append(f"share{args.corpus_share}")
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", "-".join(map(str, parts)))


def load_or_build(
    bundle: ModelBundle, args: argparse.Namespace, started: float | None = None
) -> Corpus:
    """The corpus for these options, from the cache (~/.cache/decoding-lab/corpus) when built
    before: the drafters of one model share it (`--corpus-share`: a seeded share of it)."""
    whole = _load_or_build(bundle, args, started)
    return whole.share(getattr(args, "corpus_share", 1.0), args.seed)


def _load_or_build(bundle: ModelBundle, args: argparse.Namespace, started: float | None) -> Corpus:
    if getattr(args, "corpus_from", None):
        return from_datastore(Path(args.corpus_from), args, bundle.model_id)
    whole = argparse.Namespace(**{**vars(args), "corpus_share": 1.0})
    path = cache_dir() / "corpus" / f"{corpus_key(bundle, whole)}.pt"
    if path.is_file() and not args.no_cache:
        saved = torch.load(path)
        checked = saved["report"].get("decontamination", {}).get("benchmark_texts", {})
        if getattr(args, "require_benchmarks", False) and not (
            checked.get("spec_bench") and checked.get("humaneval")
        ):
            raise SystemExit(
                f"error: the cached corpus {path.name} was not decontaminated against both "
                "benchmarks; delete it to rebuild, or drop --require-benchmarks"
            )
        return Corpus(saved["docs"], saved["sources"], saved["report"])
    corpus = build(bundle, args, started)
    if not args.no_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"docs": corpus.docs, "sources": corpus.sources, "report": corpus.report}, path)
    return corpus


def command_of(argv: list[str]) -> str:
    """The command a card records: where the file went (`--out`) is not how it was made."""
    given = list(argv)
    if "--out" in given:
        i = given.index("--out")
        del given[i : i + 2]
    return "python -m decoders.train " + " ".join(given)


def from_datastore(path: Path, args: argparse.Namespace, model_id: str) -> Corpus:
    """The corpus a datastore file holds (`python -m decoders.train datastore` keeps every
    document, in the corpus's order: chat, then task, then code). Its card's command names the
    corpus it was built from: the options asked for must name the same one, and each source's
    token count must match the card's, or the documents are not the ones the card describes."""
    from decoders.trained.datastore import read_docs

    card_path = path.with_suffix(".json")
    if not path.is_file() or not card_path.is_file():
        raise SystemExit(f"error: --corpus-from {path}: no datastore file with its card there")
    card = json.loads(card_path.read_text())
    if card.get("model") != model_id:
        raise SystemExit(
            f"error: --corpus-from {path}: its text is {card.get('model')}'s tokens, not {model_id}'s"
        )
    ap = argparse.ArgumentParser()
    add_corpus_arguments(ap)
    ap.add_argument("--keep", default="chat,task,code")
    built, _ = ap.parse_known_args(shlex.split(card["command"])[3:])
    if set(built.keep.split(",")) != {"chat", "task", "code"}:
        raise SystemExit(
            f"error: --corpus-from {path}: it keeps only {built.keep} of its corpus, not all of it"
        )
    differ = [k for k in KEY_OPTIONS if getattr(built, k) != getattr(args, k)]
    if differ:
        raise SystemExit(
            f"error: --corpus-from {path}: it holds another corpus ({', '.join(differ)} differ); "
            f"give the corpus options of its card's command: {card['command']}"
        )
    docs = read_docs(path)
    counts = card["documents"]
    sources = [s for s in ("chat", "task", "code") for _ in range(counts.get(s, 0))]
    if len(sources) != len(docs):
        raise SystemExit(f"error: {path}: {len(docs)} documents, its card counts {len(sources)}")
    for source, tokens in card["tokens"].items():
        held = sum(len(d) for d, s in zip(docs, sources, strict=True) if s == source)
        if held != tokens:
            raise SystemExit(f"error: {path}: {held} {source} tokens, its card says {tokens}")
    report = {
        **card.get("corpus_report", {}),
        "documents": counts,
        "tokens": card["tokens"],
        "decontamination": card.get("decontamination", {}),
        "from": f"{path.name}: the datastore's copy of this corpus, not generated again",
    }
    return Corpus(docs, sources, report)


class Clock:
    """--deadline: each part of a build (user turns, answers, tasks, code) gets, when it starts,
    the time left times its share of the work left, so a part that finishes early hands its time
    on. A part's work is its count times its tokens, user turns weighted 2 (sampled, and tried
    again when a turn is not kept): the parts' times on a lent H100 (59, 58, 21 and ~80 s for
    2560 turns, 2560 answers, 768 tasks, 4096 functions) and an H200 (chat 72%, tasks 16%, code
    12% of 3200 / 960 / 1024) both fit it. `start`: when the command began (the model's loading
    counts against the deadline too)."""

    def __init__(self, args: argparse.Namespace, start: float) -> None:
        self.end = start + args.deadline
        self.work = {
            "user turns": 2 * args.chat * 80,
            "answers": args.chat * args.answer_tokens,
            "tasks": args.tasks * args.answer_tokens if args.chat else 0,
            "code": args.code * args.code_tokens,
        }

    def until(self, part: str) -> float:
        """When `part`, starting now, must stop generating."""
        parts = list(self.work)
        left = sum(self.work[p] for p in parts[parts.index(part) :])
        if self.end == math.inf or not left:
            return self.end
        now = time.perf_counter()
        return now + max(0.0, self.end - now) * self.work[part] / left


def build(bundle: ModelBundle, args: argparse.Namespace, started: float | None = None) -> Corpus:
    """Generate the corpus these options name (seeded): the chat part (Magpie user turns and the
    target's answers), the task turns around passages it wrote, then the code; decontaminated
    part by part, stopped in time under --deadline, with the report its card keeps."""
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    deadline = getattr(args, "deadline", 0) or 0
    if deadline < 0:
        raise SystemExit(f"error: --deadline must be 0 (none) or positive, got {deadline}")
    clock = Clock(args, started if started is not None else t0) if deadline else None

    def until(part: str) -> float:
        return clock.until(part) if clock is not None else math.inf

    against = benchmarks_against(getattr(args, "require_benchmarks", False))
    parts = Parts(benchmark_ngrams())
    chat_turns = chat_part(bundle, args, rng, parts, until) if args.chat else []
    if args.tasks and parts.docs:
        task_part(bundle, args, rng, parts, chat_turns, until)
    if args.code or args.chunks:
        code_part(bundle, args, rng, parts, until)
    # What --deadline left ungenerated (user turns never sampled, answers never written):
    # prompts run shortest first, so a cut drops the longest ones.
    cut = {"cut_by_deadline": parts.cut, "deadline_s": deadline} if clock else {}
    report = build_report(bundle, parts, against, t0, cut)
    print(f"corpus: {json.dumps(report)}", file=sys.stderr)
    return Corpus(parts.docs, parts.sources, report)


@dataclass
class Parts:
    """What a build has made so far: the documents and their sources; per part, what the
    decontamination removed, what --deadline cut, and the seconds it took."""

    banned: set[tuple[str, ...]]  # the benchmarks' word n-grams
    docs: list[list[int]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    removed: dict[str, int] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)

    def clean(self, kind: str, texts: list[str]) -> list[str]:
        """`texts` less the contaminated ones, counted as removed from `kind`."""
        kept = [t for t in texts if not contaminated(t, self.banned)]
        self.removed[kind] = self.removed.get(kind, 0) + len(texts) - len(kept)
        return kept

    def add(self, source: str, docs: list[list[int]]) -> None:
        self.docs += docs
        self.sources += [source] * len(docs)


def chat_part(
    bundle: ModelBundle,
    args: argparse.Namespace,
    rng: random.Random,
    parts: Parts,
    until: Callable[[str], float],
) -> list[str]:
    """`--chat` user turns the model writes itself, answered greedily: the chat documents.
    Returns the turns kept, in their documents' order (the task part reads their answers)."""
    t = time.perf_counter()
    stop = until("user turns")
    turns = magpie_turns(bundle, args.chat, args.gen_batch, rng, until=stop)
    if stop != math.inf:
        parts.cut["user turns"] = args.chat - len(turns)  # (a few may be tries that failed)
    chat_turns = parts.clean("chat", turns)
    answers = answer(
        bundle, chat_turns, args.answer_tokens, args.gen_batch, "answering", until("answers")
    )
    parts.cut["answers"] = answers.count(None)
    done = [i for i, a in enumerate(answers) if a is not None]
    keep = [i for i in done if not contaminated(bundle.decode(answers[i]), parts.banned)]
    parts.removed["chat_answers"] = len(done) - len(keep)
    parts.add("chat", [answers[i] for i in keep])
    parts.timings["chat_s"] = round(time.perf_counter() - t)
    return [chat_turns[i] for i in keep]


def task_part(
    bundle: ModelBundle,
    args: argparse.Namespace,
    rng: random.Random,
    parts: Parts,
    chat_turns: list[str],
    until: Callable[[str], float],
) -> None:
    """`--tasks` task turns (TASKS) around passages of the chat answers, answered greedily."""
    t = time.perf_counter()
    passages = [
        p
        for p in (
            bundle.decode(d[len(chat_prefix(bundle, turn)) :])
            for d, turn in zip(parts.docs, chat_turns, strict=True)
        )
        if 300 <= len(p) <= 1500
    ]
    rng.shuffle(passages)
    turns = [
        rng.choice(TASKS)[1].format(text=p.strip().removesuffix("<|im_end|>").strip())
        for p in passages[: args.tasks]
    ]
    turns = parts.clean("task", turns)
    answers = answer(
        bundle, turns, args.answer_tokens, args.gen_batch, "task answers", until("tasks")
    )
    parts.cut["tasks"] = answers.count(None)
    answers = [a for a in answers if a and not contaminated(bundle.decode(a), parts.banned)]
    parts.add("task", answers)
    parts.timings["task_s"] = round(time.perf_counter() - t)


def code_part(
    bundle: ModelBundle,
    args: argparse.Namespace,
    rng: random.Random,
    parts: Parts,
    until: Callable[[str], float],
) -> None:
    """`--code` documented functions of `--sources` continued greedily by the target (shortest
    first), then `--chunks` raw source chunks."""
    t = time.perf_counter()
    files, labels = source_files(args.sources.split(","))
    prompts = function_prompts(files)
    rng.shuffle(prompts)
    prompts = parts.clean("code", sorted(prompts[: args.code], key=len))
    done = complete(bundle, prompts, args.code_tokens, args.gen_batch, until("code"))
    parts.cut["code"] = done.count(None)
    code = [c for c in done if c is not None]
    chunks = parts.clean("code_chunks", code_chunks(files, args.chunks, args.chunk_chars, rng))
    code += [bundle.encode(c, chat=False)[:512] for c in chunks]
    parts.add("code", code)
    parts.timings["code_s"] = round(time.perf_counter() - t)
    parts.timings["code_sources"] = labels


def build_report(
    bundle: ModelBundle, parts: Parts, against: dict[str, int], t0: float, cut: dict[str, Any]
) -> dict[str, Any]:
    """The corpus's report: documents and tokens per source, the decontamination (the rule, the
    texts checked, what it removed), the build's minutes since `t0`, `cut` (what --deadline left
    out, when there was one) and each part's seconds."""
    docs, sources = parts.docs, parts.sources
    return {
        "documents": {s: sources.count(s) for s in sorted(set(sources))},
        "tokens": {
            s: sum(len(d) for d, src in zip(docs, sources, strict=True) if src == s)
            for s in sorted(set(sources))
        },
        "decontamination": {
            "rule": f"drop a document sharing any word {NGRAM}-gram with a Spec-Bench question "
            "or a HumanEval prompt",
            "benchmark_ngrams": len(parts.banned),
            "benchmark_texts": against,  # Spec-Bench turns, HumanEval prompts: 0 = not checked
            "removed": parts.removed,
        },
        "build_minutes": round((time.perf_counter() - t0) / 60, 1),
        **cut,
        **parts.timings,
        "device": str(bundle.device),
    }


# --- `python -m decoders.train corpus` -----------------------------------------------------------


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="embedded", help="the frozen target (default: embedded)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda when there is one)")


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """Build (or find in the cache) the corpus and report it."""
    from decoders.core.models import load_model

    started = time.perf_counter()  # --deadline counts the model's loading too
    # float32: the drafters learn the features the CPU default (float32) will feed them.
    bundle = load_model(args.model, device=args.device, dtype="float32")
    return load_or_build(bundle, args, started).report


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_model_arguments(ap)
    add_corpus_arguments(ap)
