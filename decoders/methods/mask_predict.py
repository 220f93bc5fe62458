"""Mask-Predict (Ghazvininejad et al. 2019, "Mask-Predict: Parallel Decoding of Conditional Masked
Language Models"): fill a block of m tokens in parallel, then mask the least confident fills
again and predict them anew, T times. Nothing verifies the result: it is the lossy,
non-autoregressive row, run on SPACE's mask model (decoders/trained/mask_model.py).

    block of m tokens after x (the last committed token), every input predicting the token after it:
        inputs  = x  u_1 .. u_{m-1}            u_i = y_i when y_1 .. y_i are all kept, else a
                                                mask M (a kept y_i after a masked one stays as it
                                                is but is fed as a mask: as a real input it would
                                                see a hole in its context, which neither the model
                                                nor the adapter ever saw)
        y_1     = argmax(row of x)              x is real and sees real tokens only: y_1 is the
                                                target's own greedy token, final at once
        y_{i+1} = argmax(row of u_i)            a mask row guesses; the row of a kept run straight
                                                after x is the target's own
    iteration t = 0 .. T-1:
        t = 0: every u_i is a mask, so one forward fills the whole block
        predict y_i anew wherever u_i-side is masked; kept tokens keep their token and confidence
        if t < T-1: mask again the n = ⌊(m-1)(T-1-t)/T⌋ least confident of y_2 .. y_m (Mask-Predict's
                    linear decay); n = 0 ends the block early
    commit y_1 .. y_m; their KV is computed as real inputs at the next block's first forward

    attention: real inputs (the cache, x, the kept run) are causal among themselves and never
               see a mask (as in SPACE's layout, so their rows are the original model's); a mask
               sees every earlier input, masks included (as its training layout did)
    positions: each input's position in the sequence

A block costs T target forwards for m tokens. The output is not greedy's: the badge, Compare and
the benchmark report its agreement with greedy, ROUGE-L and NLL (decoders/core/quality.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import AttentionMask, Commit, Event, MaskPredictStep, Prefill
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import crop_cache, new_cache
from decoders.core.steps import visible_rows
from decoders.trained.mask_model import forward_masked, load_adapter

PARAMS = (
    # Defaults from a sweep on assets/tuning_prompts.jsonl (CPU, 64 tokens): m = 3, T = 2 kept the
    # most of the target's own choices (82 %) while still beating autoregressive (1.1x); m = 5,
    # T = 1 ran at 2.8x with 76 %, the full schedule (m = 5, T = 4) at 0.9x with 80 %.
    Param(
        "m",
        int,
        3,
        "tokens per block: the last token's own row fills the first, m − 1 masks the rest "
        "(up to the mask adapter's k + 1); 0 = k + 1",
        0,
        9,
    ),
    Param(
        "T",
        int,
        2,
        "iterations per block: each but the last masks the least confident fills again "
        "(Mask-Predict's linear decay); 1 = keep the first parallel fill; 0 = m − 1 (one mask "
        "fewer each time: the full schedule)",
        0,
        8,
    ),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    adapter = load_adapter(bundle)
    if params["m"] > adapter.k + 1:
        raise InvalidParameter(
            f"m = {params['m']}: the mask adapter for {bundle.model_id} guesses {adapter.k} "
            f"tokens ahead, so a block holds at most {adapter.k + 1} (use 1..{adapter.k + 1})"
        )


def remask_count(m: int, T: int, t: int) -> int:
    """How many of the m − 1 mask-filled tokens iteration t masks again (0 after the last)."""
    return (m - 1) * (T - 1 - t) // T if t < T - 1 else 0


def layout(
    cached: int, pending: int, masked: list[bool]
) -> tuple[list[int], list[int], torch.Tensor]:
    """One forward's inputs, fed real first: `pending` committed tokens not yet in the cache (the
    last one is x), then the block's inputs u_1 .. u_{len(masked)} with the kept ones before the
    masked ones. Returns the order (for each fed row, -1 - p for pending p, else the block index
    i of u_{i+1}), the positions, and the additive mask [1, 1, n, cached + n]."""
    block = len(masked)
    order = [-1 - p for p in range(pending)]
    order += [i for i in range(block) if not masked[i]] + [i for i in range(block) if masked[i]]
    x_pos = cached + pending - 1  # x's position; u_{i+1} sits at x_pos + 1 + i
    positions = [cached + p for p in range(pending)] + [x_pos + 1 + i for i in order[pending:]]
    n = len(order)
    sees = torch.zeros(n, n, dtype=torch.bool)
    for r, i in enumerate(order):
        for c, j in enumerate(order):
            if j < 0:  # a pending (committed) token: seen by every row after it
                sees[r, c] = i >= 0 or j >= i
            elif i >= 0 and j <= i:  # block inputs: a mask sees all before it, a real one no mask
                sees[r, c] = masked[i] or not masked[j]
    mask = torch.zeros(n, cached + n)
    mask[:, cached:] = torch.where(sees, 0.0, float("-inf"))
    return order, positions, mask.view(1, 1, n, cached + n)


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    adapter = load_adapter(bundle)
    m = cfg.params["m"] or adapter.k + 1
    T = cfg.params["T"] or max(1, m - 1)
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    context = list(prompt_ids)
    cached = 0  # tokens of `context` whose keys and values are in the cache
    yield Prefill(tuple(prompt_ids))

    step = 0
    while not budget.done:
        n = min(m, budget.remaining)
        fill, conf = [0] * n, [0.0] * n
        masked = [True] * n  # masked[j]: y_{j+1} is predicted this iteration, u_{j+1} is a mask
        shown: AttentionMask | None = None  # the layout the mask view draws for this step
        for t in range(T):
            pending = len(context) - cached
            # u_1 .. u_{n-1} (y_n is never an input): real only while every y before is kept
            inputs = [any(masked[: j + 1]) for j in range(n - 1)]
            order, positions, attention = layout(cached, pending, inputs)
            tokens = [context[cached + (-1 - i)] if i < 0 else fill[i] for i in order]
            first = pending + sum(not x for x in inputs)  # rows from here on are masks
            # Drawn: the first re-mask iteration when a mask is among its inputs (masks and kept
            # fills side by side), else the block as first fed (after the prefill: all masks).
            if cfg.detail and ((t == 0 and cached > 0) or (t == 1 and any(inputs))):
                shown = _mask_event(step, order, tokens, attention, cached, pending, inputs)
            out = forward_masked(
                bundle,
                adapter,
                cache,
                tokens,
                first,
                step=step,
                kind="prefill" if cached == 0 else "target",
                positions=positions,
                attention=attention,
            )
            yield out.event
            crop_cache(cache, len(context))  # keep the committed tokens; the block is re-fed
            cached = len(context)
            probs = torch.softmax(out.logits, -1)
            row = {i: r for r, i in enumerate(order)}  # u_{i+1}'s row predicts y_{i+2}
            updated = tuple(j for j in range(n) if masked[j])
            for j in updated:
                source = row[-pending] if j == 0 else row[j - 1]  # x's row, else u_j's
                c, tok = probs[source].max(-1)
                fill[j], conf[j] = int(tok), round(float(c), 6)
            again = remask_count(n, T, t)
            # y_1 is the target's own token: never masked again
            remasked = sorted(sorted(range(1, n), key=lambda j: (conf[j], j))[:again])
            masked = [j in remasked for j in range(n)]
            yield MaskPredictStep(
                step,
                len(context) - len(prompt_ids),
                t,
                tuple(fill),
                tuple(conf),
                updated,
                tuple(remasked),
            )
            if not remasked:  # nothing left to refine: the block is done
                break
        if shown is not None:
            yield shown
        taken = budget.take(fill)
        origins = tuple("target" if j == 0 else "mask" for j in range(len(taken)))
        yield Commit(step, tuple(taken), origins, tuple(conf[: len(taken)]))
        context += taken
        step += 1


def _mask_event(step, order, tokens, attention, cached, pending, masked) -> AttentionMask:
    """The block's layout as the forward received it, labelled for the mask view (the rows
    stay in fed order: committed tokens, kept fills, masks)."""
    labels, branches = [], []
    for i in order:
        if i < 0:
            last = i == -pending
            labels.append("x" if last else f"new{-i}")
            branches.append("x" if last else "committed")
        else:
            labels.append(f"u{i + 1}")
            branches.append("mask" if masked[i] else "kept")
    return AttentionMask(
        step, tuple(labels), visible_rows(attention, cached), tuple(tokens), tuple(branches)
    )


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="lossy",
        place=5,
        title="Writing a block at once: Mask-Predict",
        narration=(
            "Non-autoregressive decoding writes all the tokens of a block at once, then refines: "
            "Mask-Predict re-masks the tokens it is least confident about and predicts them "
            "again, for a fixed number of iterations. Each position is predicted independently, "
            "so the block can mix two good continuations; iterations repair some of that. The "
            "output differs from greedy; the badge says how much."
        ),
        look=("the tokens re-masked and refilled at each iteration of this block."),
        rule="most_refilled",
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    family_best=True,  # Compare's "each family at its best"
    name="mask_predict",
    family="non-autoregressive",
    rank=1,
    title="Mask-Predict (lossy: parallel fill and re-mask, unverified)",
    decode=decode,
    params=PARAMS,
    # Ghazvininejad et al. 2019: T = 10 iterations over a whole target sentence with linear
    # decay; at our block size that is the full schedule, one mask fewer each iteration
    presets={"paper": {"m": 0, "T": 0}},
    lossless=False,
    sampling=False,
    check=check,
    summary="Fills m masked tokens at once, then re-predicts the least confident ones T times. Lossy: never verified.",
    # the refinement, then the mask: masks see all before them; kept tokens see no mask
    views=(
        "refinement",
        "attention_mask",
    ),
    events=("AttentionMask", "MaskPredictStep"),
    compare={
        # The same mask model with and without verification: SPACE is exact, Mask-Predict trades
        # agreement with greedy for forwards (a block of m tokens in T forwards).
        "mask guesses: verified (SPACE) vs Mask-Predict's m and T": (
            "space",
            "mask_predict:m=2:T=1",
            "mask_predict:m=5:T=1",
            "mask_predict:m=5:T=2",
            "mask_predict:m=5:T=4",
        ),
    },
)
