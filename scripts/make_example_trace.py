"""Write assets/example_trace.json: the trace a cold page replays before anyone clicks Run.

    python scripts/make_example_trace.py [--method token_tree] [--max-new-tokens 64]

A real run of the embedded model on the page's first example prompt, the method at its defaults,
with the lossless check against greedy recorded in the file (the page shows that claim as
recorded, not re-checked). Re-run it whenever a method's defaults or the trace schema change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoders.core.models import EMBEDDED_ID
from ui.live import run_to_end
from ui.traces import EXAMPLE_PROMPTS, EXAMPLE_TRACE, check_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="token_tree")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=EXAMPLE_TRACE)
    args = ap.parse_args()
    trace = run_to_end(EMBEDDED_ID, EXAMPLE_PROMPTS[0], args.method, args.max_new_tokens, {})
    check_trace(trace)  # what the page will do with it
    args.out.write_text(trace.to_json())
    lossless = trace.meta.get("lossless", {})
    print(
        f"{args.out}: {args.method}, {len(trace.token_ids)} tokens, "
        f"{trace.stats['tokens_per_target_forward']} tokens/forward, lossless: {lossless}"
    )


if __name__ == "__main__":
    main()
