"""Which LayerSkip variant the GPU call's checks and benchmark use (scripts/device/train.sh): of
the cards given, those whose tuned model stayed near the original (greedy outputs on the tuning
prompts agreeing at least half the time, next tokens on the probe at least 85 %), the one whose
exits agree most with its last layer on the probe (the mean over the layers self-speculation and
CALM read from); if none stayed near, the nearest. Prints the card's path (nothing: no card).
What ships is judged afterwards on the CPU, by the real decoders (docs/GPU.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

LAYERS = (6, 8, 10, 12, 15, 18, 21)


def scores(card: dict) -> tuple[bool, float, float]:
    held = card.get("held_out", {})
    quality = card.get("quality", {})
    near = quality.get("greedy_agreement", 0.0)
    same = held.get("probe_same_as_original", 0.0)
    exits = [held[f"probe_l{ell}_vs_tuned"] for ell in LAYERS if f"probe_l{ell}_vs_tuned" in held]
    return near >= 0.5 and same >= 0.85, sum(exits) / max(len(exits), 1), near


def main(paths: list[str]) -> int:
    cards = {p: json.loads(Path(p).read_text()) for p in paths if Path(p).is_file()}
    if not cards:
        return 0
    ranked = {p: scores(c) for p, c in cards.items()}
    for p, (ok, exits, near) in ranked.items():
        print(
            f"{p}: near={near:.3f} exits={exits:.3f}{'' if ok else ' (drifted)'}", file=sys.stderr
        )
    near_ones = [p for p, (ok, _, _) in ranked.items() if ok]
    best = (
        max(near_ones, key=lambda p: ranked[p][1])
        if near_ones
        else max(ranked, key=lambda p: ranked[p][2])
    )
    print(best)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
