"""The benchmark's outputs: the markdown table, results.json, the speedup and quality charts,
the quality points the Run tab draws against, and the summary the explainers quote
(assets/bench/NAME.json, read by decoders/core/facts.py).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from decoders.core.prices import recorded_prices
from decoders.specs import parse_method


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
    """The run as the markdown table the benchmark prints and writes to table.md."""

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
        "| draft forwards / step | draft work / step | identical to greedy |",
        f"|---|---:|---:|{runs_column[1]}---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        runs = r.get("speedup_runs")
        each = " / ".join(f"{x:.2f}" for x in runs) + " | " if runs else ""
        lines.append(
            f"| {r['contestant']} | {r['tokens_per_s']:.2f} | {fmt(r.get('speedup'))}× | {each}"
            f"{fmt(r.get('modelled_speedup'))}{'×' if r.get('modelled_speedup') else ''} | "
            f"{fmt(r.get('tokens_per_target_forward'))} | {fmt(r.get('mean_acceptance_length'))} | "
            f"{fmt(r.get('draft_acceptance_rate'), '.0%')} | "
            f"{fmt(r.get('draft_forwards_per_step'))} | {fmt(r.get('draft_work_per_step'), '.3f')} | "
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
    """results.json, table.md, quality_points.json (lossy rows) and the charts, into `out_dir`."""
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
                "method": parse_method(r["contestant"])[0],
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
