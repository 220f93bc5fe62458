"""Is the token tree's drafter calibrated? A node's path probability (its score) against how often
the target accepted it, over the tuning prompts (docs/BENCHMARKS.md, "is the drafter calibrated").

    python scripts/study_calibration.py [--model embedded] [--tokens 64]

The tree is grown at a fixed size (48 nodes, depth 6, top-4, no copied branch), so that nodes of
every score are verified; `size=cost` sizes its trees on these scores (`costs.pays`)."""

from __future__ import annotations

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(ROOT := Path(__file__).resolve().parents[1]))

import torch

from decoders.core.events import Draft, Verify
from decoders.core.models import load_model
from decoders.engine import generate

BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01)
TREE = {"size": "fixed", "nodes": 48, "depth": 6, "top_k": 4, "lookup": 0}


def verdicts(events) -> list[tuple[float, float, bool, bool]]:
    """(path score, own probability, accepted, parent accepted) for every drafted node."""
    rows, drafts = [], {}
    for e in events:
        if isinstance(e, Draft):
            drafts[e.step] = e
        elif isinstance(e, Verify) and e.step in drafts:
            d, kept, score = drafts[e.step], set(e.accepted), []
            for q, p in zip(d.parents, d.probs, strict=True):
                score.append(p * (score[q] if q >= 0 else 1.0))
            for i, (q, p) in enumerate(zip(d.parents, d.probs, strict=True)):
                rows.append((score[i], p, i in kept, q < 0 or q in kept))
    return rows


def table(rows, column: int, title: str) -> None:
    print(f"| {title} | nodes | mean | accepted |\n|---|---:|---:|---:|")
    for lo, hi in pairwise(BINS):
        sel = [r for r in rows if lo <= r[column] < hi]
        if sel:
            mean = sum(r[column] for r in sel) / len(sel)
            rate = sum(r[2] for r in sel) / len(sel)
            print(f"| {lo:.2f}–{min(hi, 1.0):.2f} | {len(sel)} | {mean:.3f} | {rate:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", default=str(ROOT / "assets" / "tuning_prompts.jsonl"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    bundle = load_model(args.model)
    rows = []
    for line in Path(args.prompts).read_text().splitlines():
        p = json.loads(line)
        res = generate(bundle, p["prompt"], "token_tree", args.tokens, chat=p.get("chat"), **TREE)
        rows += verdicts(res.events)
    table(rows, 0, "path score")
    print()
    table([r for r in rows if r[3]], 1, "own probability (parent accepted)")


if __name__ == "__main__":
    main()
