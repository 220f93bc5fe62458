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
import ast
import gzip
import importlib.metadata
import importlib.util
import json
import math
import multiprocessing
import os
import random
import re
import shlex
import sys
import sysconfig
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from decoders.core.models import ModelBundle, cache_dir

NGRAM = 8  # decontamination: word n-grams shared with a benchmark prompt

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
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", "-".join(map(str, parts)))


def load_or_build(
    bundle: ModelBundle, args: argparse.Namespace, started: float | None = None
) -> Corpus:
    """The corpus for these options, from the cache (~/.cache/decoding-lab/corpus) when built
    before: the drafters of one model share it."""
    if getattr(args, "corpus_from", None):
        return from_datastore(Path(args.corpus_from), args, bundle.model_id)
    path = cache_dir() / "corpus" / f"{corpus_key(bundle, args)}.pt"
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
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    deadline = getattr(args, "deadline", 0) or 0
    if deadline < 0:
        raise SystemExit(f"error: --deadline must be 0 (none) or positive, got {deadline}")
    clock = Clock(args, started if started is not None else t0) if deadline else None

    def until(part: str) -> float:
        return clock.until(part) if clock is not None else math.inf

    cut: dict[str, int] = {}
    against = {name: len(texts) for name, texts in benchmark_sources().items()}
    missing = [name for name, n in against.items() if not n]
    if missing:
        # A corpus built without them is not decontaminated against them: never silently (a
        # lent GPU's first corpus had neither, and reported "none removed").
        message = (
            f"no {' and no '.join(missing)} prompts on this machine to decontaminate against "
            f"(set {BENCHMARKS_ENV} to a folder with question.jsonl and HumanEval.jsonl.gz)"
        )
        if getattr(args, "require_benchmarks", False):
            raise SystemExit(f"error: {message}")
        print(f"warning: {message}", file=sys.stderr)
    banned = benchmark_ngrams()
    removed: dict[str, int] = {}

    def clean(kind: str, texts: list[str]) -> list[str]:
        kept = [t for t in texts if not contaminated(t, banned)]
        removed[kind] = removed.get(kind, 0) + len(texts) - len(kept)
        return kept

    docs: list[list[int]] = []
    sources: list[str] = []
    timings: dict[str, float] = {}
    chat_turns: list[str] = []
    if args.chat:
        t = time.perf_counter()
        stop = until("user turns")
        turns = magpie_turns(bundle, args.chat, args.gen_batch, rng, until=stop)
        if stop != math.inf:
            cut["user turns"] = args.chat - len(turns)  # (a few may be tries that failed)
        chat_turns = clean("chat", turns)
        answers = answer(
            bundle, chat_turns, args.answer_tokens, args.gen_batch, "answering", until("answers")
        )
        cut["answers"] = answers.count(None)
        done = [i for i, a in enumerate(answers) if a is not None]
        keep = [i for i in done if not contaminated(bundle.decode(answers[i]), banned)]
        removed["chat_answers"] = len(done) - len(keep)
        chat_turns = [chat_turns[i] for i in keep]
        docs += [answers[i] for i in keep]
        sources += ["chat"] * len(keep)
        timings["chat_s"] = round(time.perf_counter() - t)
    if args.tasks and docs:
        t = time.perf_counter()
        passages = [
            p
            for p in (
                bundle.decode(d[len(chat_prefix(bundle, turn)) :])
                for d, turn in zip(docs, chat_turns, strict=True)
            )
            if 300 <= len(p) <= 1500
        ]
        rng.shuffle(passages)
        turns = [
            rng.choice(TASKS)[1].format(text=p.strip().removesuffix("<|im_end|>").strip())
            for p in passages[: args.tasks]
        ]
        turns = clean("task", turns)
        answers = answer(
            bundle, turns, args.answer_tokens, args.gen_batch, "task answers", until("tasks")
        )
        cut["tasks"] = answers.count(None)
        answers = [a for a in answers if a and not contaminated(bundle.decode(a), banned)]
        docs += answers
        sources += ["task"] * len(answers)
        timings["task_s"] = round(time.perf_counter() - t)
    if args.code or args.chunks:
        t = time.perf_counter()
        files, labels = source_files(args.sources.split(","))
        prompts = function_prompts(files)
        rng.shuffle(prompts)
        prompts = clean("code", sorted(prompts[: args.code], key=len))
        done = complete(bundle, prompts, args.code_tokens, args.gen_batch, until("code"))
        cut["code"] = done.count(None)
        code = [c for c in done if c is not None]
        chunks = clean("code_chunks", code_chunks(files, args.chunks, args.chunk_chars, rng))
        code += [bundle.encode(c, chat=False)[:512] for c in chunks]
        docs += code
        sources += ["code"] * len(code)
        timings["code_s"] = round(time.perf_counter() - t)
        timings["code_sources"] = labels  # type: ignore[assignment]
    report = {
        "documents": {s: sources.count(s) for s in sorted(set(sources))},
        "tokens": {
            s: sum(len(d) for d, src in zip(docs, sources, strict=True) if src == s)
            for s in sorted(set(sources))
        },
        "decontamination": {
            "rule": f"drop a document sharing any word {NGRAM}-gram with a Spec-Bench question "
            "or a HumanEval prompt",
            "benchmark_ngrams": len(banned),
            "benchmark_texts": against,  # Spec-Bench turns, HumanEval prompts: 0 = not checked
            "removed": removed,
        },
        "build_minutes": round((time.perf_counter() - t0) / 60, 1),
        # What --deadline left ungenerated (user turns never sampled, answers never written):
        # prompts run shortest first, so a cut drops the longest ones.
        **({"cut_by_deadline": cut, "deadline_s": deadline} if clock else {}),
        **timings,
        "device": str(bundle.device),
    }
    print(f"corpus: {json.dumps(report)}", file=sys.stderr)
    return Corpus(docs, sources, report)


# --- chat ---------------------------------------------------------------------------------------


def chat_prefix(bundle: ModelBundle, turn: str) -> list[int]:
    return bundle.encode(turn, chat=True)


def pre_query(bundle: ModelBundle) -> list[int]:
    """The chat template up to where a user's message begins (system turn included)."""
    marker = "\x00USER\x00"
    text = bundle.tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=False
    )
    return bundle.tokenizer(text[: text.index(marker)], add_special_tokens=False).input_ids


@torch.inference_mode()
def magpie_turns(
    bundle: ModelBundle,
    n: int,
    batch: int,
    rng: random.Random,
    max_tokens: int = 80,
    until: float = math.inf,
) -> list[str]:
    """`n` distinct user messages the model writes itself when handed the template up to a user
    turn (temperature 1). A message must end on its own (EOS before `max_tokens`), have 3 to 80
    words, and differ from every kept one in its normalised text and its first six words. Fewer
    when time.perf_counter() passes `until`."""
    prefix = pre_query(bundle)
    x = torch.tensor([prefix] * batch, device=bundle.device)
    kept: list[str] = []
    seen: set[str] = set()
    tries = 0
    with tqdm(total=n, desc="user turns", file=sys.stderr) as bar:
        last = 0.0  # the last batch's seconds: a batch that would not end in time is not begun
        while len(kept) < n and tries < 4 * n and time.perf_counter() + last < until:
            began = time.perf_counter()
            torch.manual_seed(rng.randrange(2**31))
            out = bundle.model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                temperature=1.0,
                top_p=0.995,
                max_new_tokens=max_tokens,
                pad_token_id=min(bundle.eos_ids),
            )
            tries += batch
            last = time.perf_counter() - began
            for row in out[:, len(prefix) :].tolist():
                end = next((i for i, t in enumerate(row) if t in bundle.eos_ids), None)
                if end is None:
                    continue
                text = bundle.decode(row[:end]).strip()
                words = text.split()
                norm = " ".join(re.findall(r"[a-z0-9]+", text.lower()))
                first = " ".join(norm.split()[:6])
                if not 3 <= len(words) <= 80 or "<|" in text or norm in seen or first in seen:
                    continue
                seen |= {norm, first}
                kept.append(text)
                bar.update(1)
                if len(kept) == n:
                    break
    return kept


def answer(
    bundle: ModelBundle,
    turns: list[str],
    max_new_tokens: int,
    batch: int,
    desc: str,
    until: float = math.inf,
) -> list[list[int] | None]:
    """Each turn in the chat template, answered greedily by the target: template + answer ids
    (None: not reached by `until`)."""
    prompts = [chat_prefix(bundle, t) for t in turns]
    return _greedy(bundle, prompts, max_new_tokens, batch, desc, until)


def complete(
    bundle: ModelBundle,
    prompts: list[str],
    max_new_tokens: int,
    batch: int,
    until: float = math.inf,
) -> list[list[int] | None]:
    """Greedy continuations of raw-text prompts (no chat template): prompt + completion ids
    (None: not reached by `until`)."""
    ids = [bundle.encode(p, chat=False) for p in prompts]
    return _greedy(bundle, ids, max_new_tokens, batch, "code completions", until)


@torch.inference_mode()
def _greedy(
    bundle: ModelBundle,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch: int,
    desc: str,
    until: float = math.inf,
) -> list[list[int] | None]:
    """Batched greedy generation, left-padded, prompts of similar length together; results in
    the input order, each cut after its first EOS. Batches that would not end by
    time.perf_counter() `until` (as long as the last one took) are left out (None)."""
    pad = min(bundle.eos_ids)
    out: list[list[int] | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    last = 0.0  # the last batch's seconds: a batch that would not end in time is not begun
    for k in tqdm(range(0, len(order), batch), desc=desc, file=sys.stderr):
        began = time.perf_counter()
        if began + last >= until:
            break
        group = order[k : k + batch]
        width = max(len(prompts[i]) for i in group)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in group])
        mask = torch.tensor(
            [[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in group]
        )
        gen = bundle.model.generate(
            input_ids=ids.to(bundle.device),
            attention_mask=mask.to(bundle.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        for i, row in zip(group, gen[:, width:].tolist(), strict=True):
            stop = next((j + 1 for j, t in enumerate(row) if t in bundle.eos_ids), len(row))
            out[i] = prompts[i] + row[:stop]
        last = time.perf_counter() - began
    return out


# --- code ---------------------------------------------------------------------------------------


SKIP_DIRS = {"test", "tests", "testing", "idlelib", "site-packages", "lib2to3", "turtledemo"}


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts))


def source_files(sources: list[str]) -> tuple[list[Path], list[str]]:
    """The .py files of each source ('stdlib', or an installed package such as 'numpy'), and a
    label per source with its version, for the card."""
    files, labels = [], []
    for name in sources:
        if name == "stdlib":
            files += _python_files(Path(sysconfig.get_paths()["stdlib"]))
            labels.append(f"Python {sys.version.split()[0]} standard library")
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"error: --sources: no installed package {name!r}")
        files += _python_files(Path(next(iter(spec.submodule_search_locations))))
        # The import name can differ from the distribution's (sklearn is scikit-learn).
        dists = importlib.metadata.packages_distributions().get(name, [name])
        try:
            labels.append(f"{name} {importlib.metadata.version(dists[0])}")
        except importlib.metadata.PackageNotFoundError:
            labels.append(name)
    return files, labels


def function_prompts(files: list[Path]) -> list[str]:
    """Every documented top-level function, cut right after its docstring: signature + docstring,
    the shape of a code-completion prompt. Files are parsed in parallel, results kept in order."""
    if len(files) < 64:
        found = [_file_prompts(path) for path in files]
    else:
        with multiprocessing.get_context("fork").Pool() as pool:  # workers only parse text
            found = pool.map(_file_prompts, files, chunksize=16)
    # Once each: packages copy helpers between modules (transformers' "Copied from": 2951
    # prompts, 1831 distinct), which would weigh them many times over.
    return list(dict.fromkeys(p for prompts in found for p in prompts))


def _file_prompts(path: Path) -> list[str]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines, prompts = source.splitlines(), []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.body:
            continue
        doc = ast.get_docstring(node)
        if not doc or not 40 <= len(doc) <= 1200 or len(node.body) < 2:
            continue
        header = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
        if len(header) <= 2000:
            prompts.append(header)
    return prompts


def code_chunks(files: list[Path], n: int, chars: int, rng: random.Random) -> list[str]:
    """`n` random spans of raw source, each starting at a line boundary."""
    texts = [t for t in (p.read_text(encoding="utf-8", errors="replace") for p in files) if t]
    chunks: list[str] = []
    while len(chunks) < n and any(len(t) >= chars for t in texts):
        text = rng.choice(texts)
        if len(text) < chars:
            continue
        start = text.rfind("\n", 0, rng.randrange(len(text) - chars + 1)) + 1
        chunks.append(text[start : start + chars])
    return chunks


# --- decontamination ----------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


# A folder holding question.jsonl (Spec-Bench) and HumanEval.jsonl.gz, for a machine that has
# neither at its usual place (a lent GPU: scripts/device/pack.sh carries them there).
BENCHMARKS_ENV = "DECODING_LAB_BENCHMARKS"


def benchmark_files() -> dict[str, Path | None]:
    """Where this machine keeps each benchmark's prompts (None: nowhere)."""
    from decoders.bench import DEFAULT_SPEC_BENCH, humaneval_path

    folder = os.environ.get(BENCHMARKS_ENV)
    spec_bench = Path(folder) / "question.jsonl" if folder else DEFAULT_SPEC_BENCH
    humaneval = Path(folder) / "HumanEval.jsonl.gz" if folder else humaneval_path()
    return {
        "spec_bench": spec_bench if spec_bench.is_file() else None,
        "humaneval": humaneval if humaneval is not None and humaneval.is_file() else None,
    }


def benchmark_texts(spec_bench: Path | None = None) -> list[str]:
    """Every Spec-Bench question turn and every HumanEval prompt this machine has."""
    return [t for texts in benchmark_sources(spec_bench).values() for t in texts]


def benchmark_sources(spec_bench: Path | None = None) -> dict[str, list[str]]:
    """The texts of each benchmark, by name (an empty list: not on this machine)."""
    files = benchmark_files()
    path = spec_bench or files["spec_bench"]
    sources: dict[str, list[str]] = {"spec_bench": [], "humaneval": []}
    if path is not None and path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                sources["spec_bench"] += json.loads(line)["turns"]
    if files["humaneval"] is not None:
        with gzip.open(files["humaneval"], "rt") as f:
            sources["humaneval"] = [json.loads(line)["prompt"] for line in f if line.strip()]
    return sources


def benchmark_ngrams(texts: Iterable[str] | None = None) -> set[tuple[str, ...]]:
    return set().union(*(ngrams(t) for t in (benchmark_texts() if texts is None else texts)))


def contaminated(text: str, banned: set[tuple[str, ...]]) -> bool:
    return not banned.isdisjoint(ngrams(text))


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
