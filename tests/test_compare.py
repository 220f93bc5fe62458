"""Compare: method specs and presets, the headline, the one number format, rows identical to
greedy, the speedup chart and the race; the `/compare` endpoint; the tab in a browser at 1440 px
and on a phone, with every chart label inside its figure."""

import dataclasses
import re
from itertools import pairwise

import gradio as gr
import pytest
from gradio_client import Client
from playwright.sync_api import expect

import ui.compare
from browser_helpers import layout_problems
from conftest import ARTIFACTS
from decoders import METHODS, InvalidInput, generate, prepare
from decoders.core.events import Commit, Draft, token_ids
from decoders.core.readings import contradicts, decision_margin
from ui.compare import (
    DEFAULT_PRESET,
    EVERY_METHOD,
    PRESETS,
    REFERENCE,
    compare_methods,
    headline,
    paper_spec,
    parse_spec,
    parse_specs,
    split_specs,
    table_rows,
)
from ui.compare_tab import preset_value
from visualizer import race_chart, speedup_chart
from visualizer.compare_views import LOSSY_COLOUR as LOSSY
from visualizer.compare_views import race_points, wrap_label

PROMPT = "def add(a, b):"

# --- specs and presets ----------------------------------------------------------------------------


def test_a_spec_is_parsed_by_the_benchmark_rule_and_validated():
    s = parse_spec("lookahead:N=4:W=5")
    assert (s.method, s.params["N"], s.params["W"]) == ("lookahead", 4, 5)
    assert s.params["G"] == METHODS["lookahead"].preset("defaults")["G"]  # defaults filled in
    assert parse_spec("speculative:draft=self:8").params["draft"] == "self:8"  # ':' in a value
    assert parse_spec(" token_tree ").label == "token_tree"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("warp_drive", "unknown method 'warp_drive'"),
        ("lookahead:N=abc", "'N' expects int"),
        ("lookahead:N=999", "'N' must be in"),
        ("lookahead:X=1", "unknown parameter 'X'"),
        ("lookahead:N", "expected NAME:KEY=VALUE"),
        ("speculative:temperature=0.7", "Compare runs greedy"),
        ("speculative:draft=evil/model", "not offered here"),
    ],
)
def test_a_bad_spec_gets_a_message_that_names_it(spec, reason):
    with pytest.raises(InvalidInput) as err:
        parse_specs(f"prompt_lookup\n{spec}")
    assert f"method spec {spec!r}" in str(err.value) and reason in str(err.value)


def test_specs_come_one_per_line_or_comma_separated():
    assert split_specs("prompt_lookup\n\n  jacobi:block=8 ,lookahead") == [
        "prompt_lookup",
        "jacobi:block=8",
        "lookahead",
    ]
    with pytest.raises(InvalidInput, match="at least one method spec"):
        parse_specs(" \n ")


def test_autoregressive_runs_first_and_the_same_run_twice_runs_once():
    defaults = METHODS["jacobi"].preset("defaults")
    specs = parse_specs(
        ["jacobi", f"jacobi:block={defaults['block']}", "autoregressive", "jacobi:block=3"]
    )
    assert [s.label for s in specs] == ["autoregressive", "jacobi", "jacobi:block=3"]


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_validates(name):
    specs = parse_specs(PRESETS[name])
    assert specs[0].method == REFERENCE and len(specs) == len(PRESETS[name]) + 1


def test_each_family_at_its_best_is_one_method_a_family_at_its_defaults():
    families = [METHODS[parse_spec(s).method].family for s in PRESETS[DEFAULT_PRESET]]
    assert sorted(families) == sorted({m.family for m in METHODS.values()} - {"baseline"})
    assert {parse_spec(s).method for s in PRESETS[EVERY_METHOD]} == set(METHODS) - {REFERENCE}
    for spec in (*PRESETS[DEFAULT_PRESET], *PRESETS[EVERY_METHOD]):
        s = parse_spec(spec)
        assert s.params == METHODS[s.method].preset("defaults")


def test_the_papers_settings_spell_each_paper_preset():
    papers = [name for name, m in METHODS.items() if "paper" in m.presets]
    assert list(PRESETS["the papers' settings"]) == [paper_spec(n) for n in papers]
    for name in papers:
        assert parse_spec(paper_spec(name)).params == METHODS[name].preset("paper")


# --- headline and number format -------------------------------------------------------------------


def row(method, speedup, identical=True, divergence=None, tps=10.0):
    return {
        "method": method,
        "speedup": speedup,
        "tokens_per_s": tps,
        "tokens_per_target_forward": 1.0,
        "mean_acceptance_length": None,
        "new_tokens": 16,
        "identical": identical,
        "first_divergence": divergence,
        "lossless": "reference" if method == REFERENCE else "✓ identical",
    }


def test_the_headline_names_the_fastest_and_counts_identical_outputs():
    rows = [row(REFERENCE, 1.0), row("prompt_lookup", 1.31), row("token_tree:lookup=3", 2.04)]
    rows.append(row("jacobi", 0.9))
    assert headline(rows) == (
        "Fastest: token_tree:lookup=3 at 2.04× over autoregressive; "
        "all 3 outputs identical to greedy."
    )
    rows[1] = row("prompt_lookup", 1.31, identical=False, divergence=7)
    assert headline(rows).endswith(
        "2 of 3 outputs identical to greedy; prompt_lookup differs at token 7."
    )
    slow = [row(REFERENCE, 1.0), row("jacobi", 0.62)]
    assert headline(slow) == (
        "Nothing beat autoregressive here; the closest: jacobi at 0.62×; "
        "the output is identical to greedy."
    )
    # Half precision: a difference comes with the Run tab's caveat.
    rows[1]["caveat"] = "torch.float16 on cuda: near-ties can flip between batch shapes"
    assert headline(rows).endswith(
        "prompt_lookup differs at token 7 (torch.float16 on cuda: near-ties can flip between "
        "batch shapes)."
    )


def test_the_headline_sums_up_many_lossy_rows_by_the_fastest_and_the_closest():
    def lossy(method, speedup, agreement):
        r = row(method, speedup, identical=False, divergence=3)
        r.update(lossy=True, agreement=agreement, lossless=f"≈ lossy: {agreement:.0%} agree")
        return r

    one = [row(REFERENCE, 1.0), lossy("calm", 0.91, 0.5)]
    assert headline(one) == "calm is lossy: 0.91×, 50% agree."
    many = [*one, lossy("free", 1.3, 0.25), lossy("hash_ee", 1.1, 0.75)]
    assert headline(many) == (
        "3 lossy rows: the fastest, free, at 1.30× with 25% of tokens agreeing; the closest to "
        "greedy, hash_ee, 75% at 1.10×."
    )


def test_an_unknown_preset_leaves_the_specs_alone():
    assert preset_value("quick look") == "\n".join(PRESETS["quick look"])
    assert isinstance(preset_value(None), type(gr.skip()))
    for name in (
        "early exit: CALM, FREE and HASH EE",
        "relaxed verification: SpecDec's β and τ",
    ):
        assert all(parse_spec(spec) for spec in PRESETS[name])  # every spec is a real method


def test_warm_up_runs_each_distinct_spec_once_without_detail(monkeypatch):
    calls = []

    from decoders.core import costs

    def recording(bundle, prompt, method, max_new_tokens, **kw):
        calls.append((method, max_new_tokens, dict(kw["params"]), kw.get("detail", True)))
        held.append(costs._held)
        return prepare(bundle, prompt, method, max_new_tokens, **kw)

    held = []
    monkeypatch.setattr(ui.compare, "prepare", recording)
    specs = "speculative:draft=self:2:gamma=3\nspeculative:draft=self:1:gamma=2\njacobi"
    final = list(compare_methods("tiny-random", PROMPT, specs, 6))[-1]
    warm = [c for c in calls if c[1] == 4]
    assert len(warm) == len(final.specs) == 4  # autoregressive and the three specs
    # the warm-up runs with the prices held, as the timed rounds do: no measure beside it
    assert [h for c, h in zip(calls, held, strict=True) if c[1] == 4] == [1] * 4
    assert [c[2] for c in warm] == [s.params for s in final.specs]
    assert not any(c[3] for c in calls)  # warm and timed runs alike skip detail
    assert all(r["caveat"] is None for r in final.rows)  # float32 on CPU is exact


def test_the_table_uses_one_number_format():
    rows = [row(REFERENCE, 1.0, tps=12.0), row("prompt_lookup", 1.5, tps=18.04)]
    rows[1]["tokens_per_target_forward"] = 2
    rows[1]["mean_acceptance_length"] = 3.14159
    rows[0]["modelled_speedup"], rows[1]["modelled_speedup"] = 1.0, 1.6
    table = table_rows(rows)
    assert table[0][1] == "1.00×" and table[1][1] == "1.60×"  # modelled, then measured
    assert table_rows([row("jacobi", 0.9)])[0][1] == "—"  # no priced work: no modelled speedup
    assert [table[0][i] for i in (0, 2, 4, 5, 7)] == [
        "autoregressive",
        "1.00×",
        "12.0",
        "1.00",
        "—",
    ]
    assert [table[1][i] for i in (0, 2, 4, 5, 7)] == [
        "prompt_lookup",
        "1.50×",
        "18.0",
        "2.00",
        "3.14",
    ]
    # A long spec may break between its settings (the table wraps its cells), and a spec copied
    # out of the table still parses.
    long = table_rows([row("calm:confidence=saturation:threshold=0.995", 0.9)])[0][0]
    assert long == "calm:\u200bconfidence=saturation:\u200bthreshold=0.995"
    assert parse_spec(long) == parse_spec("calm:confidence=saturation:threshold=0.995")
    from decoders.bench import parse_method  # and pasted into the benchmark's --methods

    assert parse_method(long) == ("calm", {"confidence": "saturation", "threshold": "0.995"})


# --- real runs on tiny-random ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def compared():
    specs = [*PRESETS[EVERY_METHOD], "speculative:draft=self:2:gamma=3", "lookahead:N=3:W=2"]
    return list(compare_methods("tiny-random", PROMPT, specs, 16, warm_up=False, rounds=1))


def test_rows_grow_one_run_at_a_time_and_all_are_identical_to_greedy(compared, tiny):
    final = compared[-1]
    assert [len(c.rows) for c in compared] == list(range(1, len(final.specs) + 1))
    assert final.done and not compared[0].done
    greedy = generate(tiny, PROMPT, max_new_tokens=16).token_ids
    assert final.traces[REFERENCE].token_ids == greedy
    lossy = [r for r in final.rows if r["lossy"]]
    assert [r["name"] for r in lossy] == ["mask_predict", "calm", "free", "hash_ee"]
    for r in final.rows:
        if r["lossy"]:  # never a tick, even if it happened to match
            assert r["lossless"].startswith("≈ lossy: ") and "✓" not in r["lossless"]
            continue
        assert final.traces[r["method"]].token_ids == greedy, r["method"]
        assert r["identical"] and r["lossless"] in ("reference", "✓ identical")
    assert final.rows[0]["method"] == REFERENCE and final.rows[0]["speedup"] == 1.0
    n = len(PRESETS[EVERY_METHOD]) + 2 - len(lossy)  # the exact specs, besides the reference
    assert f"all {n} outputs identical to greedy" in final.headline()
    quick = max(lossy, key=lambda r: r["speedup"])  # more than two lossy rows: the fastest
    assert f"4 lossy rows: the fastest, {quick['method']}, at " in final.headline()
    # Who is fastest is the rule's, on these rows' timings (tested on given numbers in
    # test_the_headline_names_no_winner_...): here only that the comparison says what it says.
    assert final.headline() == headline(final.rows)
    # A spec that did the reference's work (prompt lookup finds no match on tiny-random's text)
    # is never called faster than it, whatever its clock said.
    for r in final.rows[1:]:
        if r["work"] == final.rows[0]["work"]:
            assert f"Fastest: {r['method']} " not in final.headline()
    assert compared[2].headline().startswith(f"So far (3 of {len(final.specs)} runs done): ")


def test_race_lines_rise_with_time_and_end_at_the_token_count(compared):
    final = compared[-1]
    for label, trace in final.traces.items():
        for clock in (trace.meta["commit_s"], None):  # measured arrival times, forward clock
            times, tokens = race_points(trace.events, clock)
            assert times[0] == 0.0 and tokens[0] == 0
            assert all(b >= a for a, b in pairwise(times)), label
            assert all(b > a for a, b in pairwise(tokens)), label
            assert tokens[-1] == len(trace.token_ids) == trace.stats["new_tokens"]
        assert times[1] > 0  # the first commit comes after the prefill forward
        # The measured clock ends inside the run's own wall time, up to the moment between the
        # race's clock starting and the run's generator starting (on a loaded box, a few ms:
        # 0.1628 s against 0.1588 s was seen with three test workers on two cores).
        assert trace.meta["commit_s"][-1] <= trace.stats["wall_s"] + 0.02
    runs = [(label, t.events, t.meta["commit_s"]) for label, t in final.traces.items()]
    fig = race_chart(runs)
    *lines, ends = fig.data
    assert len(lines) == len(runs)
    for trace_fig, (_, t) in zip(lines, final.traces.items(), strict=True):
        assert list(trace_fig.y)[-1] == len(t.token_ids)
        assert list(trace_fig.x) == sorted(trace_fig.x)
    assert fig.data[0].line.dash == "dash"  # the reference
    # each line named where it ends, in its colour
    assert list(ends.y) == [list(t.y)[-1] for t in lines]
    assert list(ends.marker.color) == [t.line.color for t in lines]


def test_compare_traces_keep_the_text_of_every_token_a_view_names(compared):
    for label, trace in compared[-1].traces.items():
        named = {t for e in trace.events for t in token_ids(e)}
        assert named <= set(trace.texts), label
    # Lookahead's window and pool name tokens no commit or draft does (kept all the same).
    events = compared[-1].traces["lookahead"].events
    drafted = {t for e in events if isinstance(e, Commit | Draft) for t in e.tokens}
    assert {t for e in events for t in token_ids(e)} - drafted


def test_race_points_fall_back_to_the_forward_clock_when_times_do_not_fit(compared):
    trace = compared[-1].traces["prompt_lookup"]
    commits = sum(isinstance(e, Commit) for e in trace.events)
    assert race_points(trace.events, [1.0] * (commits + 1)) == race_points(trace.events)


def test_speedup_chart_has_horizontal_bars_labelled_by_wrapped_specs(compared):
    rows = compared[-1].rows
    fig = speedup_chart(rows)
    speed, per_forward, *swatches, modelled = fig.data
    assert list(modelled.x) == [r["modelled_speedup"] for r in rows]  # the work's, beside the clock
    # Rows of lossless methods whose output is not greedy's are red, lossy rows purple, and the
    # legend says so.
    differ = any(not r["identical"] and not r.get("lossy") for r in rows)
    assert [t.name for t in swatches] == (
        ["speedup (×), output differs from greedy"] if differ else []
    ) + (["speedup (×), lossy method"] if any(r.get("lossy") for r in rows) else [])
    assert speed.orientation == "h" and list(speed.x) == [r["speedup"] for r in rows]
    # each label in its row's colour, line by line
    plain = [re.sub(r"<span[^>]*>|</span>", "", y) for y in speed.y]
    assert plain == [wrap_label(r["method"]) for r in rows]
    assert list(speed.text) == [f"{r['speedup']:.2f}×" for r in rows]
    assert fig.layout.yaxis.automargin and fig.layout.xaxis.automargin
    assert fig.layout.xaxis.range[1] > max(max(speed.x), max(per_forward.x))  # room for the text


def test_speedup_bars_are_green_only_for_lossless_rows_identical_to_greedy():
    def row(method, speedup, identical, lossy=False):
        return {
            "method": method,
            "speedup": speedup,
            "tokens_per_target_forward": 1.0,
            "identical": identical,
            "lossy": lossy,
        }

    rows = [
        row("autoregressive", 1.0, True),
        row("jacobi", 0.98, True),
        row("prompt_lookup", 1.2, False),
        row("calm:lambda=0.9", 1.4, True, lossy=True),  # matched greedy this time: still purple
        row("mask_predict", 2.0, False, lossy=True),
    ]
    fig = speedup_chart(rows)
    assert list(fig.data[0].marker.color) == ["#2e7d32", "#2e7d32", "#c62828", LOSSY, LOSSY]
    assert [t.name for t in fig.data[2:]] == [
        "speedup (×), output differs from greedy",
        "speedup (×), lossy method",
    ]
    # The 1× line runs under the bars, and a bar ending just short of it carries its value inside
    # (written outside, "0.98×" ran across the line).
    (line,) = fig.layout.shapes
    assert line.x0 == 1.0 and line.layer == "below"
    assert list(fig.data[0].textposition) == ["outside", "inside", "outside", "outside", "outside"]
    # Without red or purple rows, no swatch and no room kept for them.
    plain = speedup_chart(rows[:2])
    assert len(plain.data) == 2 and plain.layout.margin.t < fig.layout.margin.t
    # Rows with a modelled speedup: a diamond at it on each row, beside the measured bar
    priced = speedup_chart([{**r, "modelled_speedup": r["speedup"] + 0.1} for r in rows[:2]])
    assert list(priced.data[-1].x) == [1.1, 1.08] and "modelled" in priced.data[-1].name


def test_long_specs_wrap_at_their_colons():
    spec = "lookahead:N=5:W=15:G=15:pool_from_output=false:rank_by_context=false"
    lines = wrap_label(spec).split("<br>")
    assert "".join(lines) == spec
    # At most 22 characters a line, unless one KEY=VALUE alone is longer (never cut inside it).
    assert all(len(line) <= 22 or line.count(":") == 1 for line in lines), lines
    assert ":pool_from_output=false" in lines
    assert all(line.startswith(":") for line in lines[1:])
    tree = "token_tree:choices=0 1 2 3 0.0 0.1 0.2 1.0 1.1 2.0"
    assert max(len(line) for line in wrap_label(tree).split("<br>")) <= 22
    assert wrap_label("jacobi") == "jacobi"


def test_a_speedup_its_work_cannot_explain_is_flagged_and_names_no_winner():
    from decoders.core.readings import explained

    rows = [row(REFERENCE, 1.0), row("jacobi", 2.4), row("token_tree", 1.8)]  # jacobi: 1 a forward
    rows[2]["tokens_per_target_forward"] = 3.0  # 3 tokens a forward: 1.8x is within reach
    for r in rows:
        r["explained"] = explained(r)
    assert [r["explained"] for r in rows] == [True, False, True]  # jacobi: 1 token a forward
    text = headline(rows)
    assert text.startswith("Fastest: token_tree at 1.80×")
    assert "⚠ jacobi (measured 2.40×): a round faster than its tokens per forward allow" in text
    assert table_rows(rows)[1][2].startswith("⚠ 2.40×")
    # early exit: fewer layers a token explain a speedup at one token a forward; a tree's
    # verified inputs (layers per token above 1) lower no bound
    assert explained({**row("calm", 1.5), "layers_per_token": 0.6})
    tree = {**row("token_tree", 2.8), "tokens_per_target_forward": 2.9, "layers_per_token": 3.2}
    assert explained(tree)


def test_the_winner_is_decided_on_modelled_speedups_whatever_the_clock_said():
    """The same work priced by the same table gives the same decision, however the machine's
    load moved the measured speedups; a lead inside the table's error names no winner; a clock
    that says the opposite of the work is pointed out."""

    def rows(measured: list[float], modelled: list[float], error: float = 0.02):
        out = [row(REFERENCE, 1.0)]
        for name, m, mod in zip(("sam", "token_tree", "jacobi"), measured, modelled, strict=True):
            out.append(row(name, m) | {"modelled_speedup": mod})
        for r in out:
            r["price_error"] = error
            r["modelled_speedup"] = r.get("modelled_speedup", 1.0)
        return out

    quiet = rows([2.9, 2.5, 0.9], [2.95, 2.6, 0.92])
    busy = rows([2.1, 3.4, 1.2], [2.95, 2.6, 0.92])  # the clock crowned token_tree this time
    for r in (quiet, busy):
        assert headline(r).startswith("Fastest: sam at 2.95× modelled (measured ")
    assert "measured 2.10×" in headline(busy)
    close = rows([2.9, 2.5, 0.9], [2.95, 2.85, 0.92])  # 3.5 % apart, inside the 5 % margin
    assert headline(close).startswith("No clear winner: sam (2.95× modelled) and token_tree")
    # a noisy table widens the margin past the least one: 7 % apart, inside 2 x 4 %
    wide = rows([2.9, 2.5, 0.9], [2.95, 2.75, 0.92], 0.04)
    assert headline(wide).startswith("No clear winner") and decision_margin(wide) == 0.08
    assert headline(rows([2.9, 2.5, 0.9], [2.95, 2.75, 0.92], 0.01)).startswith("Fastest: sam")
    assert decision_margin(close) == 0.05 and decision_margin(rows([1, 1, 1], [1, 1, 1], 0)) == 0.05
    slower = rows([0.9, 0.8, 0.7], [0.9, 0.8, 0.7])
    assert headline(slower).startswith(
        "Nothing beat autoregressive here; the closest: sam at 0.90×"
    )
    against = rows([2.9, 2.5, 1.3], [2.95, 2.6, 0.92])
    against[3]["speedup_range"] = (1.2, 1.4)  # every round faster than the work allows it to be
    assert contradicts(against[3], 0.04) and not contradicts(against[1], 0.04)
    assert "⚠ jacobi (measured 1.30×, 1.20×–1.40× against 0.92× modelled): the clock says" in (
        headline(against)
    )


def test_a_speedup_is_the_median_of_its_rounds_with_their_range():
    final = list(compare_methods("tiny-random", PROMPT, "jacobi", 6, False, 3))[-1]
    r = final.rows[1]
    low, high = r["speedup_range"]
    assert low <= r["speedup"] <= high and r["runs"] == 3


def test_rounds_keep_each_specs_fastest_run_and_check_every_run():
    steps = list(compare_methods("tiny-random", PROMPT, "prompt_lookup\njacobi", 8, False, 2))
    assert [c.progress for c in steps] == [f"{i} of 6 runs done" for i in range(1, 7)]
    # Round 2 starts one spec later (prompt_lookup, jacobi, autoregressive).
    assert [len(c.rows) for c in steps] == [1, 2, 3, 3, 3, 3]
    final = steps[-1]
    # Mid round 2 only prompt_lookup has run twice: each row counts its own runs.
    assert [r["runs"] for r in steps[3].rows] == [1, 2, 1]
    assert final.done and [r["runs"] for r in final.rows] == [2, 2, 2]
    assert all(r["identical"] for r in final.rows[1:])
    for r in final.rows:  # the row is the faster of its spec's two runs
        assert r["tokens_per_s"] == round(final.traces[r["method"]].stats["tokens_per_s"], 1)
    with pytest.raises(InvalidInput, match="rounds must be"):
        next(compare_methods("tiny-random", PROMPT, "jacobi", 8, rounds=0))


def test_bad_requests_fail_before_anything_runs():
    with pytest.raises(InvalidInput, match="max_new_tokens"):
        next(compare_methods("tiny-random", PROMPT, "jacobi", 0))
    with pytest.raises(InvalidInput, match="prompt is empty"):
        next(compare_methods("tiny-random", "  ", "jacobi", 8))
    with pytest.raises(InvalidInput, match="method spec 'jacobi:block=0'"):
        next(compare_methods("tiny-random", PROMPT, "prompt_lookup\njacobi:block=0", 8))


# --- the app: the /compare endpoint and the tab in a browser ---------------------------------------


@pytest.mark.slow
def test_compare_endpoint_takes_specs(server, tiny):
    client = Client(server, verbose=False)
    out = client.predict(
        prompt=PROMPT,
        methods="prompt_lookup, lookahead:N=3:W=2",
        model="tiny-random",
        max_new_tokens=12,
        api_name="/compare",
    )
    assert [r["method"] for r in out["rows"]] == [REFERENCE, "prompt_lookup", "lookahead:N=3:W=2"]
    text = generate(tiny, PROMPT, max_new_tokens=12).text
    assert out["texts"] == {r["method"]: text for r in out["rows"]}
    # (a busy machine may add its warning after it: a row faster than its tokens per forward
    # allow is called a measurement problem, tested in test_a_speedup_its_work_cannot_explain...)
    assert "; both outputs identical to greedy." in out["headline"], out["headline"]
    with pytest.raises(Exception, match=r"method spec 'lookahead:N=oops'"):
        client.predict(
            prompt=PROMPT, methods="lookahead:N=oops", model="tiny-random", api_name="/compare"
        )


# Gradio's table draws its body rows as role=row elements holding role=gridcell cells.
TABLE_CELLS = """() => [...document.querySelectorAll('#cmp-table [role=row]')].map(
  row => [...row.querySelectorAll('[role=gridcell]')].map(
    cell => cell.innerText.replaceAll('\u200b', '').trim()))"""


def compare_preset(
    page, preset: str, budget: int, timeout_ms: int = 180_000, rounds: int | None = None
) -> None:
    """On the Compare tab: pick a preset, set the prompt, the budget (and the rounds: the
    default's three where not given), run, wait for Done."""
    page.locator("#cmp-preset input").click()
    page.get_by_role("option", name=preset).click()
    expect(page.locator("#cmp-specs textarea")).to_have_value(
        "\n".join(PRESETS[preset]), timeout=30_000
    )
    page.locator("#cmp-prompt textarea").fill(PROMPT)
    box = page.locator("#cmp-max-new input[type=number]")
    box.fill(str(budget))
    box.press("Enter")
    if rounds is not None:
        box = page.locator("#cmp-rounds input[type=number]")
        box.fill(str(rounds))
        box.press("Enter")
    page.locator("#cmp-btn").click()
    page.locator("#cmp-status").get_by_text("✅ Done.").wait_for(timeout=timeout_ms)


def run_compare_in_the_page(page, server, name: str) -> list[list[str]]:
    page.goto(server)
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#cmp-specs textarea")).to_have_value(
        "\n".join(PRESETS[DEFAULT_PRESET]), timeout=30_000
    )
    # two rounds: a median and a range per row, at two thirds of the default's runs
    compare_preset(page, "quick look", 16, rounds=2)
    for plot in ("#cmp-plot", "#cmp-race"):
        page.locator(f"{plot} .js-plotly-plot").wait_for(timeout=30_000)
    page.wait_for_timeout(500)  # let Plotly finish laying out its labels
    page.screenshot(path=str(ARTIFACTS / f"compare-{name}.png"), full_page=True)
    rows = [[c for c in r if c] for r in page.evaluate(TABLE_CELLS)]
    return [r for r in rows if r]


def check_compare_page(page, rows: list[list[str]]) -> None:
    specs = [r[0] for r in rows]
    assert specs == [REFERENCE, *PRESETS["quick look"]], rows
    # One number format: tokens/s with 1 decimal, ratios with 2, speedups with "×".
    # Columns: spec, modelled speedup, measured speedup, lossless (the verdict beside the
    # speed), tokens/s, ... A measured speedup: the median of the rounds, with their range.
    for r in rows:
        assert re.fullmatch(r"\d+\.\d\d×", r[1]), r
        assert re.fullmatch(r"(⚠ )?\d+\.\d\d×( \(\d+\.\d\d–\d+\.\d\d\))?", r[2]), r
        assert re.fullmatch(r"\d+\.\d", r[4]), r
        assert re.fullmatch(r"\d+\.\d\d", r[5]), r
        assert re.fullmatch(r"\d+%|—", r[6]), r  # layers per token
        assert re.fullmatch(r"\d+\.\d\d|—", r[7]), r
    assert all("identical" in r[3] for r in rows[1:]) and rows[0][3] == "reference"
    assert all("(" in r[2] for r in rows[1:]), "each row's range over the rounds"
    fastest = max(rows[1:], key=lambda r: float(r[1].rstrip("×")))
    title = page.locator("#cmp-headline").inner_text()
    # Named with its modelled speedup (what decides), whatever the verdict (fastest, a tie,
    # the closest), the measured one beside it; or as having done autoregressive's own work.
    assert fastest[0] in title, title
    assert f"{fastest[1]} modelled" in title or "did the same work" in title, title
    assert "Work is priced by this machine's table" in page.locator("#cmp-prices").inner_text()
    assert "all 3 outputs identical to greedy" in title
    # Every text of both figures inside its figure and clear of the others (the views' check).
    for plot in ("#cmp-plot", "#cmp-race"):
        assert layout_problems(page, plot) == [], plot


@pytest.mark.slow
@pytest.mark.browser
def test_compare_tab_at_1440(server, page):
    check_compare_page(page, run_compare_in_the_page(page, server, "desktop"))
    # The whole table fits beside the form: no sideways scrolling (long cells wrap instead).
    view = page.locator("#cmp-table .virtual-table-viewport")
    assert view.evaluate("v => v.scrollWidth <= v.clientWidth + 1"), view.evaluate(
        "v => [v.scrollWidth, v.clientWidth]"
    )


@pytest.mark.slow
@pytest.mark.browser
def test_compare_tab_on_a_phone(server, phone_page):
    rows = run_compare_in_the_page(phone_page, server, "phone")
    check_compare_page(phone_page, rows)
    width = phone_page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways ({width} px)"


@pytest.mark.slow
@pytest.mark.browser
def test_a_bad_spec_in_the_page_is_a_message(server, page):
    page.goto(server)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#cmp-specs textarea").fill("prompt_lookup\nlookahead:N=oops")
    page.locator("#cmp-btn").click()
    page.locator("#cmp-status").get_by_text("method spec 'lookahead:N=oops'").wait_for(
        timeout=60_000
    )
    assert page.locator("#cmp-headline").inner_text().strip() == ""


@pytest.mark.slow
@pytest.mark.browser
def test_the_early_exit_preset_draws_its_quality_chart_on_a_phone(server, phone_page):
    page = phone_page
    page.goto(server)
    page.get_by_role("tab", name="Compare").click()
    name = "early exit: CALM, FREE and HASH EE"
    compare_preset(page, name, 12, timeout_ms=240_000)
    page.locator("#cmp-quality .js-plotly-plot").wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "compare-early-exit-phone.png"), full_page=True)
    rows = [r for r in ([c for c in r if c] for r in page.evaluate(TABLE_CELLS)) if r]
    assert [r[0] for r in rows] == [REFERENCE, *PRESETS[name]]
    assert all(r[3].startswith("≈ lossy") for r in rows[1:]), rows  # never a tick
    assert layout_problems(page, "#cmp-quality") == []
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390


def test_the_quality_chart_joins_each_lossy_family_and_places_the_reference():
    from visualizer import quality_chart

    rows = [
        {"method": REFERENCE, "name": REFERENCE, "speedup": 1.0, "lossy": False},
        {"method": "prompt_lookup", "name": "prompt_lookup", "speedup": 1.4, "lossy": False},
        {"method": "calm", "name": "calm", "speedup": 0.9, "lossy": True, "agreement": 0.7,
         "rouge_l": 0.8, "layers_per_token": 0.95},
        {"method": "calm:threshold=0.9", "name": "calm", "speedup": 1.2, "lossy": True,
         "agreement": 0.3, "rouge_l": 0.5, "layers_per_token": 0.8},
    ]  # fmt: skip
    fig = quality_chart(rows)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {REFERENCE, "calm"}  # exact rows other than the reference: not drawn
    assert list(by_name["calm"].x) == [0.9, 1.2] and list(by_name["calm"].y) == [0.7, 0.3]
    assert (
        by_name["calm"].mode == "lines+markers" and "95% of the layers" in by_name["calm"].text[0]
    )
    assert list(by_name[REFERENCE].y) == [1.0]
    assert "no lossy method" in quality_chart(rows[:2]).layout.annotations[0].text
    # where tokens left, when the skipped layers still ran for the cache (CALM's fill=compute)
    true_cache = {**rows[2], "layers_per_token": 1.0, "exit_depth": 0.69}
    (hover,) = next(t for t in quality_chart([rows[0], true_cache]).data if t.name == "calm").text
    assert "100% of the layers · left at 69%" in hover
    assert "left at" not in by_name["calm"].text[0]  # no exit depth given: nothing said


def test_the_headline_names_no_winner_for_the_same_work_or_a_lead_inside_the_noise():
    same = [row(REFERENCE, 1.0), row("token_tree", 1.52), row("token_tree:nodes=8", 1.21)]
    same[1]["work"] = same[2]["work"] = "abc"  # the same tokens from the same forwards
    text = headline(same)
    assert text.startswith("A tie: token_tree and token_tree:nodes=8 did the same work")
    assert "Fastest" not in text
    as_reference = [row(REFERENCE, 1.0), row("prompt_lookup", 1.3)]
    as_reference[0]["work"] = as_reference[1]["work"] = "abc"
    assert headline(as_reference).startswith("Nothing beat autoregressive: prompt_lookup did the")
    close = [row(REFERENCE, 1.0), row("speculative", 1.60), row("token_tree", 1.70)]
    assert headline(close).startswith("No clear winner: token_tree (1.70×) and speculative tie")
    measured = [
        dict(r, speedup_range=rng)
        for r, rng in zip(close, [None, (1.5, 1.62), (1.66, 1.8)], strict=True)
    ]
    assert headline(measured).startswith("Fastest: token_tree at 1.70×")
    near_one = [row(REFERENCE, 1.0), row("jacobi", 1.05)]
    assert headline(near_one).startswith("Nothing clearly beat autoregressive; the closest: jacobi")


def test_the_prices_line_and_the_re_measure_button_read_one_table(monkeypatch, tiny):
    """The sentence beside the results says what the table prices; the button asks the engine
    to measure it again (here a stated table, so no test measures the machine)."""
    import decoders.engine
    from decoders.core.prices import PriceTable
    from ui.compare import prices_line, remeasure_prices

    table = dataclasses.replace(PriceTable.linear("tiny-random", 0.04), drafters={"eagle": 0.05})
    asked = []
    monkeypatch.setattr(decoders.engine, "calibrate", lambda b, again: asked.append(again) or table)
    assert remeasure_prices("tiny-random") is table and asked == [True]
    line = prices_line(table)
    assert "one more verified input costs 0.040 of a one-token forward" in line
    assert "a draft forward of eagle 0.050" in line and "±1%" in line
    assert prices_line(None) == ""
