"""Visualizer functions on hand-written traces: no model, no server."""

import re

import plotly.graph_objects as go

from decoders import METHODS
from decoders.core.events import Commit, Done, Draft, Forward, Prefill, TopK, Verify
from decoders.core.stats import compute_stats
from visualizer import (
    acceptance_by_position,
    acceptance_histogram,
    forward_timeline,
    method_panel,
    metrics_html,
    token_spans_html,
    tokens_per_step,
)
from visualizer.panels import MAX_EXTRA_PANELS
from visualizer.text import add_caption, cut, short_token, token_hover, wrap
from visualizer.tokens import COLOURS, lossless_badge_html

TEXTS = {1: "<s>", 10: "def", 11: " f", 12: "(x", 13: "):", 14: "\n", 15: " return", 99: "<b>"}

AR = [
    Prefill((1,)),
    Forward(0, "prefill", 1, 30, 60.0),
    TopK(0, 0, (10, 99), (0.8, 0.1)),
    Commit(0, (10,), ("target",), (0.8,)),
    Forward(1, "target", 1, 30, 55.0),
    TopK(1, 1, (11, 12), (0.6, 0.3)),
    Commit(1, (11,), ("target",), (0.6,)),
    Forward(2, "target", 1, 30, 50.0),
    TopK(2, 2, (99, 12), (0.5, 0.4)),
    Commit(2, (99,), ("target",), (0.5,)),
]
AR.append(Done("length", compute_stats(AR)))

SPEC = [
    Prefill((1,)),
    Forward(0, "prefill", 1, 30, 60.0),
    Commit(0, (10,), ("target",), (0.9,)),
    Forward(1, "draft", 1, 8, 10.0),
    Draft(1, "self:8", (11, 12, 13), (-1, 0, 1), (0.9, 0.7, 0.4)),
    Forward(1, "verify", 4, 30, 80.0),
    Verify(1, (0, 1), 14, "greedy-chain"),
    Commit(1, (11, 12, 14), ("draft", "draft", "correction"), (0.9, 0.8, 0.7)),
    Forward(2, "target", 1, 30, 20.0),
    Commit(2, (15,), ("target",), (0.95,)),
]
SPEC.append(Done("length", compute_stats(SPEC)))


def test_token_spans_colour_escape_and_hover():
    html = token_spans_html(SPEC, TEXTS)
    assert len(re.findall(r'class="dl-tok[" ]', html)) == 5
    assert (
        f"background:{COLOURS['draft']}" in html and f"background:{COLOURS['correction']}" in html
    )
    assert f"background:{COLOURS['target']}" in html  # the target's own token
    assert "↵" in html  # a newline token stays visible
    assert "<b>" not in token_spans_html(AR, TEXTS).split("dl-tokens")[1]  # token text is escaped
    assert "id 11 · step 1 · p=0.900" in html
    assert "accepted draft" in html and "corrected by target" in html  # legend for what appears


def test_token_spans_at_a_step_grey_out_the_future():
    html = token_spans_html(AR, TEXTS, upto_step=1)
    assert html.count('class="dl-tok dl-pending"') == 1  # step 2 is still to come
    assert html.count('class="dl-tok dl-now"') == 1  # step 1 is underlined
    assert token_spans_html([], TEXTS).count("no tokens yet") == 1


def test_timeline_has_lanes_axes_and_stops_at_step():
    fig = forward_timeline(SPEC)
    assert isinstance(fig, go.Figure)
    assert {t.name for t in fig.data} == {"prefill", "draft", "verify", "target"}
    assert fig.layout.xaxis.title.text == "time since start (ms)"
    assert fig.layout.yaxis.title.text == "pass"
    assert sum(len(t.x) for t in forward_timeline(SPEC, upto_step=1).data) == 3
    bases = [b for t in fig.data for b in t.base]
    assert sorted(bases) == [0.0, 60.0, 70.0, 150.0]  # bars laid end to end in time order


def test_tokens_per_step_stacks_origins():
    fig = tokens_per_step(SPEC)
    by_name = {t.name: list(t.y) for t in fig.data}
    assert by_name["accepted draft"] == [0, 2, 0]
    assert by_name["corrected by target"] == [0, 1, 0]
    assert fig.layout.yaxis.title.text == "tokens"  # short: the axis can be short on a phone


def test_acceptance_figures():
    stats = SPEC[-1].stats
    hist = acceptance_histogram(stats)
    assert list(hist.data[0].y) == [0, 0, 1] and hist.layout.xaxis.title.text
    pos = acceptance_by_position(stats)
    assert list(pos.data[0].y) == [1.0, 1.0, 0.0]
    empty = acceptance_histogram(AR[-1].stats)
    assert "no drafts" in empty.layout.annotations[0].text


def test_topk_panel_marks_the_chosen_token():
    fig = method_panel(METHODS["autoregressive"].views, AR, TEXTS, 1)
    bar = fig.data[0]
    assert list(bar.x) == [0.6, 0.3]
    assert bar.marker.color[0] != bar.marker.color[1]
    assert fig.layout.title.text == "Step 1: top-2 candidates"
    assert "chosen: dark green" in fig.layout.title.subtitle.text.replace("<br>", " ")
    # each bar's number is its token's id, said so (a bare "(11)" read as a count)
    assert list(bar.y) == ["' f'<br>token id 11", "'(x'<br>token id 12"]
    assert "token id" in bar.hovertemplate or "%{y}" in bar.hovertemplate
    assert (
        "no top-k"
        in method_panel(METHODS["autoregressive"].views, SPEC, TEXTS, 1).layout.annotations[0].text
    )


def test_metrics_and_badges():
    html = metrics_html(SPEC[-1].stats, {"status": "identical", "compared": 5})
    assert "tokens / target forward" in html and "✓ identical to greedy (5 tokens)" in html
    assert "✗ differs from greedy at token 3" in lossless_badge_html(
        {"status": "differs", "first_divergence": 3}
    )
    assert lossless_badge_html(None) == ""
    rare = metrics_html({"draft_acceptance_rate": 0.003, "mean_acceptance_length": 1.05})
    assert ">&lt;1%<" in rare  # above zero never reads as 0 %
    assert ">0%<" in metrics_html({"draft_acceptance_rate": 0.0})
    # a tree's low rate beside a long acceptance is explained with the run's own numbers
    tree = {"draft_acceptance_rate": 0.09, "mean_acceptance_length": 2.4}
    tree |= {"verify_steps": 10, "drafted_tokens": 155}
    assert "Only 9% of drafted tokens were accepted, yet each verify step wrote 2.40" in (
        metrics_html(tree)
    )
    assert "15.5 tokens each" in metrics_html(tree)
    assert "Only" not in metrics_html({**tree, "draft_acceptance_rate": 0.7})


def test_draft_panel_colours_accepted_rejected_and_the_correction():
    from visualizer import draft_panel

    fig = draft_panel(SPEC, TEXTS, 1)
    draft, target = fig.data
    assert list(draft.marker.color) == [COLOURS["draft"], COLOURS["draft"], COLOURS["rejected"]]
    assert list(target.marker.color) == [COLOURS["draft"], COLOURS["draft"], COLOURS["correction"]]
    assert fig.layout.title.text == "Step 1: self:8"  # the drafter; what it did underneath
    assert "drafted 3, accepted 2" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "plain target step" in draft_panel(SPEC, TEXTS, 2).layout.annotations[0].text


def test_titles_fit_a_phone_and_legends_sit_below_the_plot():
    """Every figure's title is short, details go in a subtitle, and the legend has its own strip
    at the bottom of the figure (a wrapping legend then never runs into the title)."""
    from visualizer import acceptance_panel, draft_panel, forward_timeline, tokens_per_step

    stats = {"acceptance_histogram": [1, 0, 2], "acceptance_by_position": [0.67, 0.5] * 5}
    figures = [
        forward_timeline(SPEC),
        tokens_per_step(SPEC),
        acceptance_panel(stats),
        draft_panel(SPEC, TEXTS, 1),
        method_panel(METHODS["autoregressive"].views, AR, TEXTS, 1),
    ]
    for fig in figures:
        assert len(fig.layout.title.text) <= 40
        assert fig.layout.title.automargin and fig.layout.title.yref == "container"
        assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0
        assert fig.layout.modebar.orientation == "v"  # the toolbar stays clear of the title
        for line in (fig.layout.title.subtitle.text or "").split("<br>"):
            assert len(line) <= 48


def test_acceptance_panel_shows_histogram_and_rate_per_position():
    from visualizer import acceptance_panel

    stats = {"acceptance_histogram": [1, 0, 2], "acceptance_by_position": [0.67, 0.5]}
    fig = acceptance_panel(stats)
    assert [list(t.y) for t in fig.data] == [[1, 0, 2], [0.67, 0.5]]
    assert list(fig.data[1].x) == [1, 2]
    # Stacked (each full width, readable on a phone); each plot's subplot title says what it
    # counts, so no y-axis title sits between them.
    assert fig.layout.yaxis.domain[0] > fig.layout.yaxis2.domain[1]
    assert [a.text for a in fig.layout.annotations] == [
        "steps, by drafts accepted in the step",
        "acceptance rate, by draft position",
    ]
    assert not fig.layout.yaxis.title.text and not fig.layout.yaxis2.title.text
    assert fig.layout.xaxis2.dtick == 1  # every draft position labelled
    empty = acceptance_panel({"acceptance_histogram": []})
    assert not empty.data and "no drafts" in empty.layout.annotations[0].text
    # Mask-Predict keeps mask fills nobody verified: the panel says so, not "one target token".
    lossy = acceptance_panel({"acceptance_histogram": [], "origins": {"target": 4, "mask": 8}})
    text = lossy.layout.annotations[0].text.replace("<br>", " ")
    assert "nothing verified: mask tokens" in text and "one target token" not in text


def test_every_methods_extra_views_fit_the_pages_slots():
    assert all(len(m.views) - 1 <= MAX_EXTRA_PANELS for m in METHODS.values())


def test_token_labels_show_whitespace_cut_and_escape():
    assert short_token("a\tb\nc", 6) == "a⇥b↵c"
    assert short_token("<script>", 3) == "&lt;sc…"  # cut before escaping: 3 visible characters
    assert short_token("", 3) == ""
    assert short_token(" ", 3) == "␣" and short_token("   ", 2) == "␣␣…"  # never a blank label
    assert short_token(" x", 3) == " x"  # a leading space is read as one
    assert cut("abcdef", 4) == "abc…" and cut("abcd", 4) == "abcd"
    assert token_hover("<a>\n", 7) == "'&lt;a&gt;\\n' · id 7" and token_hover("x", None).endswith(
        "?"
    )


def test_wrap_breaks_at_spaces_only():
    assert wrap("one two three four", 9) == "one two<br>three<br>four"
    assert wrap("a-very-long-word x", 5) == "a-very-long-word<br>x"  # never cut inside a word


def test_a_caption_grows_the_figure_by_its_lines():
    fig = add_caption(go.Figure(), ["word " * 30, "", "<b>not bold</b>"], 200)
    text = fig.layout.annotations[0].text
    lines = text.split("<br>")
    assert all(len(line) <= 52 for line in lines) and "&lt;b&gt;" in text
    assert fig.layout.height == 200 + 20 + 15 * len(lines)
    assert fig.layout.margin.b == 30 + 15 * len(lines)


def test_at_the_prefill_extra_views_with_nothing_to_draw_are_left_out(tiny):
    from decoders import generate
    from visualizer.panels import extra_panels

    res = generate(tiny, "def add(a, b):\n    return a + b\n\ndef add(a, b):", "lookahead", 12)
    assert (
        extra_panels(METHODS["lookahead"].views, res.events, {}, 0) == []
    )  # the window, pool: not yet
    later = extra_panels(METHODS["lookahead"].views, res.events, {}, 1)
    assert len(later) == len(METHODS["lookahead"].views) - 1 and any(f.data for f in later)


def test_an_exit_runs_curve_shows_early_exit_families_only():
    from visualizer.exit_view import quality_point

    points = [
        {"spec": "calm", "method": "calm", "agreement": 0.5, "layers_per_token": 0.9},
        {"spec": "free", "method": "free", "agreement": 0.6, "layers_per_token": 0.8},
        {
            "spec": "speculative:beta=4",
            "method": "speculative",
            "agreement": 0.4,
            "layers_per_token": 1.7,
        },
    ]
    fig = quality_point(points, "calm", 0.55, 0.92)
    xs = [x for trace in fig.data for x in trace.x]
    assert max(xs) <= 1.0  # relaxed verification's rows would stretch the axis to 1.7
    assert {t.name for t in fig.data} >= {"calm (benchmark)", "free (benchmark)", "this run"}
    # every curve has its legend entry (the other families' faint ones too)
    assert all(t.showlegend is not False for t in fig.data if t.name.endswith("(benchmark)"))
    # a phone's legend takes a row per entry: the figure grows by them, the plot keeps its
    # height (squeezed, its axis title ran up into the subtitle)
    fewer = quality_point(points[:1], "calm", None, None)
    assert fig.layout.height - fewer.layout.height >= 20 * (len(fig.data) - len(fewer.data))


def test_the_tokens_show_a_steps_rolled_back_drafts_and_a_draft_still_waiting():
    from decoders.core.events import Commit, Draft, Forward, Verify
    from visualizer.tokens import rolled_back, token_spans_html

    texts = {1: "a", 2: "b", 3: "c", 4: "d", 5: "e", 9: "X", 7: "t"}
    # a tree: root -> 0 (a, accepted) -> 1 (b, p .6) -> 2 (c); 0 -> 3 (d, p .3); root -> 4 (e)
    draft = Draft(1, "eagle", (1, 2, 3, 4, 5), (-1, 0, 1, 0, -1), (0.9, 0.6, 0.5, 0.3, 0.1))
    assert rolled_back(draft, (0,)) == [2, 3]  # the likelier child b, then its child c
    assert rolled_back(draft, ()) == [1, 2, 3]
    chain = Draft(1, "eagle", (1, 2, 3), (-1, 0, 1), (0.9, 0.8, 0.7))
    assert rolled_back(chain, (0, 1, 2)) == []
    events = [
        Forward(0, "prefill", 3, 30, 10.0),
        Commit(0, (7,), ("target",), (0.9,)),
        draft,
        Verify(1, (0,), 9, "greedy-tree"),
        Commit(1, (1, 9), ("draft", "correction"), (0.9, 0.8)),
    ]
    at = token_spans_html(events, texts, 1)
    # a, then b c struck through where X, the target's own token, now stands
    assert (
        at.index(">a<") < at.index('dl-ghost" title="drafted at step 1, rejected') < at.index(">X<")
    )
    assert at.count("dl-ghost") - at.count(".dl-ghost") == 2 and "drafted, rolled back" in at
    assert "dl-ghost" not in token_spans_html(events, texts, 0).split("</style>")[1]
    # streaming: a draft the target has not judged yet, faint after the last commit
    waiting = token_spans_html([*events, Draft(2, "eagle", (4, 5), (-1, 0), (0.5, 0.4))], texts)
    assert waiting.count('dl-ghost dl-unverified"') == 2


def test_the_hash_table_tells_look_alike_tokens_apart_and_says_it_scrolls():
    from decoders.core.events import Commit, LayerExit
    from visualizer.exit_view import hash_layers

    texts = {i: f"w{i}" for i in range(40)} | {100: " the", 101: "the"}  # alike in a cell
    outputs = [100, 101, *range(30)]
    events = [Commit(0, (outputs[0],), ("target",), (1.0,))]
    for pos in range(1, len(outputs)):
        events += [
            LayerExit(pos, pos, 3 + pos % 5, 30, (), (), 0.0, "hash"),
            Commit(pos, (outputs[pos],), ("exit",), (0.9,)),
        ]
    fig = hash_layers(events, texts, len(outputs) - 1)
    cells = list(fig.data[0].cells.values[0])
    assert len(cells) == len(set(cells)), "every row reads differently"
    assert "␣the  (id 100)" in cells and "the  (id 101)" in cells
    assert "↕ scroll the table" in fig.layout.title.subtitle.text.replace("<br>", " ")


def test_labels_are_placed_where_they_cover_no_point_and_no_other_label():
    from visualizer.compare_views import place_labels, why_faster

    crowded = [(1.30, 1.26, "prompt_lookup"), (1.33, 1.20, "lookahead"), (1.30, 1.43, "blockwise")]
    crowded += [(3.0, 2.5, "token_tree"), (1.0, 1.0, "autoregressive")]
    where = place_labels(crowded, (0.9, 3.2), (0.0, 3.0))
    assert where[3] == "middle left"  # no room right of the rightmost point
    # two lines ending at one height: on a phone's plot (240 px) "sam" right of its end and
    # "autoregressive" left of its end would touch ("samautoregressive"); the second is left to
    # the legend
    ends = [(1.5, 48.0, "sam"), (3.0, 48.0, "autoregressive")]
    assert place_labels(ends, (0.0, 3.1), (0.0, 50.0)) == ["middle right", None]
    # the crowd: some names fit a phone-wide plot, not all
    assert any(w is not None for w in where[:3]) and None in where[:3]
    fig = why_faster(
        [
            {"method": m, "tokens_per_target_forward": x, "speedup": y, "lossy": False}
            for x, y, m in crowded
        ]
    )
    named = [t for t in fig.data[1].text if t]
    assert "token_tree" in named and len(named) < len(crowded)
    assert "hover" in fig.data[1].name  # the unnamed ones have their name on hover
    assert len(fig.data) == 2  # no modelled speedups given: no modelled points
    fig = why_faster(
        [
            {
                "method": "sam",
                "tokens_per_target_forward": 3.0,
                "speedup": 2.8,
                "modelled_speedup": 2.9,
            }
        ]
    )
    assert list(fig.data[2].y) == [2.9] and "modelled" in fig.data[2].name  # beside the measured


def test_plotly_text_is_escaped_once_and_only_where_plotly_reads_markup():
    from visualizer.text import escape

    assert escape("n <= 1 and x < 2 -> y") == "n <= 1 and x < 2 -> y"  # shown as written
    assert escape("<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;" and escape("a<b") == "a&lt;b"
    assert escape("&lt; & &#60;") == "&amp;lt; & &amp;#60;"  # an entity Plotly would decode


def test_the_chat_templates_tokens_are_marked_once_in_a_rule_and_said_once_in_a_figure():
    from visualizer.tokens import template_marks

    texts = {1: "<|im_start|>", 2: "<|im_end|>", 3: "ass", 4: "istant", 5: "\n", 6: "user"}
    texts |= {7: "def", 8: " f"}
    prompt = (1, 6, 5, 7, 8, 2, 5, 1, 3, 4, 5)  # user: "def f", then the assistant's header
    events = [Prefill(prompt), TopK(0, 0, (1, 4, 7, 6), (0.4, 0.3, 0.2, 0.1))]
    events += [Commit(0, (7,), ("target",), (0.2,)), Commit(1, (6, 2), ("target",) * 2, (1, 1))]
    marks = template_marks(events, texts)
    assert marks == {1: "⟨turn⟩", 2: "⟨end⟩", 3: "⟨assistant⟩", 4: "⟨assistant⟩"}
    assert marks[3].original == "ass"  # "user" and "def" are the model's text too: not marked
    fig = method_panel(METHODS["autoregressive"].views, events, texts, 0)
    labels, note = list(fig.data[0].y), fig.layout.title.subtitle.text
    assert '#78909c">⟨turn⟩</span>' in labels[0] and labels[3].startswith("'user'")
    assert note.count("chat-template tokens, not the model's text") == 1
    plain = method_panel(METHODS["autoregressive"].views, events, texts, 1)
    assert "chat-template" not in (plain.layout.title.subtitle.text or "")
    spans = token_spans_html(events, texts)
    assert 'class="dl-mark"' in spans and spans.count("chat-template tokens") == 1


def test_a_long_title_wraps_to_a_phones_width_and_the_figure_grows_by_its_lines():
    from visualizer import draft_panel

    long = [*SPEC[:4], Draft(1, "eagle (auto: 1 trained layer on the target's features)", (11, 12, 13), (-1, 0, 1), (0.9, 0.7, 0.4)), *SPEC[5:]]  # fmt: skip
    short, wrapped = draft_panel(SPEC, TEXTS, 1), draft_panel(long, TEXTS, 1)
    lines = wrapped.layout.title.text.split("<br>")
    assert len(lines) == 2 and all(len(line) <= 44 for line in lines)
    assert "…" not in wrapped.layout.title.text and lines[-1].endswith("features)")
    assert wrapped.layout.height > short.layout.height


def test_the_sam_datastore_chart_shows_a_less_than_as_written():
    """Its labels were escaped twice: Plotly printed "&lt;=" for the token " <="."""
    import json

    from decoders.core.events import StoreMatch
    from visualizer.retrieval_view import retrieval

    texts = TEXTS | {40: " n", 41: " <=", 42: " <", 43: " 1", 44: "&", 45: "<b>"}
    events = [Prefill((1, 10, 40)), Commit(0, (40,), ("target",), (0.9,))]
    events += [StoreMatch(1, 2, 7, (7, 4, 3, 1), 0)]
    events += [Draft(1, "sam", (41, 42, 43, 44), (-1, -1, 0, 2), (1.0,) * 4)]
    events += [Verify(1, (0, 2), 20, "greedy-tree"), Commit(1, (41, 43, 20), ("draft",) * 3, (1,) * 3)]  # fmt: skip
    fig = retrieval(events, texts, 1)
    shown = json.dumps(fig.to_plotly_json(), ensure_ascii=False)
    assert " <= →  1 → &" in fig.layout.yaxis.ticktext  # a path, as written
    assert "&lt;" not in shown and "&gt;" not in shown and "&amp;" not in shown
    # a token that is markup is escaped, once: Plotly shows "<b>", not bold, not "&lt;b&gt;"
    events[3] = Draft(1, "sam", (41, 45, 43, 44), (-1, -1, 0, 2), (1.0,) * 4)
    shown = json.dumps(retrieval(events, texts, 1).to_plotly_json(), ensure_ascii=False)
    assert "&lt;b&gt;" in shown and "<b>" not in shown and "&amp;" not in shown


def test_token_recyclings_cells_keep_readable_labels_on_a_phone():
    from decoders.core.events import Recycled
    from visualizer.retrieval_view import adjacency

    texts = {t: f" tok{t}" for t in range(10, 30)}
    rows = ((10, *range(11, 19)), (11, *range(19, 27)))  # 8 successors each
    events = [Prefill((10,)), Commit(0, (10,), ("target",), (0.9,)), Recycled(1, rows)]
    events += [Draft(1, "recycling", (11, 19), (-1, 0), (1.0, 1.0)), Verify(1, (0,), 12, "g")]
    phone, page = adjacency(events, texts, 1, width=340), adjacency(events, texts, 1, width=792)
    assert list(page.layout.xaxis.tickvals) == list(range(1, 9))
    assert len(phone.layout.xaxis.tickvals) < 8  # fewer columns: the ranks not drafted left out
    assert min(len(t) for t in phone.data[0].text if t) >= 4  # " tok…", not two letters
    assert "' tok12' · id 12" in phone.data[0].hovertext[1]  # the whole token on hover or tap
    assert "not drawn" in phone.layout.title.subtitle.text.replace("<br>", " ")
