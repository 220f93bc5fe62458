"""The target writes the corpus (decoders/train/corpus.py): user turns it samples itself from its
chat template (Magpie), its greedy answers to chat turns, and its greedy continuations of code
prompts, batched and stopping in time under a deadline."""

from __future__ import annotations

import math
import random
import re
import sys
import time

import torch
from tqdm.auto import tqdm

from decoders.core.models import ModelBundle


def chat_prefix(bundle: ModelBundle, turn: str) -> list[int]:
    return bundle.encode(turn, chat=True)


def pre_query(bundle: ModelBundle) -> list[int]:
    """The chat template up to where a user's message begins (system turn included)."""
    marker = "\x00USER\x00"
    text = bundle.tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=False
    )
    return bundle.tokenizer(text[: text.index(marker)], add_special_tokens=False).input_ids


@torch.inference_mode()
def magpie_turns(
    bundle: ModelBundle,
    n: int,
    batch: int,
    rng: random.Random,
    max_tokens: int = 80,
    until: float = math.inf,
) -> list[str]:
    """`n` distinct user messages the model writes itself when handed the template up to a user
    turn (temperature 1). A message must end on its own (EOS before `max_tokens`), have 3 to 80
    words, and differ from every kept one in its normalised text and its first six words. Fewer
    when time.perf_counter() passes `until`."""
    prefix = pre_query(bundle)
    x = torch.tensor([prefix] * batch, device=bundle.device)
    kept: list[str] = []
    seen: set[str] = set()
    tries = 0
    with tqdm(total=n, desc="user turns", file=sys.stderr) as bar:
        last = 0.0  # the last batch's seconds: a batch that would not end in time is not begun
        while len(kept) < n and tries < 4 * n and time.perf_counter() + last < until:
            began = time.perf_counter()
            torch.manual_seed(rng.randrange(2**31))
            out = bundle.model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                temperature=1.0,
                top_p=0.995,
                max_new_tokens=max_tokens,
                pad_token_id=min(bundle.eos_ids),
            )
            tries += batch
            last = time.perf_counter() - began
            for row in out[:, len(prefix) :].tolist():
                end = next((i for i, t in enumerate(row) if t in bundle.eos_ids), None)
                if end is None:
                    continue
                text = bundle.decode(row[:end]).strip()
                words = text.split()
                norm = " ".join(re.findall(r"[a-z0-9]+", text.lower()))
                first = " ".join(norm.split()[:6])
                if not 3 <= len(words) <= 80 or "<|" in text or norm in seen or first in seen:
                    continue
                seen |= {norm, first}
                kept.append(text)
                bar.update(1)
                if len(kept) == n:
                    break
    return kept


def answer(
    bundle: ModelBundle,
    turns: list[str],
    max_new_tokens: int,
    batch: int,
    desc: str,
    until: float = math.inf,
) -> list[list[int] | None]:
    """Each turn in the chat template, answered greedily by the target: template + answer ids
    (None: not reached by `until`)."""
    prompts = [chat_prefix(bundle, t) for t in turns]
    return _greedy(bundle, prompts, max_new_tokens, batch, desc, until)


def complete(
    bundle: ModelBundle,
    prompts: list[str],
    max_new_tokens: int,
    batch: int,
    until: float = math.inf,
) -> list[list[int] | None]:
    """Greedy continuations of raw-text prompts (no chat template): prompt + completion ids
    (None: not reached by `until`)."""
    ids = [bundle.encode(p, chat=False) for p in prompts]
    return _greedy(bundle, ids, max_new_tokens, batch, "code completions", until)


@torch.inference_mode()
def _greedy(
    bundle: ModelBundle,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch: int,
    desc: str,
    until: float = math.inf,
) -> list[list[int] | None]:
    """Batched greedy generation, left-padded, prompts of similar length together; results in
    the input order, each cut after its first EOS. Batches that would not end by
    time.perf_counter() `until` (as long as the last one took) are left out (None)."""
    pad = min(bundle.eos_ids)
    out: list[list[int] | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    last = 0.0  # the last batch's seconds: a batch that would not end in time is not begun
    for k in tqdm(range(0, len(order), batch), desc=desc, file=sys.stderr):
        began = time.perf_counter()
        if began + last >= until:
            break
        group = order[k : k + batch]
        width = max(len(prompts[i]) for i in group)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in group])
        mask = torch.tensor(
            [[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in group]
        )
        gen = bundle.model.generate(
            input_ids=ids.to(bundle.device),
            attention_mask=mask.to(bundle.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        for i, row in zip(group, gen[:, width:].tolist(), strict=True):
            stop = next((j + 1 for j, t in enumerate(row) if t in bundle.eos_ids), len(row))
            out[i] = prompts[i] + row[:stop]
        last = time.perf_counter() - began
    return out
