"""`python -m decoders.seq2seq eval --task modes --seed 7 --n 300 [--json]`: every shipped
translation model and decoding setting on a held-out set (see decoders/seq2seq/evaluate.py)."""

from __future__ import annotations

import argparse
import sys

from .tasks import TASKS, TRAIN_SEED


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decoders.seq2seq", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="measure every model and decoding setting")
    ev.add_argument("--task", choices=TASKS, default="modes")
    ev.add_argument("--seed", type=int, default=1, help=f"any but {TRAIN_SEED} (training's)")
    ev.add_argument("--n", type=int, default=300, help="sentences")
    ev.add_argument("--json", action="store_true", help="a JSON list, one row per setting")
    ev.add_argument("--models", default=None, help="comma-separated: only these models' rows")
    args = ap.parse_args(argv)

    import torch

    from .evaluate import MODELS, SETTINGS, dumps, evaluate, table

    torch.set_num_threads(1)  # as training: two threads were no faster on models this small

    settings = SETTINGS
    if args.models:
        wanted = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in MODELS]
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)}; the models are {', '.join(MODELS)}")
        settings = tuple(s for s in SETTINGS if s[0] in wanted)
    try:
        rows = evaluate(args.task, args.seed, args.n, settings)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(dumps(rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
