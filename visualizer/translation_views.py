"""The Translation lab's views (decoders/seq2seq/lab.py's `Lab`): every model's output beside the
references with the wrong tokens marked, Mask-Predict's iterations as a grid, FlowSeq's latents,
the predicted length and fertilities, the held-out metrics and quality against decoder passes."""

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
"""


def _tokens(tokens: list[str], wrong: list[int] | None = None) -> str:
    bad = set(wrong or [])
    return " ".join(
        f'<span class="tok{" bad" if j in bad else ""}">{html.escape(t)}</span>'
        for j, t in enumerate(tokens)
    )


def _wrap(body: str) -> str:
    return f'<div class="tl">{body}</div>'


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
            f'<tr><td class="setting">{html.escape(r.model)}<br>'
            f"<small>{html.escape(r.decoding)}</small></td>"
            f'<td class="out">{_tokens(r.tokens, r.wrong)}</td>'
            f"<td>{mark} {html.escape(r.why)}</td>"
            f'<td class="num">{r.bleu:.0f}</td><td class="num">{r.passes:g}</td></tr>'
        )
    return _wrap(
        '<div class="caption">Marked: tokens that differ from the closest right translation. '
        "Passes: decoder passes for this sentence (noisy parallel decoding and importance "
        "weighting: the candidates' pass, in one batch, and the scoring's).</div>"
        '<div class="scroll"><table><tr><th>model, decoding</th><th>output</th>'
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
            title = f"p = {it['probs'][j]:.2f}"
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
        rows.append(
            f"<tr><td>{z['sample']}</td><td class='out'>{_tokens(z['tokens'])}</td><td>{mark}</td>"
            f'<td class="num">{z["prior"]:.1f}</td><td class="num">{z["teacher"]:.1f}</td>'
            f'<td class="num">{z["iw"]:.1f}</td><td>{", ".join(picks)}</td></tr>'
        )
    return _wrap(
        "<div class=\"caption\">FlowSeq: f(0) is z = f(0), the flow's image of the Gaussian's "
        "centre (argmax decoding); z1… are sampled from the flow prior. log p(z|x): the prior's "
        "score of the latent; teacher: the autoregressive model's log-probability of the output "
        "(noisy parallel decoding keeps its best); iw: FlowSeq's own importance-weighted "
        "log p(y|x).</div>"
        '<div class="scroll"><table><tr><th>z</th><th>decodes to</th><th></th>'
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
        f"<tr><td>{html.escape(r['model'])}</td><td>{html.escape(r['decoding'])}</td>"
        f'<td class="num">{100 * r["valid"]:.1f}%</td><td class="num">{100 * r["mixed"]:.1f}%</td>'
        f'<td class="num">{r["excess_repeats"]:.2f}</td><td class="num">{r["bleu"]:.1f}</td>'
        f'<td class="num">{r["passes"]:g}</td></tr>'
        for r in rows
    )
    return _wrap(
        f'<div class="caption">Held-out sentences of task <b>{html.escape(task)}</b> (seed {seed}, '
        f"{n} sentences; recorded when the models were trained). valid: equal to one right "
        "translation; mixed: combines registers or orders; excess repeats: adjacent repeats per "
        "sentence beyond the references' own.</div>"
        '<div class="scroll"><table><tr><th>model</th><th>decoding</th><th class="num">valid</th>'
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
                name=model,
                marker={"size": 11, "color": COLOURS[model]},
                text=[r["decoding"] for r in mine],
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
        height=380,
        margin={"l": 60, "r": 10, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.22},
        **({"width": width} if width else {}),
    )
    return fig
