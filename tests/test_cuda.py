"""Every lossless method on CUDA, token for token against greedy on the same device and dtype:
float32 with TF32 off (exact: a difference is a failure unless it falls on a float near-tie), and
bfloat16, where batch shapes move logits by far more and a difference at a near-tie
(engine.NEAR_TIE) is reported as such. Skipped without a GPU; run on a lent one by
scripts/device/train.sh (STAGES=cuda), which keeps the report ($CUDA_REPORT) for docs/GPU.md."""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import PROMPTS
from decoders import METHODS, check_lossless, generate, greedy_reference, load_model
from decoders.core.models import TUNED_ID
from decoders.core.runtime import forward, new_cache

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = ("float32", "bfloat16")
BUDGET = 48
CASES = [PROMPTS[0], PROMPTS[1], PROMPTS[3], PROMPTS[5]]  # code, chat, chat, code
LOSSLESS = [name for name, m in METHODS.items() if m.lossless and name != "autoregressive"]
_report: list[dict] = []


def setup_module() -> None:
    # Exact float32: no TF32 in matmuls or convolutions (PyTorch's defaults differ by version)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def teardown_module() -> None:
    path = os.environ.get("CUDA_REPORT")
    if path and _report:
        with open(path, "a") as f:
            for row in _report:
                f.write(json.dumps(row) + "\n")


def model_for(method: str, dtype: str):
    model = TUNED_ID if method == "layerskip" else None  # LayerSkip drafts from a tuned model
    return load_model(model, device="cuda", dtype=dtype)


_references: dict[tuple, list[int]] = {}


def reference(bundle, prompt_ids) -> list[int]:
    key = (bundle.model_id, str(bundle.dtype), tuple(prompt_ids))
    if key not in _references:
        _references[key] = greedy_reference(bundle, prompt_ids, BUDGET)
    return _references[key]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", LOSSLESS)
def test_lossless_on_cuda(method, dtype):
    bundle = model_for(method, dtype)
    outcomes = []
    for prompt in CASES:
        ids = bundle.encode(prompt)
        res = generate(bundle, ids, method, BUDGET)
        check = check_lossless(bundle, res, reference(bundle, ids))
        outcome = "identical" if check.identical else "near-tie" if check.near_tie else "differs"
        outcomes.append((outcome, check.describe()))
        _report.append(
            {
                "test": "lossless",
                "device": torch.cuda.get_device_name(),
                "model": bundle.model_id,
                "dtype": dtype,
                "method": method,
                "prompt": prompt[:40],
                "outcome": outcome,
                "first_divergence": check.first_divergence,
                "gap": check.gap,
                "tokens_per_forward": res.stats["tokens_per_target_forward"],
                "tokens_per_s": res.stats["tokens_per_s"],
            }
        )
    failed = [d for o, d in outcomes if o == "differs"]
    assert not failed, failed


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_shapes_move_logits_within_the_near_tie_tolerance(dtype):
    """How far the same logits move between one forward over the whole text and one token at a
    time (the two kernel paths every draft-and-verify method mixes): recorded per dtype, and
    inside the near-tie tolerance the lossless check allows (engine.NEAR_TIE)."""
    from decoders.engine import NEAR_TIE

    bundle = load_model(device="cuda", dtype=dtype)
    ids = bundle.encode(PROMPTS[1])
    out = reference(bundle, ids)
    seq = [*ids, *out]
    whole = forward(bundle, new_cache(bundle), seq, step=0, kind="prefill").logits
    cache = new_cache(bundle)
    forward(bundle, cache, ids, step=0, kind="prefill")
    rows = [forward(bundle, cache, [t], step=1, kind="target").logits[-1] for t in out[:-1]]
    moved = float((whole[len(ids) : len(seq) - 1] - torch.stack(rows)).abs().max())
    _report.append({"test": "batch_shapes", "dtype": dtype, "max_logit_difference": moved})
    assert moved < NEAR_TIE[dtype]
