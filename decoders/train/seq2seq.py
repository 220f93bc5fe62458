"""The translation lab's models (decoders/seq2seq), trained from scratch on its tasks.

    python -m decoders.train seq2seq            -> assets/seq2seq/<model>.safetensors + .json

Every model of `decoders.seq2seq.training.PLAN` on the tasks' mixture (seed 0; the evaluation's
sets come from other seeds): the autoregressive teacher first, then its translations of the
training sources (sequence-level distillation) for the models that learn from them. Jobs run in
`--workers` processes of one torch thread each (one thread per process measured fastest here).
Each model's card holds its data, steps, time and held-out metrics on every task.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch
from safetensors.torch import save_file

from decoders.seq2seq import training
from decoders.seq2seq.evaluate import ASSETS, SETTINGS, evaluate
from decoders.seq2seq.models import count_parameters
from decoders.seq2seq.tasks import SHARE, TASKS, TRAIN_SEED, mixture

HELD_OUT_SEED, HELD_OUT_N = 101, 200


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=ASSETS, help="where the weights and cards go")
    ap.add_argument("--workers", type=int, default=2, help="processes, one torch thread each")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every model's steps")
    ap.add_argument("--only", default="", help="comma-separated models (default: all)")


def _distill(teacher_state: dict, kind: str) -> list:
    torch.set_num_threads(1)
    teacher = training.build("ar")
    teacher.load_state_dict(teacher_state)
    teacher.eval()
    n, k = training.DISTILLED[kind]
    return training.distill(teacher, mixture(n), batch=512, k=k)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """Train the models asked for (all of the plan by default), ship them in float16, score
    every shipped setting on held-out sets of every task, and write each model's card."""
    start = time.perf_counter()
    plan = {name: (what, data, steps) for name, what, data, steps in training.PLAN}
    only = [m for m in args.only.split(",") if m] or list(plan)
    for name in only:
        training.build(name)  # names it when unknown
    args.out.mkdir(parents=True, exist_ok=True)
    states, logs, seconds = train_all(plan, only, args)
    for name in only:  # float16, as every shipped part (the cards' rows are of these files)
        save_half(states[name], args.out / f"{name}.safetensors")
    train_minutes = round((time.perf_counter() - start) / 60, 2)
    rows = held_out_rows(args.out)
    command = "python -m decoders.train seq2seq " + " ".join(argv[1:])
    date = datetime.date.today().isoformat()
    summary = {"artifact": "seq2seq", "command": command.strip(), "train_minutes": train_minutes}
    for name in only:
        card = model_card(name, plan[name], summary, seconds, logs[name], rows, date)
        (args.out / f"{name}.json").write_text(json.dumps(card, indent=2) + "\n")
    return {
        **summary,
        "models": only,
        "seconds": seconds,
        "held_out_modes": [
            {k: r[k] for k in ("model", "decoding", "valid")} for r in rows if r["task"] == "modes"
        ],
    }


def train_all(
    plan: dict[str, tuple], only: list[str], args: argparse.Namespace
) -> tuple[dict[str, dict], dict[str, list], dict[str, float]]:
    """Run the jobs in `--workers` processes: the teacher's translations of the training sources
    as soon as the teacher is there (trained here, or the shipped one in `--out`), then the
    longest jobs whose data is ready. Returns each model's weights and training log, and each
    job's seconds (a distillation's under its data's name)."""
    data: dict[str, list] = {"mixture": mixture(training.TRAIN_PAIRS)}
    states: dict[str, dict] = {}
    logs: dict[str, list] = {}
    seconds: dict[str, float] = {}
    todo = list(only)
    if any(plan[n][1] != "mixture" for n in only) and "ar" not in only:
        from safetensors.torch import load_file

        states["ar"] = load_file(args.out / "ar.safetensors")
    kinds = {plan[n][1] for n in only} - {"mixture"}
    workers = max(1, args.workers)
    with ProcessPoolExecutor(workers) as pool:
        running: dict = {}
        begun: dict[str, float] = {}

        def launch() -> None:
            while len(running) < workers:
                # the teacher's translations as soon as the teacher is there, then the longest
                # jobs whose data is ready
                due = [k for k in sorted(kinds) if k not in begun and "ar" in states]
                if due:
                    begun[due[0]] = time.perf_counter()
                    running[pool.submit(_distill, states["ar"], due[0])] = due[0]
                    continue
                ready = [n for n in todo if plan[n][1] in data]
                if not ready:
                    return
                name = ready[0]
                todo.remove(name)
                begun[name] = time.perf_counter()
                job = pool.submit(
                    training.train_one, name, data[plan[name][1]], plan[name][2], args.scale
                )
                running[job] = name

        launch()
        while running:
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                name = running.pop(fut)
                seconds[name] = round(time.perf_counter() - begun[name], 1)
                if name in kinds:
                    data[name] = fut.result()
                else:
                    _, states[name], logs[name] = fut.result()
                print(f"{name}: {seconds[name]} s", flush=True)
            launch()
    return states, logs, seconds


def save_half(state: dict[str, torch.Tensor], path: Path) -> None:
    """The weights in float16 (integer tensors as they are), as every shipped part."""
    save_file(
        {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()},
        path,
    )


def held_out_rows(out: Path) -> list[dict]:
    """Held-out metrics of every shipped setting (those whose models are in `out`), on every
    task."""
    from decoders.seq2seq import evaluate as ev

    ev.load.cache_clear()
    settings = tuple(
        s for s in SETTINGS if ev.needs(*s) <= {p.stem for p in out.glob("*.safetensors")}
    )
    return [r for task in TASKS for r in evaluate(task, HELD_OUT_SEED, HELD_OUT_N, settings, out)]


ROW_FIELDS = ("task", "decoding", "valid", "mixed", "excess_repeats", "bleu", "passes")


def model_card(
    name: str,
    entry: tuple,
    summary: dict,
    seconds: dict[str, float],
    log: list,
    rows: list[dict],
    date: str,
) -> dict:
    """A model's card: what it is, the run's `summary`, its size, its data, its training phases
    and time, and its held-out rows (those of its own decodings)."""
    what, data, _ = entry
    model = training.build(name)
    row_model = {"nat_fertility": "nat", "depa_cold": "depa"}.get(name, name)
    return {
        "model": name,
        "what": what,
        **summary,
        "parameters": count_parameters(model),
        "data": card_data(data, seconds),
        "phases": log,
        "seconds": seconds[name],
        "threads": 1,
        "held_out": {
            "seed": HELD_OUT_SEED,
            "n": HELD_OUT_N,
            "rows": [
                {k: r[k] for k in ROW_FIELDS}
                for r in rows
                if r["model"] == row_model
                and ("fertility" in r["decoding"]) == (name == "nat_fertility")
                and ("cold" in r["decoding"]) == (name == "depa_cold")
            ],
        },
        "device": "cpu",
        "date": date,
    }


def card_data(data: str, seconds: dict[str, float]) -> dict:
    """A card's data entry: the tasks, pairs per task, the seed and what the targets are (for
    distilled data, the sources the teacher translated and how long it took)."""
    return {
        "tasks": list(TASKS),
        "pairs_per_task": {
            t: training.TRAIN_PAIRS * len(TASKS) // sum(SHARE.values()) * SHARE[t] for t in TASKS
        },
        "seed": TRAIN_SEED,
        "targets": {
            "mixture": "each source's right translations, every choice as likely",
            "distilled": "the autoregressive model's greedy translations",
            "selected": "the autoregressive model's translations from its "
            f"{training.DISTILLED['selected'][1]} likeliest first tokens (each continued "
            "greedily), the student training on the one whose tokens it finds likeliest",
        }[data],
        **(
            {
                "distilled_sources_per_task": training.DISTILLED[data][0],
                "seconds": seconds[data],
            }
            if data in training.DISTILLED
            else {}
        ),
    }
