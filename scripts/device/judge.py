"""Judge a retrained drafter against the shipped one (docs/GPU.md, step 3), on the tuning prompts
only (assets/tuning_prompts.jsonl: never benchmark prompts), in one process.

    python scripts/device/judge.py space runs/device/space.safetensors
    python scripts/device/judge.py kangaroo runs/device/kangaroo-l2.safetensors --params '{"eta": 0.6}'

Per prompt it runs autoregressive, the method on the shipped artifact and the method on the new
one, back to back, so that the machine's noise falls on all three alike; every output must be
identical to autoregressive greedy. Prints tokens per target forward and the speed against
autoregressive, for code and for chat.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from decoders import generate, load_model  # noqa: E402
from decoders.trained import kangaroo, mask_model  # noqa: E402

# The module whose adapter_path locates each lossless method's artifact (artifacts are cached
# per path). Mask-Predict shares SPACE's masks but is lossy: judge the masks through `space`.
LOCATORS = {"kangaroo": kangaroo, "space": mask_model}


def judge(
    method: str, new: Path, model: str, params: dict, max_new_tokens: int, repeat: int
) -> dict:
    module = LOCATORS[method]
    shipped = module.adapter_path
    bundle = load_model(model)
    prompts = [json.loads(line) for line in (ROOT / "assets/tuning_prompts.jsonl").open()]
    totals: dict = defaultdict(lambda: [0, 0, 0.0])  # (variant, kind): tokens, forwards, seconds
    mismatches = []
    try:
        for prompt in prompts * repeat:
            kind = "chat" if prompt["chat"] else "code"
            reference = None
            for variant in ("autoregressive", "shipped", "new"):
                module.adapter_path = shipped if variant != "new" else (lambda *_: new)
                name, kw = (
                    ("autoregressive", {}) if variant == "autoregressive" else (method, params)
                )
                res = generate(
                    bundle,
                    prompt["prompt"],
                    method=name,
                    max_new_tokens=max_new_tokens,
                    chat=prompt["chat"],
                    record=False,
                    **kw,
                )
                if reference is None:
                    reference = res.token_ids
                elif res.token_ids != reference:
                    mismatches.append((variant, prompt["id"]))
                t = totals[variant, kind]
                t[0] += res.stats["new_tokens"]
                t[1] += res.stats["target_forwards"]
                t[2] += res.stats["wall_s"]
    finally:
        module.adapter_path = shipped
    report: dict = {"mismatches": mismatches}
    for kind in ("code", "chat"):
        ar_tokens, _, ar_s = totals["autoregressive", kind]
        for variant in ("shipped", "new"):
            tokens, forwards, seconds = totals[variant, kind]
            if forwards:
                report[f"{kind}_{variant}"] = {
                    "tokens_per_forward": round(tokens / forwards, 3),
                    "speedup": round((tokens / seconds) / (ar_tokens / ar_s), 3),
                }
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("method", choices=sorted(LOCATORS))
    ap.add_argument("new", type=Path, help="the new artifact (.safetensors)")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--params", default="{}", help="the method's parameters, as JSON")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2, help="passes over the prompts")
    args = ap.parse_args(argv)
    if not args.new.is_file():
        ap.error(f"no file {args.new}")
    report = judge(
        args.method,
        args.new.resolve(),
        args.model,
        json.loads(args.params),
        args.max_new_tokens,
        args.repeat,
    )
    print(json.dumps(report, indent=2))
    return 1 if report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
