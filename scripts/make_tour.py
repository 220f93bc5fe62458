"""Record the guided tour: every stop's run of the embedded model, and a Compare of them all.

    python scripts/make_tour.py            # assets/tour/<stop>.json and side_by_side.json

Each stop (declared with its method, `Method.tour`; ordered by ui/tour.py) is a real run on the tour's prompt with the lossless check against greedy
recorded in the file; the last stop is a Compare of every stop's run, several rounds, so its
speedups are medians with their spread. `tests/test_tour.py` re-runs each stop against the
current decoders and fails when a recording no longer matches: re-run this script then.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from decoders.core.models import EMBEDDED_ID
from ui.compare import compare_methods
from ui.live import run_to_end
from ui.tour import (
    BUDGET,
    DECLARED,
    PROMPT,
    ROUNDS,
    SIDE_BY_SIDE,
    TOUR,
    draft_fingerprint,
    drafting_dtype,
    pin_prices,
    recorded,
    spec_of_stop,
)
from ui.traces import check_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="stop keys to record (default: all + side by side)")
    args = ap.parse_args()
    # One thread, as the test suite that re-runs each stop has (its float sums then match ours).
    torch.set_num_threads(1)
    TOUR.mkdir(parents=True, exist_ok=True)
    for stop in DECLARED:  # every stop a method declares
        if (args.only and stop.key not in args.only) or stop.same_run_as:
            continue
        trace = run_to_end(EMBEDDED_ID, PROMPT, stop.method, BUDGET, dict(stop.params))
        check_trace(trace)  # what the page will do with it
        stop.path.write_text(trace.to_json())
        print(
            f"{stop.key}: {len(trace.token_ids)} tokens, "
            f"{trace.stats['tokens_per_target_forward']:.2f} tokens/forward, "
            f"step {stop.pick(trace)} of {trace.last_step}, "
            f"{(trace.meta.get('lossless') or {}).get('status')}"
        )
    if args.only and SIDE_BY_SIDE not in args.only:
        return
    specs = [spec_of_stop(s) for s in DECLARED if not s.same_run_as]
    pin_prices(recorded("token_tree"))  # the comparison's trees: the recorded stop's
    *_, last = compare_methods(EMBEDDED_ID, PROMPT, specs, BUDGET, rounds=ROUNDS)
    record = {
        "prompt": PROMPT,
        "max_new_tokens": BUDGET,
        "rounds": ROUNDS,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "threads": torch.get_num_threads(),
        # trained heads draft in this dtype here (packing.draft_dtype), and this machine's
        # kernels round them to this fingerprint: a machine with another grows other trees from
        # the same heads, and tests/test_tour.py then checks the head-drafted stops more loosely
        "draft_dtype": drafting_dtype(),
        "draft_fingerprint": draft_fingerprint(),
        "recorded": time.strftime("%Y-%m-%d"),
        "rows": last.rows,
    }
    (TOUR / f"{SIDE_BY_SIDE}.json").write_text(json.dumps(record, indent=1))
    print(last.headline())


if __name__ == "__main__":
    main()
