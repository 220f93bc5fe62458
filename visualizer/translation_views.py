"""The Translation lab's views (decoders/seq2seq/lab.py's `Lab`): every model's output beside the
references with the wrong tokens marked, Mask-Predict's iterations as a grid, FlowSeq's latents,
the predicted length and fertilities, the held-out metrics and quality against decoder passes.

Every model and decoding code (`nat_kd`, `npd:n=8`) is shown with its words beside it (the lab
names them). On a phone (STACK_BELOW_PX) each table row is stacked into lines, every cell led
by its column's name, so nothing needs a sideways swipe."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

RIGHT, WRONG, MASKED, REFILLED = "#1a7f37", "#cf222e", "#8c959f", "#0969da"
CSS = """
.tl table {border-collapse: collapse; font-size: 14px; width: 100%;}
.tl th, .tl td {padding: 3px 6px; border-bottom: 1px solid #d0d7de; text-align: left;
  vertical-align: top;}
.tl td.num, .tl th.num {text-align: right; white-space: nowrap;}
.tl .tok {font-family: ui-monospace, monospace; padding: 0 2px; border-radius: 3px;}
.tl td.out {white-space: nowrap;}
.tl td.setting small {color: #57606a;}
.tl .bad {background: #ffebe9; color: #cf222e; text-decoration: underline wavy #cf222e;}
.tl .ok {color: #1a7f37; font-weight: 600;}
.tl .no {color: #cf222e; font-weight: 600;}
.tl .scroll {overflow-x: auto; max-width: 100%;}
.tl .grid td {font-family: ui-monospace, monospace; text-align: center; min-width: 2.6em;}
.tl .grid td.masked {background: #eaeef2; color: #8c959f;}
.tl .grid td.refilled {background: #ddf4ff; color: #0969da; font-weight: 600;}
.tl .caption {color: #57606a; font-size: 13px; margin: 4px 0 8px;}
.tl code {font-size: 13px; background: #f6f8fa; border-radius: 3px; padding: 0 3px;}
.tl .words {color: #57606a;}
@media (max-width: 640px) {
  .tl table.stack, .tl table.stack tbody, .tl table.stack tr, .tl table.stack td,
  .tl table.stack th {display: block; width: auto;}
  .tl table.stack tr:first-child {display: none;}  /* the header: each cell names its column */
  .tl table.stack, .tl table.stack tbody {border: none;}
  .tl table.stack tr {padding: 4px 0; border: none; border-bottom: 1px solid #d0d7de;}
  .tl table.stack td {border: none; padding: 1px 2px; text-align: left; white-space: normal;}
  .tl table.stack td.num, .tl table.stack td.inline {display: inline-block; margin-right: 12px;}
  .tl table.stack td[data-label]::before {content: attr(data-label) ": "; color: #57606a;
    font-size: 12px;}
  .tl .grid tr {display: flex; flex-wrap: wrap; gap: 2px; align-items: center; border: none;}
  .tl .grid tr:first-child {display: none;}
  .tl .grid th, .tl .grid td {border: none; padding: 1px 3px; min-width: 2.2em;}
  .tl .grid td.num::before {content: "re-masked: "; color: #57606a; font-size: 12px;}
  .tl .grid th.num::before {content: "t = ";}
}
"""
STACK_BELOW_PX = 640  # the media query above: a phone's width


def _tokens(tokens: list[str], wrong: list[int] | None = None) -> str:
    bad = set(wrong or [])
    return " ".join(
        f'<span class="tok{" bad" if j in bad else ""}">{html.escape(t)}</span>'
        for j, t in enumerate(tokens)
    )


def _wrap(body: str) -> str:
    return f'<div class="tl">{body}</div>'


def _named(code: str, words: str) -> str:
    """A code with its words beside it: `npd:n=8` noisy parallel decoding, 8 candidates."""
    shown = f"<code>{html.escape(code)}</code>"
    return (
        shown
        if not words or words == code
        else f'{shown} <span class="words">{html.escape(words)}</span>'
    )


def _td(label: str, body: str, cls: str = "") -> str:
    """A cell that names its column when the table is stacked on a phone."""
    klass = f' class="{cls}"' if cls else ""
    return f'<td{klass} data-label="{html.escape(label)}">{body}</td>'


def references_html(lab: Any) -> str:
    refs = "".join(f"<li>{_tokens(r)}</li>" for r in lab.references)
    n = len(lab.references)
    return _wrap(
        f"<p><b>Source</b> ({lab.task}): {_tokens(lab.source)}</p>"
        f"<p><b>{n} right translation{'s' if n != 1 else ''}</b> (a–words are register 0, "
        "b–words register 1; a phrase's second token is b′):</p>"
        f"<ul>{refs}</ul>"
    )


def outputs_html(lab: Any) -> str:
    """One row per model and decoding: the output, its tokens that differ from the closest
    reference marked, the verdict, BLEU and decoder passes."""
    lines = []
    for r in lab.rows:
        mark = '<span class="ok">✓</span>' if r.valid else '<span class="no">✗</span>'
        lines.append(
            "<tr>"
            + _td(
                "model, decoding",
                f"{_named(r.model, r.model_words)}<br><small>"
                f"{_named(r.decoding, r.decoding_words)}</small>",
                "setting",
            )
            + _td("output", _tokens(r.tokens, r.wrong), "out")
            + _td("verdict", f"{mark} {html.escape(r.why)}", "inline")
            + _td("BLEU", f"{r.bleu:.0f}", "num")
            + _td("passes", f"{r.passes:g}", "num")
            + "</tr>"
        )
    return _wrap(
        '<div class="caption">Marked: tokens that differ from the closest right translation. '
        "Passes: decoder passes for this sentence (noisy parallel decoding and importance "
        "weighting: the candidates' pass, in one batch, and the scoring's).</div>"
        '<div class="scroll"><table class="stack"><tr><th>model, decoding</th><th>output</th>'
        '<th>verdict</th><th class="num">BLEU</th><th class="num">passes</th></tr>'
        + "".join(lines)
        + "</table></div>"
    )


def mask_predict_html(lab: Any) -> str:
    """Mask-Predict's iterations: each row the tokens after that iteration, refilled ones blue,
    the ones it re-masks for the next grey."""
    rows = []
    for t, it in enumerate(lab.mask_predict, start=1):
        cells = []
        for j, tok in enumerate(it["tokens"]):
            cls = "masked" if j in it["remasked"] else ("refilled" if j in it["refilled"] else "")
            title = f"position {j + 1} · p = {it['probs'][j]:.2f}"
            cells.append(f'<td class="{cls}" title="{title}">{html.escape(tok)}</td>')
        rows.append(
            f'<tr><th class="num">{t}</th>{"".join(cells)}'
            f'<td class="num">{len(it["remasked"])}</td></tr>'
        )
    n = len(lab.mask_predict)
    return _wrap(
        f'<div class="caption">Mask-Predict, T = {n}: every position starts masked; each '
        "iteration refills the masked positions (blue) and re-masks the ⌊L·(T−t)/T⌋ it is least "
        "sure of (grey; hover a cell for its confidence).</div>"
        '<div class="scroll"><table class="grid"><tr><th class="num">t</th>'
        + "".join(f"<th>{j + 1}</th>" for j in range(len(lab.mask_predict[0]["tokens"])))
        + '<th class="num">re-masked</th></tr>'
        + "".join(rows)
        + "</table></div>"
    )


def latents_html(lab: Any) -> str:
    """FlowSeq's latents: each drawn z, what it decodes to, and the three scores that can rank
    the candidates (the prior's, the teacher's, importance-weighted)."""
    best = {
        key: max(range(len(lab.flowseq)), key=lambda i: lab.flowseq[i][key])
        for key in ("teacher", "iw")
    }
    rows = []
    for i, z in enumerate(lab.flowseq):
        picks = [name for name, key in (("npd", "teacher"), ("iw", "iw")) if best[key] == i]
        if i == 0:
            picks.insert(0, "argmax")
        mark = '<span class="ok">✓</span>' if z["valid"] else '<span class="no">✗</span>'
        words = getattr(lab, "pick_words", {})
        rows.append(
            "<tr>"
            + _td("z", z["sample"])
            + _td("decodes to", _tokens(z["tokens"]), "out")
            + _td("right?", mark, "inline")
            + _td("log p(z|x)", f"{z['prior']:.1f}", "num")
            + _td("teacher", f"{z['teacher']:.1f}", "num")
            + _td("iw", f"{z['iw']:.1f}", "num")
            + _td("chosen by", "; ".join(_named(p, words.get(p, "")) for p in picks) or "—")
            + "</tr>"
        )
    return _wrap(
        "<div class=\"caption\">FlowSeq: f(0) is z = f(0), the flow's image of the Gaussian's "
        "centre (argmax decoding); z1… are sampled from the flow prior. log p(z|x): the prior's "
        "score of the latent; teacher: the autoregressive model's log-probability of the output "
        "(noisy parallel decoding keeps its best); iw: FlowSeq's own importance-weighted "
        "log p(y|x).</div>"
        '<div class="scroll"><table class="stack"><tr><th>z</th><th>decodes to</th><th></th>'
        '<th class="num">log p(z|x)</th><th class="num">teacher</th><th class="num">iw</th>'
        "<th>chosen by</th></tr>" + "".join(rows) + "</table></div>"
    )


def lengths_html(lab: Any) -> str:
    lengths = ", ".join(f"{n} tokens ({100 * p:.0f}%)" for n, p in lab.lengths)
    fert = " ".join(
        f'<span class="tok">{html.escape(w)}</span>×{f} <small>({100 * p:.0f}%)</small>'
        for w, f, p in lab.fertilities
    )
    return _wrap(
        f"<p><b>NAT's predicted length</b> (likeliest first): {lengths}</p>"
        f"<p><b>Fertilities</b> (how many target tokens each source word becomes): {fert}</p>"
    )


def metrics_html(rows: list[dict[str, Any]], task: str) -> str:
    if not rows:
        return _wrap("<p>No held-out metrics recorded for this task.</p>")
    seed, n = rows[0].get("seed"), rows[0].get("n")
    lines = "".join(
        "<tr>"
        + _td("model", _named(r["model"], r.get("model_words", "")))
        + _td("decoding", _named(r["decoding"], r.get("decoding_words", "")))
        + _td("valid", f"{100 * r['valid']:.1f}%", "num")
        + _td("mixed", f"{100 * r['mixed']:.1f}%", "num")
        + _td("excess repeats", f"{r['excess_repeats']:.2f}", "num")
        + _td("BLEU", f"{r['bleu']:.1f}", "num")
        + _td("passes", f"{r['passes']:g}", "num")
        + "</tr>"
        for r in rows
    )
    return _wrap(
        f'<div class="caption">Held-out sentences of task <b>{html.escape(task)}</b> (seed {seed}, '
        f"{n} sentences; recorded when the models were trained). valid: equal to one right "
        "translation; mixed: combines registers or orders; excess repeats: adjacent repeats per "
        "sentence beyond the references' own.</div>"
        '<div class="scroll"><table class="stack"><tr><th>model</th><th>decoding</th>'
        '<th class="num">valid</th>'
        '<th class="num">mixed</th><th class="num">excess repeats</th><th class="num">BLEU</th>'
        '<th class="num">passes</th></tr>' + lines + "</table></div>"
    )


COLOURS = {
    "ar": "#1f77b4",
    "nat": "#d62728",
    "nat_kd": "#ff7f0e",
    "cmlm": "#2ca02c",
    "flowseq": "#9467bd",
    "depa": "#8c564b",
}


def quality_chart(rows: list[dict[str, Any]], task: str, width: int | None = None) -> go.Figure:
    """Valid share against decoder passes per sentence, one marker per model and decoding."""
    fig = go.Figure()
    for model in COLOURS:
        mine = [r for r in rows if r["model"] == model]
        if not mine:
            continue
        fig.add_trace(
            go.Scatter(
                x=[r["passes"] for r in mine],
                y=[100 * r["valid"] for r in mine],
                mode="markers+lines" if model == "cmlm" else "markers",
                name=f"{model}: {mine[0].get('model_words', model)}",
                marker={"size": 11, "color": COLOURS[model]},
                text=[f"{r['decoding']} ({r.get('decoding_words', r['decoding'])})" for r in mine],
                hovertemplate="%{fullData.name} %{text}<br>%{x:g} passes, %{y:.1f}% valid"
                "<extra></extra>",
            )
        )
    fig.update_layout(
        title={"text": f"Quality against decoder passes ({task})", "x": 0.01},
        xaxis={
            "title": "decoder passes per sentence",
            "type": "log",
            "range": [-0.1, 1.12],  # 0.8 … 13 passes
            "tickvals": [1, 2, 4, 10],
        },
        yaxis={"title": "valid translations (%)", "range": [-3, 103]},
        # the legend in a strip of its own at the foot (a row per entry on a phone), the
        # figure grown by it, so the plot keeps its height
        height=300 + 24 * len(fig.data),
        margin={"l": 60, "r": 10, "t": 50, "b": 10},
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        **({"width": width} if width else {}),
    )
    return fig
