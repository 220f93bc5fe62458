"""What the Translation lab shows for one source sentence: its references, every shipped model's
output (with where it goes wrong), Mask-Predict's iterations, FlowSeq's latents, the predicted
length and fertilities; and the held-out metrics the training recorded (`metrics`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .evaluate import ASSETS, NPD, SETTINGS, SHOWN_AS, load, run_setting
from .metrics import best_bleu, mixed, registers, valid
from .models import sources
from .tasks import (
    CHOICES,
    MAX_WORDS,
    MIN_WORDS,
    N_WORDS,
    SRC,
    TASKS,
    check_task,
    describe,
    examples,
    tagged,
    translate,
)

LAB_SEED = 7  # the lab's example sentences (a held-out seed)
WORD = re.compile(r"^w?(\d+)$")

# Each model and decoding code in words, for a reader who has not read docs/TRANSLATION.md: the
# lab shows them beside the codes (the codes are what the CLI, the cards and the docs use).
MODEL_WORDS = {
    "ar": "autoregressive (the teacher)",
    "nat": "vanilla NAT",
    "nat_kd": "NAT trained on distilled data",
    "cmlm": "Mask-Predict (CMLM)",
    "flowseq": "FlowSeq (a latent variable)",
    "depa": "DePA (dependency-aware NAT)",
}
# How FlowSeq's candidates are chosen (the latents table's "chosen by").
PICK_WORDS = {
    "argmax": "z = f(0), the prior's centre",
    "npd": "the teacher's best of the candidates",
    "iw": "FlowSeq's own best (importance-weighted)",
}
_CANDIDATES = re.compile(r"^(npd|iw):n=(\d+)$")


def decoding_words(model: str, decoding: str) -> str:
    """A decoding code in words: "npd:n=8" -> "noisy parallel decoding, 8 candidates"."""
    parts: list[str] = []
    for code in decoding.replace(",", " ").split():
        m = _CANDIDATES.match(code)
        if m and m.group(1) == "npd":
            parts.append(f"noisy parallel decoding, {m.group(2)} candidates (the teacher picks)")
        elif m:
            parts.append(f"importance weighting, {m.group(2)} candidates (FlowSeq scores them)")
        elif code.startswith("beam:"):
            parts.append(f"beam search, {code.split(':')[1]} beams")
        elif code.startswith("T="):
            t = code[2:]
            parts.append("1 iteration (one pass)" if t == "1" else f"{t} iterations, a pass each")
        elif code == "greedy":
            parts.append("one token per pass" if model == "ar" else "one pass")
        elif code == "fertility":  # alone: one pass
            fed = "inputs copied by the predicted fertilities"
            parts.append(fed if "npd" in decoding else f"one pass, {fed}")
        elif code == "argmax":
            parts.append(f"one latent: {PICK_WORDS['argmax']}")
        elif code == "cold":
            parts.append("decoder trained as a NAT only")
    return "; ".join(parts) or decoding


class SourceError(ValueError):
    """A typed source the lab cannot translate; the message names what is wrong."""


def parse_source(text: str) -> tuple[int, ...]:
    """Source words typed as `w3 w1 w4` (or `3 1 4`): token ids, or a SourceError naming the bad
    word."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise SourceError(
            f"type a source sentence: {MIN_WORDS}–{MAX_WORDS} words w0…w{N_WORDS - 1}"
        )
    out = []
    for p in parts:
        m = WORD.match(p.strip().lower())
        if not m or not 0 <= int(m.group(1)) < N_WORDS:
            raise SourceError(
                f"{p!r} is not a source word: the words are w0 … w{N_WORDS - 1} (or 0 … {N_WORDS - 1})"
            )
        out.append(SRC + int(m.group(1)))
    if not MIN_WORDS <= len(out) <= MAX_WORDS:
        raise SourceError(
            f"a source has {MIN_WORDS}–{MAX_WORDS} words (the models were trained on those); "
            f"this one has {len(out)}"
        )
    return tuple(out)


def example_sources(task: str, n: int = 12) -> list[str]:
    """Held-out example sentences for the picker, as words."""
    return [" ".join(describe(e.source)) for e in examples(task, LAB_SEED, n)]


@dataclass
class Row:
    model: str
    decoding: str
    tokens: list[str]
    valid: bool
    mixed: bool
    wrong: list[int]  # positions that differ from the closest reference (and extra positions)
    closest: list[str]
    bleu: float
    passes: float
    why: str

    @property
    def model_words(self) -> str:
        return MODEL_WORDS.get(self.model, self.model)

    @property
    def decoding_words(self) -> str:
        return decoding_words(self.model, self.decoding)


@dataclass
class Lab:
    task: str
    source: list[str]
    references: list[list[str]]
    rows: list[Row]
    mask_predict: list[dict]  # per iteration: tokens, probs, remasked, refilled
    flowseq: list[dict]  # per latent sample: tokens, prior, teacher, iw, valid
    lengths: list[tuple[int, float]]  # the NAT's likeliest lengths and their probabilities
    fertilities: list[tuple[str, int, float]]  # per source word: fertility, its probability
    notes: list[str] = field(default_factory=list)
    pick_words: dict[str, str] = field(default_factory=lambda: dict(PICK_WORDS))


def _closest(out: tuple[int, ...], refs: list[tuple[int, ...]]) -> tuple[int, ...]:
    return max(
        refs,
        key=lambda r: (sum(a == b for a, b in zip(out, r, strict=False)), -abs(len(r) - len(out))),
    )


def _why(out: tuple[int, ...], refs: list[tuple[int, ...]], source: tuple[int, ...]) -> str:
    """In a few words, why an output is (not) a right translation."""
    if valid(out, refs):
        return "a right translation"
    if mixed(out, source):
        return "mixes registers" if len(registers(out)) > 1 else "mixes word orders"
    if not any(len(r) == len(out) for r in refs):
        return "a wrong length"
    return "a wrong word"


@torch.no_grad()
def translate_all(task: str, source: tuple[int, ...], root: Path = ASSETS) -> Lab:
    """Every shipped model and decoding setting on one source."""
    check_task(task)
    refs = sorted({translate(source, r, rev, task) for r, rev in CHOICES[task]})
    src = sources([tagged(task, source)])
    rows = []
    for model, decoding in SETTINGS:
        outs, passes = run_setting(model, decoding, src, root)
        out = outs[0]
        close = _closest(out, refs)
        wrong = [j for j, t in enumerate(out) if j >= len(close) or close[j] != t]
        rows.append(
            Row(
                model,
                decoding,
                describe(out),
                valid(out, refs),
                mixed(out, source),
                wrong,
                describe(close),
                round(best_bleu(out, refs), 1),
                float(passes),
                _why(out, refs, source),
            )
        )
    # Mask-Predict at T = 10, each iteration's tokens and what it re-masked
    _, _, history = load("cmlm", root).mask_predict(src, 10)
    grid, before = [], None
    for it in history[0]:
        refilled = [j for j in range(len(it["tokens"])) if before is None or j in before]
        grid.append({**it, "tokens": describe(it["tokens"]), "refilled": refilled})
        before = set(it["remasked"])
    # FlowSeq's latents: z = f(0) first, then samples; every score that can rank them
    flow = load("flowseq", root)
    ((cands, prior),) = flow.sample(src, NPD)
    teacher = load("ar", root).score(src.expand(len(cands), -1), cands).tolist()
    iw = flow.iw_score(src[0], cands)
    latents = [
        {
            "sample": "f(0)" if i == 0 else f"z{i}",
            "tokens": describe(c),
            "prior": round(prior[i], 2),
            "teacher": round(teacher[i], 2),
            "iw": round(iw[i], 2),
            "valid": valid(c, refs),
        }
        for i, c in enumerate(cands)
    ]
    # the NAT's length distribution and the fertility NAT's fertilities
    nat = load("nat", root)
    memory, mmask = nat.encode(src)
    logits = nat.length(memory, mmask)[0]
    logits[0] = -math.inf  # as decoding: never an empty translation
    probs = torch.softmax(logits, -1)
    top = torch.topk(probs, 4)
    lengths = [(int(i), round(float(p), 3)) for p, i in zip(top.values, top.indices, strict=True)]
    fert_model = load("nat_fertility", root)
    memory, _ = fert_model.encode(src)
    fprobs = torch.softmax(fert_model.fertility(memory)[0], -1)
    fertilities = [
        (describe([t])[0], int(fprobs[j].argmax()), round(float(fprobs[j].max()), 3))
        for j, t in enumerate(src[0].tolist())
        if SRC <= t < SRC + N_WORDS
    ]
    return Lab(
        task,
        describe(source),
        [describe(r) for r in refs],
        rows,
        grid,
        latents,
        lengths,
        fertilities,
    )


def metrics(task: str, root: Path = ASSETS) -> list[dict[str, Any]]:
    """The held-out rows the training recorded for `task` (every model's card), in SETTINGS'
    order: what the lab's metrics table and chart show without decoding anything."""
    check_task(task)
    rows = []
    for path in sorted(root.glob("*.json")):
        card = json.loads(path.read_text())
        name = card["model"]
        model = SHOWN_AS.get(name, name)
        held = card.get("held_out", {})
        for r in held.get("rows", []):
            if r["task"] == task:
                rows.append(
                    {
                        "model": model,
                        "seed": held.get("seed"),
                        "n": held.get("n"),
                        **r,
                        "model_words": MODEL_WORDS.get(model, model),
                        "decoding_words": decoding_words(model, str(r["decoding"])),
                    }
                )
    order = {s: i for i, s in enumerate(SETTINGS)}
    return sorted(rows, key=lambda r: order.get((r["model"], r["decoding"]), math.inf))


__all__ = [
    "MODEL_WORDS",
    "PICK_WORDS",
    "TASKS",
    "Lab",
    "Row",
    "SourceError",
    "decoding_words",
    "example_sources",
    "metrics",
    "parse_source",
    "translate_all",
]
