"""Numbers and claims in prose come from data (decoders/core/facts.py): every explainer, the
overview, the translation explainer and the tour's narrations quote measured numbers and
"faster"/"slower" verdicts only through placeholders, every placeholder resolves, and a
placeholder says what its source holds, by the one verdict rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT
from decoders import METHODS
from decoders.core import facts, readings

# --- the prose ------------------------------------------------------------------------------------


def prose() -> dict[str, str]:
    """Every text a reader is told numbers in, raw (placeholders unfilled), by where it lives."""
    from ui.tour import STOPS
    from ui.tour_show import TRANSLATION_NARRATION

    texts = {f"{name}.md": m.explainer_path.read_text() for name, m in METHODS.items()}
    texts["overview.md"] = (ROOT / "ui" / "overview.md").read_text()
    texts["seq2seq/explainer.md"] = (ROOT / "decoders" / "seq2seq" / "explainer.md").read_text()
    texts["tour: translation"] = TRANSLATION_NARRATION
    for s in STOPS:
        texts[f"tour: {s.key}"] = " ".join([s.title, s.narration, s.look, s.rule])
    return texts


# What may carry a number that is not a measurement: code (spans and fences), a parameter's value
# (`= 0.9`), a citation (arXiv ids, venues and years), the placeholders themselves.
NOT_MEASURED = [
    re.compile(r"```.*?```", re.S),
    re.compile(r"`[^`]*`"),
    facts.PLACEHOLDER,
    re.compile(r"[=≤≥<>]\s*[-\d.]+"),
    re.compile(r"arXiv[: ]\d{4}\.\d{4,5}"),
]
MEASURED = re.compile(r"\d\s*×|\d\s*%|\d+\.\d+|\d\s*ms\b|~\s*\d")
CLAIM = re.compile(r"\b(fastest|slowest|faster|slower|quicker)\b", re.I)
# A claim that is no measurement: the section heading, or a condition ("gains when ...")
ITALIC = re.compile(r"(?<!\*)\*(?![*\s])[^*]+?(?<![*\s])\*(?!\*)")  # a paper's title
GENERIC = re.compile(r"faster or slower|faster \(or not\)|\b(if|when|whether|unless)\b", re.I)


def bare(text: str) -> str:
    for pattern in NOT_MEASURED:
        text = pattern.sub(" ", text)
    return text


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+|\n\n", text) if s.strip()]


@pytest.mark.parametrize("where", sorted(prose()))
def test_prose_types_no_measured_number_and_no_unsourced_claim(where):
    text = prose()[where]
    numbers = MEASURED.findall(bare(text))
    assert not numbers, f"{where}: a measured number typed into prose: {numbers}"
    claims = [
        s
        for s in sentences(
            re.sub(ITALIC, " ", re.sub(r"```.*?```", " ", text, flags=re.S))
        )  # code, titles
        if CLAIM.search(s) and not facts.PLACEHOLDER.search(s) and not GENERIC.search(s)
    ]
    assert not claims, f"{where}: a speed claim no data backs: {claims}"


@pytest.mark.parametrize("where", sorted(prose()))
def test_every_placeholder_resolves(where):
    filled = facts.fill(prose()[where])
    assert "{{" not in filled and "}}" not in filled


def test_the_rule_catches_a_typed_number_and_claim():
    """The check above, broken by hand: a typed speedup, share or claim is found."""
    for typed in ("it runs 1.56× faster", "about 90 % of a forward", "it costs 1.43 forwards"):
        assert MEASURED.findall(bare(typed)), typed
    assert not MEASURED.findall(bare("`threshold` λ = 0.99, arXiv:2404.16710, `0.1` paths"))
    said = "It is the fastest lossless setting here."
    assert CLAIM.search(said) and not GENERIC.search(said)


# --- a placeholder says what its source holds -----------------------------------------------------


ROWS = {
    "autoregressive": {"speedup": 1.0, "modelled_speedup": 1.0, "price_error": 0.014},
    "fast": {
        "speedup": 1.9,
        "modelled_speedup": 2.0,
        "speedup_range": [1.8, 2.1],
        "tokens_per_target_forward": 2.5,
        "lossless": "✓ identical",
        "price_error": 0.014,
    },
    "close": {"speedup": 1.95, "modelled_speedup": 1.97, "lossless": "✓ identical"},
    "slow": {"speedup": 0.8, "modelled_speedup": 0.81, "lossless": "✓ identical"},
    "lossy": {
        "speedup": 3.0,
        "modelled_speedup": 3.0,
        "lossy": True,
        "agreement": 0.3333,
        "lossless": "≈ lossy",
    },
}


@pytest.fixture
def rows(monkeypatch):
    given = {k: dict(v) for k, v in ROWS.items()}
    monkeypatch.setattr(facts, "tour_rows", lambda: given)
    return given


def test_a_placeholder_reads_its_row_by_the_one_rule(rows):
    assert facts.fill("{{tour.fast.modelled}} / {{tour.fast.tpf}}") == "2.00× / 2.50"
    assert facts.fact("tour.fast.speeds") == "modelled 2.00×, measured 1.90×, 1.80–2.10×"
    margin = readings.decision_margin(list(rows.values()))
    for name, said in (("fast", "faster than"), ("slow", "slower than")):
        assert facts.fact(f"tour.{name}.verdict") == said
        assert readings.verdict(rows[name]["modelled_speedup"], margin) in said
    rows["slow"]["modelled_speedup"] = 1.01  # within the margin
    assert facts.fact("tour.slow.verdict") == "about as fast as"
    assert facts.fact("tour.lossy.agreement") == "33%"


def test_the_fastest_is_compares_winner_or_a_tie(rows):
    # fast leads close by 1.5 %, inside the margin (2 x 1.4 %): no winner; the lossy row never
    assert facts.fact("tour.fastest") == (
        "fast (2.00× modelled) and close (1.97× modelled), within noise of each other"
    )
    rows["close"]["modelled_speedup"] = 1.5
    assert facts.fact("tour.fastest") == "fast (2.00× modelled)"


def test_an_unknown_placeholder_is_an_error_not_braces(rows):
    for key in ("tour.nobody.modelled", "tour.fast.nothing", "nowhere.fast.tpf", "prices.x.y"):
        with pytest.raises(facts.UnknownFact):
            facts.fill("{{" + key + "}}")


def test_prices_and_cards_are_read_from_their_files():
    table = facts.tour_prices()
    assert facts.fact("prices.inputs.8") == readings.fmt_ratio(table.inputs(8))
    eagle = next(v for k, v in table.drafters.items() if k.startswith("eagle"))
    assert facts.fact("prices.drafter.eagle") == readings.fmt_share(eagle)
    card = facts._json(Path(facts.ASSETS / "seq2seq" / "cmlm.json"))["held_out"]
    row = next(r for r in card["rows"] if (r["task"], r["decoding"]) == ("modes", "T=10"))
    assert facts.fact("seq2seq.cmlm.modes.T=10") == readings.fmt_share(row["valid"])


def test_the_lossy_chapter_says_what_its_runs_showed(rows):
    from ui import tour

    rows["lossy2"] = {"speedup": 0.9, "modelled_speedup": 0.9, "lossy": True}
    assert tour._lossy_chapter().endswith("1 of 2 faster here")


def test_a_benchmark_summary_is_read_by_the_same_rules(tmp_path, monkeypatch):
    import json

    rows = {
        "autoregressive": {"speedup": 1.0, "modelled_speedup": 1.0, "lossless": 5, "n": 5},
        "tree": {
            "speedup": 2.7,
            "modelled_speedup": 2.9,
            "lossless": 5,
            "n": 5,
            "tokens_per_target_forward": 4.3,
        },
        "lossy": {"speedup": 3.5, "modelled_speedup": 3.6, "lossless": 0, "n": 5, "lossy": True},
        "missed": {"speedup": 3.1, "modelled_speedup": 3.2, "lossless": 4, "n": 5},  # one differs
    }
    summary = {"command": "python -m decoders.bench", "meta": {"prices": {"spread": 0.02}}}
    (tmp_path / "mine.json").write_text(json.dumps({**summary, "rows": rows}))
    monkeypatch.setattr(facts, "BENCH", tmp_path)
    assert facts.fact("bench.mine.tree.speeds") == "modelled 2.90×, measured 2.70×"
    assert facts.fact("bench.mine.tree.verdict") == "faster than"
    assert (
        facts.fact("bench.mine.fastest") == "tree (2.90× modelled)"
    )  # neither lossy nor one that differs
    with pytest.raises(facts.UnknownFact, match="no benchmark summary"):
        facts.fact("bench.theirs.tree.tpf")


def test_a_stop_says_whether_it_was_faster_and_how_inexact(rows, monkeypatch):
    from ui import tour

    stop = next(s for s in tour.STOPS if s.key == "free")
    row = {
        "method": "free",
        "speedup": 0.92,
        "modelled_speedup": 1.2,
        "lossy": True,
        "agreement": 0.3333,
        "first_divergence": 15,
        "speedup_range": [0.9, 1.05],
    }
    monkeypatch.setattr(tour, "side_by_side_row", lambda s: row)
    said = tour.here_sentence(stop)
    assert said.startswith("In the side-by-side recording it was faster than plain decoding")
    assert "modelled 1.20×, measured 0.92×" in said and "other side of 1×" in said
    assert "33% of its output agreed with greedy's (the first difference at token 15)" in said
    row |= {"modelled_speedup": 0.8, "speedup": 0.85}
    assert "slower than" in tour.here_sentence(stop) and "other side" not in tour.here_sentence(
        stop
    )
