"""How a comparison's results read, on stated rows: the headline (the fastest, the identical
outputs, lossy rows, ties and leads inside the noise, a speedup its work cannot explain), the one
number format, the speedup bars' colours and wrapped labels, the quality chart, and the prices
line with its re-measure button."""

import dataclasses

from decoders.core.readings import contradicts, decision_margin
from ui.compare import REFERENCE, headline, parse_spec, table_rows
from visualizer import speedup_chart
from visualizer.compare_views import LOSSY_COLOUR as LOSSY
from visualizer.compare_views import wrap_label

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
