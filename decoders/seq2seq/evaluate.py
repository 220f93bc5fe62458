"""The shipped translation models: loading them, and every model and decoding setting measured on
a held-out set (`python -m decoders.seq2seq eval`)."""

from __future__ import annotations

import json
import statistics
import time
from functools import cache
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .metrics import best_bleu, excess_repeats, mixed, valid
from .models import MAX_TARGET, Seq2Seq, sources
from .tasks import TRAIN_SEED, Example, check_task, examples, tagged
from .training import build

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "seq2seq"
MODELS = ("ar", "nat", "nat_kd", "cmlm", "flowseq", "depa")
# weight files whose rows the evaluation names after another model (a variant's decoding says which)
SHOWN_AS = {"nat_fertility": "nat", "depa_cold": "depa"}
NPD = 8  # candidates for noisy parallel decoding and importance weighting
ITERATIONS = (1, 2, 4, 10)  # Mask-Predict's T


def weights_path(name: str, root: Path = ASSETS) -> Path:
    return root / f"{name}.safetensors"


@cache
def load(name: str, root: Path = ASSETS) -> Seq2Seq:
    """A shipped model (see `decoders.seq2seq.training.PLAN`), in eval mode."""
    path = weights_path(name, root)
    if not path.exists():
        raise FileNotFoundError(
            f"no weights for the translation model {name!r} at {path}; "
            "train them with `python -m decoders.train seq2seq`"
        )
    model = build(name)
    model.load_state_dict(load_file(path))
    return model.eval()


# (model, decoding): what each row of the evaluation runs
SETTINGS: tuple[tuple[str, str], ...] = (
    ("ar", "greedy"),
    ("ar", "beam:4"),
    ("nat", "greedy"),
    ("nat", f"npd:n={NPD}"),
    ("nat", "fertility"),
    ("nat", f"fertility npd:n={NPD}"),
    ("nat_kd", "greedy"),
    ("nat_kd", f"npd:n={NPD}"),
    *(("cmlm", f"T={t}") for t in ITERATIONS),
    ("flowseq", "argmax"),
    ("flowseq", f"npd:n={NPD}"),
    ("flowseq", f"iw:n={NPD}"),
    ("depa", "greedy"),
    ("depa", "greedy, trained cold"),
)


def needs(model: str, decoding: str) -> set[str]:
    """The weight files a setting reads (the teacher's too, where it rescores)."""
    name = {"nat": "nat_fertility" if decoding.startswith("fertility") else "nat"}.get(model, model)
    if model == "depa" and "cold" in decoding:
        name = "depa_cold"
    return {name} | ({"ar"} if "npd" in decoding else set())


def run_setting(model: str, decoding: str, src: torch.Tensor, root: Path = ASSETS):
    """Translations of a batch of tagged sources, and the decoder passes per sentence (a float:
    the autoregressive model's depend on each output's length)."""
    if model == "ar":
        if decoding == "greedy":
            outs, _ = load("ar", root).greedy(src)
            return outs, statistics.mean(min(len(o) + 1, MAX_TARGET + 1) for o in outs)
        return load("ar", root).beam(src, int(decoding.split(":")[1]))
    if model in ("nat", "nat_kd"):
        name = "nat_fertility" if decoding.startswith("fertility") else model
        nat = load(name, root)
        if decoding.endswith("greedy") or decoding == "fertility":
            return nat.greedy(src)
        return nat.npd(src, load("ar", root), NPD)
    if model == "cmlm":
        outs, passes, _ = load("cmlm", root).mask_predict(src, int(decoding.split("=")[1]))
        return outs, passes
    if model == "flowseq":
        how = decoding.split(":")[0]
        teacher = load("ar", root) if how == "npd" else None
        outs, passes, _ = load("flowseq", root).decode_all(src, how, NPD, teacher)
        return outs, passes
    if model == "depa":
        return load("depa_cold" if "cold" in decoding else "depa", root).greedy(src)
    raise ValueError(f"unknown translation model {model!r}; the models are {', '.join(MODELS)}")


def score(outs: list[tuple[int, ...]], held: list[Example]) -> dict[str, float]:
    n = len(held)
    return {
        "valid": round(sum(valid(o, e.references) for o, e in zip(outs, held, strict=True)) / n, 4),
        "mixed": round(sum(mixed(o, e.source) for o, e in zip(outs, held, strict=True)) / n, 4),
        "excess_repeats": round(
            sum(excess_repeats(o, e.references) for o, e in zip(outs, held, strict=True)) / n, 4
        ),
        "bleu": round(
            sum(best_bleu(o, e.references) for o, e in zip(outs, held, strict=True)) / n, 2
        ),
    }


def evaluate(
    task: str,
    seed: int,
    n: int,
    settings: tuple[tuple[str, str], ...] = SETTINGS,
    root: Path = ASSETS,
) -> list[dict[str, Any]]:
    """One row per model and decoding setting on `n` held-out sentences of `task` from `seed`."""
    check_task(task)
    if seed == TRAIN_SEED:
        raise ValueError(
            f"seed {TRAIN_SEED} is the training set's; pick another for a held-out set"
        )
    if n < 1:
        raise ValueError(f"n must be at least 1 (got {n})")
    held = examples(task, seed, n)
    src = sources([tagged(task, e.source) for e in held])
    rows = []
    for model, decoding in settings:
        for name in needs(model, decoding):  # loading is not decoding: outside the clock
            load(name, root)
        start = time.perf_counter()
        with torch.no_grad():
            outs, passes = run_setting(model, decoding, src, root)
        ms = 1000 * (time.perf_counter() - start) / n
        rows.append(
            {
                "model": model,
                "decoding": decoding,
                **score(outs, held),
                "passes": round(float(passes), 2),
                "ms": round(ms, 3),
                "task": task,
                "seed": seed,
                "n": n,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (the card's and the docs')."""
    head = "| model | decoding | valid | mixed | excess repeats | BLEU | passes | ms |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['decoding']} | {100 * r['valid']:.1f}% | {100 * r['mixed']:.1f}%"
            f" | {r['excess_repeats']:.2f} | {r['bleu']:.1f} | {r['passes']:g} | {r['ms']:.2f} |"
        )
    return "\n".join(lines)


def dumps(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=1)
