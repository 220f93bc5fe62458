"""Training the translation models: Adam on batches of (source, target) pairs, one torch thread
(on a busy 2-core box two threads were measured 36x slower per step than one)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import torch

from .models import MAX_TARGET, Seq2Seq, sources

Pair = tuple[tuple[int, ...], tuple[int, ...]]


def fit(
    model: Seq2Seq,
    pairs: Sequence[Pair],
    steps: int,
    batch: int = 64,
    # `modes`, 1,500 steps, batch 64: the AR's greedy output 97% and 83% valid in two runs at
    # 3e-3 (44% at 2e-3)
    lr: float = 3e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Train `model` for `steps` batches drawn from `pairs`; returns the last loss and the time."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(steps, 1))
    model.train()
    start, loss = time.perf_counter(), torch.tensor(0.0)
    for _ in range(steps):
        chunk = [pairs[rng.randrange(len(pairs))] for _ in range(batch)]
        src, targets = sources([s for s, _ in chunk]), [t for _, t in chunk]
        if targets and targets[0] and isinstance(targets[0][0], tuple):
            targets = model.choose(src, targets)  # several candidates each: select one
        loss = model.loss(src, targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return {
        "loss": round(float(loss.detach()), 4),
        "seconds": round(time.perf_counter() - start, 1),
    }


@torch.no_grad()
def distill(teacher, pairs: Sequence[Pair], batch: int = 256, k: int = 1) -> list:
    """Sequence-level knowledge distillation (Kim & Rush 2016, as Gu et al. train the NAT): the
    same sources, each target replaced by the teacher's greedy translation. A teacher picks one
    register and one order per source, so the data a student sees has one mode per source.

    With `k` > 1, each source keeps the teacher's translations from its `k` likeliest first
    tokens (`AR.nbest`), and
    the student trains on the one it finds likeliest itself (reference selection, `NAT.choose`,
    as Shao et al. 2022 distil a NAT): the teacher's pick of a mode is an arbitrary function of
    the source that a one-pass student learns only in part; its own pick it can predict."""
    out: list = []
    for i in range(0, len(pairs), batch):
        chunk = [s for s, _ in pairs[i : i + batch]]
        if k > 1:
            for s, cands in zip(chunk, teacher.nbest(sources(chunk), k), strict=True):
                cands = tuple(c for c in cands if len(c) <= MAX_TARGET)
                if cands:
                    out.append((s, cands))
            continue
        translated, _ = teacher.greedy(sources(chunk))
        # an output that never ended (longer than any target) is no target
        out += [(s, t) for s, t in zip(chunk, translated, strict=True) if 0 < len(t) <= MAX_TARGET]
    return out


# --- every model, as `python -m decoders.train seq2seq` ships them ------------------------------

# (name, what it is, its data, steps per phase); the data: "mixture" (the tasks' own pairs),
# "distilled" (the teacher's greedy translations) or "selected" (the teacher's KD candidates, the
# student picking among them: `distill(k=KD_CANDIDATES)`)
PLAN: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    # the longest first: two processes finish together
    ("ar", "autoregressive Transformer (the teacher)", "mixture", (2500,)),
    ("flowseq", "FlowSeq", "mixture", (2000,)),
    ("nat", "vanilla NAT, uniform copy", "mixture", (1500,)),
    ("nat_fertility", "vanilla NAT, fertilities", "mixture", (1500,)),
    ("cmlm", "CMLM (Mask-Predict)", "mixture", (1500,)),
    ("nat_kd", "NAT distilled from the teacher, with reference selection", "selected", (1500,)),
    # DePA's NAT phase as long as cold's, its pre-training on top, as the paper's precedes it
    ("depa", "DePA: left-to-right, right-to-left, then NAT", "distilled", (300, 300, 2000)),
    ("depa_cold", "DePA's decoder trained as a NAT only", "distilled", (2000,)),
)
TRAIN_PAIRS = 20000  # per task, before SHARE
# sources the teacher translates, per task before SHARE: one translation each, or KD_CANDIDATES
DISTILLED = {"distilled": (10000, 1), "selected": (2500, 4)}


def build(name: str) -> Seq2Seq:
    """An untrained model of the plan's `name`."""
    from .depa import DePA
    from .flowseq import FlowSeq
    from .models import AR, CMLM, NAT

    makers = {
        "ar": AR,
        "nat": NAT,
        "nat_fertility": lambda: NAT(inputs="fertility"),
        "cmlm": CMLM,
        "flowseq": FlowSeq,
        "nat_kd": NAT,
        "depa": DePA,
        "depa_cold": DePA,
    }
    if name not in makers:
        raise ValueError(f"unknown translation model {name!r}; the models are {', '.join(makers)}")
    return makers[name]()


def train_one(name: str, pairs: Sequence[Pair], steps: tuple[int, ...], scale: float = 1.0):
    """Train the plan's `name` (one torch thread); its weights, and what the card says."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(name)
    phases = ("l2r", "r2l", "nat") if name == "depa" else ("nat",) * len(steps)
    logs = []
    for phase, n in zip(phases, steps, strict=True):
        if hasattr(model, "phase"):
            model.phase = phase
        n = max(1, round(n * scale))
        logs.append({"phase": phase, "steps": n, **fit(model, pairs, n)})
    return name, {k: v.detach().clone() for k, v in model.state_dict().items()}, logs
