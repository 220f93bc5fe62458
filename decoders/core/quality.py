"""How far a lossy method's output is from autoregressive greedy, four ways:

- token agreement: the share of positions where both outputs hold the same token (over the longer
  output, so a missing tail counts against it), and the first position where they differ;
- ROUGE-L: the F1 of the longest common subsequence of the two outputs' token ids (Lin 2004),
  which forgives a shifted word that position-wise agreement counts as all wrong;
- NLL: the output's mean negative log-likelihood per token under the full target model, one
  forward over prompt + output (greedy's own output is the floor to compare it with; beware that
  a degenerate repetition scores a low NLL too);
- self-consistency, from the same forward: the share of output tokens that are the target's own
  argmax given the output before them. Positional agreement collapses after the first divergence
  even when every later token is sound; this says how many tokens the target would have written
  itself, in the lossy output's own context.

A lossless method scores 1, 1 and greedy's NLL (in half precision self-consistency can dip just
below 1: near-ties flip between one forward over the output and greedy's token-by-token run).
The badge, Compare and the benchmark show these for every method that does not claim to be
lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from decoders.core.models import ModelBundle


@dataclass(frozen=True)
class Quality:
    agreement: float  # 0..1
    first_difference: int | None  # output index, None when identical
    rouge_l: float  # 0..1
    compared: int  # tokens in the longer output

    def as_dict(self) -> dict:
        return asdict(self)


def lcs_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Longest common subsequence, O(len(a)·len(b)) with one row kept."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, start=1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(reference: Sequence[int], output: Sequence[int]) -> float:
    if not reference or not output:
        return float(list(reference) == list(output))
    lcs = lcs_length(reference, output)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(output), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def compare(reference: Sequence[int], output: Sequence[int]) -> Quality:
    n = max(len(reference), len(output))
    same = sum(a == b for a, b in zip(reference, output, strict=False))
    first = next(
        (i for i, (a, b) in enumerate(zip(reference, output, strict=False)) if a != b), None
    )
    if first is None and len(reference) != len(output):
        first = min(len(reference), len(output))
    return Quality(
        agreement=round(same / n, 4) if n else 1.0,
        first_difference=first,
        rouge_l=round(rouge_l(reference, output), 4),
        compared=n,
    )


@torch.inference_mode()
def under_target(
    bundle: ModelBundle, prompt_ids: Sequence[int], output: Sequence[int]
) -> dict[str, float]:
    """`nll`: mean negative log-likelihood (nats per token) of `output` after `prompt_ids` under
    the target; `consistency`: the share of output tokens equal to the target's argmax there. One
    causal forward, each output token scored by the row before it."""
    if not output:
        return {"nll": 0.0, "consistency": 1.0}
    ids = torch.tensor([[*prompt_ids, *output]], device=bundle.device)
    logits = bundle.model(input_ids=ids, use_cache=False).logits[0].float()
    rows = logits[len(prompt_ids) - 1 : -1]
    target = torch.tensor(list(output), device=rows.device)
    return {
        "nll": round(float(torch.nn.functional.cross_entropy(rows, target)), 4),
        "consistency": round(float((rows.argmax(-1) == target).float().mean()), 4),
    }


def nll(bundle: ModelBundle, prompt_ids: Sequence[int], output: Sequence[int]) -> float:
    return under_target(bundle, prompt_ids, output)["nll"]
