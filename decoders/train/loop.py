"""One training loop for every trained part: AdamW, linear warm-up then cosine decay, gradient
clipping, a tqdm bar per epoch, held-out metrics after each epoch, and resumable checkpoints
(model, optimiser, schedule, position in the epoch) so a run cut short continues where it was."""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, load_file
from torch import nn
from tqdm.auto import tqdm

Batch = Any
LossFn = Callable[[Batch], dict[str, torch.Tensor]]  # must hold "loss"; other entries are logged


def add_loop_arguments(
    ap: argparse.ArgumentParser, epochs: int, lr: float, batch_size: int
) -> None:
    g = ap.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=epochs)
    g.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    g.add_argument("--batch-size", type=int, default=batch_size, help="spans per step")
    g.add_argument("--warmup", type=float, default=0.05, help="share of steps warming up")
    g.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="train this many steps (0: all; the schedule fits them)",
    )
    g.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="a time budget: train only as many steps as fit in about this many minutes, timed "
        "over the first steps, with the schedule fitted to them (evaluation comes on top; "
        "0: no budget). For a lent GPU's few minutes, or a smaller CPU run",
    )
    g.add_argument("--held-out", type=float, default=0.05, help="share of documents held out")
    g.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    g.add_argument(
        "--out", type=Path, default=None, help="where the artifact goes (default: assets/)"
    )
    g.add_argument(
        "--init",
        default=None,
        help="start from an artifact's weights (a warm start: more epochs on top of a shipped "
        "one): a file, or git:REV:PATH for the file as committed, so the start stays reproducible",
    )


def init_weights(spec: str) -> dict[str, torch.Tensor]:
    """An artifact's tensors from a file, or from `git:REV:PATH` (the file as committed at REV)."""
    from decoders.trained.artifacts import from_int8

    if not spec.startswith("git:"):
        return from_int8(load_file(spec))
    rev, _, path = spec[4:].partition(":")
    shown = subprocess.run(
        ["git", "show", f"{rev}:{path}"],
        capture_output=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    if shown.returncode:
        raise SystemExit(f"--init {spec}: {shown.stderr.decode().strip()}")
    return from_int8(load(shown.stdout))


def short(t: torch.Tensor, n: int = 8) -> str:
    """A tensor for an error message: its first values, and how many there are."""
    values = t.flatten().tolist()
    return (
        str(values)
        if len(values) <= n
        else f"[{', '.join(map(str, values[:n]))}, …] ({len(values)})"
    )


def warm_start(module: nn.Module, spec: str | None) -> None:
    """Load `--init`'s weights into `module`, all but the buffers counted on the corpus (the
    module's `FROM_CORPUS`, by default the draft vocabulary: this run rebuilt them from its own
    corpus); the module's `GROWN` parts may be missing from it (an EAGLE-1 head grown into an
    EAGLE-3 one: its fusion starts as the identity on the final features); an artifact of another
    shape or kind is refused, and so is one whose other buffers (its configuration: Kangaroo's
    exit layer, the exits' layers, SPACE's k, rank and alpha) differ from this run's."""
    if not spec:
        return
    rebuilt = getattr(module, "FROM_CORPUS", ("vocab",))
    grown = getattr(module, "GROWN", ())  # parts an older artifact may lack: they keep their init
    weights = {k: v for k, v in init_weights(spec).items() if k not in rebuilt}
    own = module.state_dict()
    wrong = [k for k, v in weights.items() if k not in own or own[k].shape != v.shape]
    missing = [k for k in own if k not in weights and k not in rebuilt and k not in grown]
    if wrong or missing:
        raise SystemExit(
            f"--init {spec}: not this artifact's shape (unexpected or resized: {wrong[:4]}, "
            f"missing: {missing[:4]})"
        )
    buffers = {name for name, _ in module.named_buffers()}
    for k, v in weights.items():
        if k in buffers and not torch.equal(v.to(own[k].device, own[k].dtype), own[k]):
            raise SystemExit(f"--init {spec}: its {k} is {short(v)}, this run's {short(own[k])}")
    module.load_state_dict(weights, strict=False)


@dataclass
class _Run:
    """Where one `Loop.fit` stands: its optimiser and schedule, the steps done and planned (a
    time budget may cut `total` and `warm` mid-run: the schedule reads them at every step), the
    per-epoch history, and its clock."""

    opt: torch.optim.Optimizer
    total: int
    warm: int
    sched: Any = None
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    minutes_before: float = 0.0  # spent before a resumption
    t0: float = 0.0  # the clock when this process began training
    first: int = 0  # the step this process began at
    timed_from: float = 0.0  # the clock after this process's first step (the budget's timing)


def _schedule(run: _Run) -> Callable[[int], float]:
    """The learning rate's factor at a step: linear warm-up over `run.warm` steps, then a cosine
    decay to 0 at `run.total` (read at each step, so a time budget's cut reshapes it). A plain
    function, so the scheduler's checkpoint holds no copy of it."""

    def factor(step: int) -> float:
        warm, total = run.warm, run.total
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))

    return factor


@dataclass
class Loop:
    epochs: int
    lr: float
    warmup: float = 0.05
    weight_decay: float = 0.0
    clip: float = 0.5
    max_steps: int = 0
    minutes: float = 0.0  # a time budget for the training steps (0: none); see `_fit_budget`
    checkpoint: Path | None = None
    resume: bool = False
    checkpoint_every: int = 200
    seed: int = 0
    desc: str = "training"
    clock: Callable[[], float] = time.perf_counter  # seconds; the budget's and the card's
    # Peak learning rate per parameter-name prefix, where one part must move faster than the rest
    # (SPACE's full SFT: a new [MASK] embedding beside pretrained weights).
    lr_for: dict[str, float] = field(default_factory=dict)

    def fit(
        self,
        module: nn.Module,
        batches: Sequence[Batch],
        loss_fn: LossFn,
        evaluate: Callable[[], dict[str, float]],
        on_epoch: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Train `module`'s trainable parameters on `batches` (shuffled each epoch with the seed,
        so a resumed run replays the same order). Returns the last held-out metrics, the steps,
        the minutes, and the per-epoch history."""
        per_epoch = len(batches)
        run = self._begin(module, per_epoch)
        params = [p for p in module.parameters() if p.requires_grad]
        module.train()
        while run.step < run.total:
            epoch, done = divmod(run.step, per_epoch)
            order = list(range(per_epoch))
            random.Random(self.seed * 1000 + epoch).shuffle(order)
            bar = tqdm(
                order[done : min(per_epoch, done + run.total - run.step)],
                desc=f"{self.desc} epoch {epoch + 1}/{self.epochs}",
                file=sys.stderr,
            )
            for i in bar:
                out = self._step(run, params, loss_fn, batches[i])
                if self.minutes:
                    self._keep_to_budget(run)
                if run.step % 10 == 0:
                    bar.set_postfix({k: f"{float(v.detach()):.3f}" for k, v in out.items()})
                if self.checkpoint_every and run.step % self.checkpoint_every == 0:
                    self._save(module, run)
                if run.step >= run.total:
                    break
            if run.step % per_epoch == 0 or run.step == run.total:
                self._end_epoch(module, run, epoch, evaluate, on_epoch)
        module.eval()
        return {
            "held_out": run.history[-1] if run.history else {},
            "steps": run.step,
            "minutes": self._minutes(run),
            "history": run.history,
        }

    def _begin(self, module: nn.Module, per_epoch: int) -> _Run:
        """The run's length, its AdamW (a parameter group per peak learning rate) and schedule,
        resumed from the checkpoint when asked; the clock starts here."""
        groups: dict[float, list[nn.Parameter]] = {}
        for name, p in module.named_parameters():
            if p.requires_grad:
                lr = next((v for k, v in self.lr_for.items() if name.startswith(k)), self.lr)
                groups.setdefault(lr, []).append(p)
        total = self.epochs * per_epoch
        if self.max_steps:
            total = min(total, self.max_steps)
        opt = torch.optim.AdamW(
            [{"params": ps, "lr": lr} for lr, ps in groups.items()],
            lr=self.lr,
            weight_decay=self.weight_decay,
            betas=(0.9, 0.95),
        )
        run = _Run(opt, total, max(1, int(total * self.warmup)))
        run.sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(run))
        if self.resume and self.checkpoint and self.checkpoint.is_file():
            self._resume(module, run)
        run.t0, run.first = self.clock(), run.step
        return run

    def _resume(self, module: nn.Module, run: _Run) -> None:
        """Continue from the checkpoint: weights, optimiser, schedule, position, history, time
        spent and the random generators' states."""
        saved = torch.load(self.checkpoint, weights_only=False)
        module.load_state_dict(saved["module"])
        run.opt.load_state_dict(saved["opt"])
        run.sched.load_state_dict(saved["sched"])
        run.step, run.history = saved["step"], saved["history"]
        run.minutes_before = saved.get("minutes", 0.0)
        if "rng" in saved:  # the noise a loss draws continues as if never interrupted
            torch.set_rng_state(saved["rng"])
        if saved.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        print(f"resumed at step {run.step}/{run.total} from {self.checkpoint}", file=sys.stderr)

    def _step(
        self, run: _Run, params: list[nn.Parameter], loss_fn: LossFn, batch: Batch
    ) -> dict[str, torch.Tensor]:
        """One optimiser step on `batch` (gradients clipped, the schedule advanced); the loss's
        entries, for the bar."""
        out = loss_fn(batch)
        run.opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        if self.clip:
            nn.utils.clip_grad_norm_(params, self.clip)
        run.opt.step()
        run.sched.step()
        run.step += 1
        return out

    def _keep_to_budget(self, run: _Run) -> None:
        """`minutes`: time the steps after the first, then fit the run's length (and its
        schedule) to the time left; stop once the minutes are spent."""
        if run.step == run.first + 1:
            run.timed_from = self.clock()  # the first step pays for warming up
        if run.step == run.first + 1 + CALIBRATION_STEPS:
            began = run.t0 - 60 * run.minutes_before
            run.total = _fit_budget(self, run.step, run.total, began, run.timed_from)
            run.warm = min(run.warm, max(1, int(run.total * self.warmup)))
        elif self._minutes(run) > self.minutes:
            run.total = run.step  # over budget (evaluations, a slower pace): stop here, scored

    def _end_epoch(
        self,
        module: nn.Module,
        run: _Run,
        epoch: int,
        evaluate: Callable[[], dict[str, float]],
        on_epoch: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        """Score the held-out set (eval mode, no gradients), record it, checkpoint, and hand the
        score to `on_epoch`."""
        module.eval()
        with torch.no_grad():
            score = evaluate()
        module.train()
        run.history.append({"epoch": epoch + 1, "step": run.step, **score})
        print(f"{self.desc} epoch {epoch + 1}: held-out {score}", file=sys.stderr)
        self._save(module, run)
        if on_epoch:
            on_epoch({"held_out": score, "steps": run.step, "minutes": self._minutes(run)})

    def _minutes(self, run: _Run) -> float:
        """Minutes spent training, those before a resumption included."""
        return round(run.minutes_before + (self.clock() - run.t0) / 60, 2)

    def _save(self, module: nn.Module, run: _Run) -> None:
        """Write the checkpoint (atomically: a temporary file, then renamed), if there is one."""
        if not self.checkpoint:
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "module": module.state_dict(),
            "opt": run.opt.state_dict(),
            "sched": run.sched.state_dict(),
            "step": run.step,
            "history": run.history,
            "minutes": self._minutes(run),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        torch.save(state, self.checkpoint.with_suffix(".tmp"))
        self.checkpoint.with_suffix(".tmp").replace(self.checkpoint)


CALIBRATION_STEPS = 8  # steps timed before a time budget fixes the run's length


def _fit_budget(loop: Loop, step: int, total: int, t0: float, timed_from: float) -> int:
    """The run's length under `loop.minutes`: the steps done, plus as many as fit in the time
    left (`t0`: when the run began, before any resumption) at the pace of the last
    CALIBRATION_STEPS (never more than `total`). The loop also stops once the time is spent."""
    pace = (loop.clock() - timed_from) / CALIBRATION_STEPS
    left = loop.minutes * 60 - (loop.clock() - t0)
    fitted = min(total, step + max(0, int(left / pace)))
    print(
        f"{loop.desc}: {pace:.2f} s per step, {fitted} steps fit in {loop.minutes:g} min "
        f"(of {total})",
        file=sys.stderr,
    )
    return fitted


def run_fields(args: argparse.Namespace, prep: Any, result: dict[str, Any]) -> dict[str, Any]:
    """The card entries every trained artifact shares: time, steps, epochs, learning rate, the
    warm start and the time budget (when one was set)."""
    init = getattr(args, "init", None)
    return {
        "train_minutes": result["minutes"],
        "build_minutes": round(prep.seconds / 60, 1),
        "epochs": args.epochs,
        "steps": result["steps"],
        "lr": args.lr,
        "init": str(init) if init else None,
        **({"minutes_budget": args.minutes} if getattr(args, "minutes", 0) else {}),
    }


def fit_artifact(
    module: nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    evaluate: Callable[[], dict[str, float]],
    *,
    args: argparse.Namespace,
    prep: Any,
    name: str,
    argv: list[str],
    out: Path,
    fields: Callable[[dict[str, Any]], dict[str, Any]],
    desc: str,
) -> dict[str, Any]:
    """Train `module` with the Loop (its checkpoint in the cache, named after `out`) and write the
    artifact with its card after every epoch and at the end: `fields(result)` gives the card's
    artifact-specific entries; the time, steps, epochs and learning rate are added here."""
    from decoders.train.states import card, checkpoint_path
    from decoders.trained.artifacts import save_artifact

    warm_start(module, args.init)

    def write(result: dict[str, Any]) -> None:
        common = run_fields(args, prep, result)
        save_artifact(module, out, card(prep, name, argv, **fields(result), **common))

    loop = Loop(
        epochs=args.epochs,
        lr=args.lr,
        warmup=args.warmup,
        max_steps=args.max_steps,
        minutes=args.minutes,
        checkpoint=checkpoint_path(out),
        resume=args.resume,
        seed=args.seed,
        desc=desc,
    )
    result = loop.fit(module, batches, loss_fn, evaluate, on_epoch=write)
    write(result)
    return result
