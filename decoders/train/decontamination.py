"""Decontamination of the corpus (decoders/train/corpus.py): a document sharing any word 8-gram
with a Spec-Bench question or a HumanEval prompt is dropped; where this machine keeps those
benchmarks' prompts, and which it has."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

NGRAM = 8  # decontamination: word n-grams shared with a benchmark prompt


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


def benchmarks_against(require: bool) -> dict[str, int]:
    """How many texts of each benchmark this machine has to decontaminate against (0: none).
    A missing one is never passed over silently: a warning, or with `require` a refusal (a lent
    GPU's first corpus had neither, and reported "none removed")."""
    against = {name: len(texts) for name, texts in benchmark_sources().items()}
    missing = [name for name, n in against.items() if not n]
    if missing:
        message = (
            f"no {' and no '.join(missing)} prompts on this machine to decontaminate against "
            f"(set {BENCHMARKS_ENV} to a folder with question.jsonl and HumanEval.jsonl.gz)"
        )
        if require:
            raise SystemExit(f"error: {message}")
        print(f"warning: {message}", file=sys.stderr)
    return against
