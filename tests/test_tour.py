"""The guided tour (ui/tour.py, ui/tour_tab.py): every stop's recording reads, opens at the step
its rule names and draws; the tour covers every method; and (slow) every recording is what the
current decoders produce on the embedded model, so the tour cannot go stale. The page itself is
walked in tests/test_browser.py."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from decoders import METHODS
from decoders.core.models import EMBEDDED_ID
from ui.compare import work_of
from ui.glossary import plain
from ui.live import run_to_end
from ui.tour import (
    BUDGET,
    DECLARED,
    PROMPT,
    SIDE_BY_SIDE,
    STOPS,
    copied_won,
    decisions,
    draft_fingerprint,
    most_committed,
    pin_prices,
    recorded,
    replay_note,
    side_by_side,
    spec_of_stop,
)
from ui.tour_marks import DIM_INK, UNKNOWN, VERDICT_COLOURS, question
from ui.tour_show import KEYS, link, moved, path, read_link, show


def test_the_tour_visits_every_method_in_order_of_the_lesson():
    # Every stop a method declares is in the tour once recorded; the recording covers them all
    # (a method added since joins when `python scripts/make_tour.py` records it).
    recorded_specs = {str(r["method"]) for r in side_by_side()["rows"]}
    tour_specs = {spec_of_stop(s) for s in STOPS if not s.same_run_as}
    assert tour_specs == recorded_specs, "a recorded run with no stop, or a stop left out"
    assert {s.method for s in STOPS} <= set(METHODS)
    assert len({s.method for s in STOPS}) >= 18
    waiting = {s.key for s in DECLARED} - {s.key for s in STOPS}
    if waiting:
        warnings.warn(f"tour stops not recorded yet: {sorted(waiting)}", stacklevel=1)
    assert [s.key for s in STOPS][:5] == [
        "autoregressive",
        "prompt_lookup",
        "sam",
        "speculative",
        "token_tree",
    ]
    chapters = [s.chapter for s in STOPS]
    assert chapters == sorted(chapters), "a chapter's stops sit together, chapters in order"
    assert len(KEYS) == len(set(KEYS)) == len(STOPS) + 2  # and side by side, and translation


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.key)
def test_each_stop_opens_at_its_step_with_narration_and_a_figure(stop):
    trace = recorded(stop.recording)
    at = stop.pick(trace)
    assert not stop.view or stop.view in METHODS[stop.method].views  # one of the method's own
    assert 0 <= at <= trace.last_step
    assert 40 <= len(stop.narration.split()) <= 110, "about 80 words"
    view = show(stop.key, 700)
    said = plain(view["narration"])  # the glossary's marks taken out
    assert f"step {at} of {trace.last_step}" in said
    assert stop.look in said.replace("&#x27;", "'")
    assert "dl-term" in view["narration"]  # its terms defined where they appear
    fig = view["panel"]
    assert fig.data, "the method's view at that step has something drawn"
    if stop.focus:  # what the stop points at stays bright, the rest is dimmed
        names = [t.name or "" for t in fig.data]
        assert any(any(f in n for f in stop.focus) for n in names)
        dimmed = [t for t in fig.data if not any(f in (t.name or "") for f in stop.focus)]
        assert dimmed and all(
            t.opacity == 0.5 or getattr(t.marker, "opacity", None) == 0.5 for t in dimmed
        )
        # projector-safe: what is dimmed keeps its text dark (9:1 on white)
        assert all(t.textfont.color == DIM_INK for t in dimmed if t.text is not None)


def test_the_step_rules_pick_what_they_say():
    tree = recorded("token_tree")
    # the most committed step commits no fewer tokens than any other
    counts = {e.step: len(e.tokens) for e in tree.events if type(e).__name__ == "Commit"}
    assert counts[most_committed(tree)] == max(counts.values())
    # the copied stop opens where the target accepted copied nodes
    at = copied_won(tree)
    draft = next(e for e in tree.events if type(e).__name__ == "Draft" and e.step == at)
    verify = next(e for e in tree.events if type(e).__name__ == "Verify" and e.step == at)
    assert set(draft.copied) & set(verify.accepted), "the copied branch won at that step"
    assert "copied" in show("token_tree_copy", 1000)["panel"].layout.title.subtitle.text


def test_the_last_stop_compares_every_recording_side_by_side():
    record = side_by_side()
    rows = {r["method"]: r for r in record["rows"]}
    assert record["max_new_tokens"] == BUDGET and record["prompt"] == PROMPT
    assert record["rounds"] >= 3
    for stop in STOPS:
        if stop.same_run_as:
            continue
        row = rows[spec_of_stop(stop)]
        # the comparison ran the same decode as the stop's recording
        assert row["work"] == work_of(recorded(stop.key)), stop.key
    view = show(SIDE_BY_SIDE)
    assert view["panel"].data and view["second"] is not None


def test_the_translation_stop_shows_the_lab_on_the_shipped_models():
    from ui.tour import TRANSLATION

    view = show(TRANSLATION)
    assert f"Stop {len(KEYS)} of {len(KEYS)}" in plain(view["narration"])
    assert "nat_kd" in view["tokens"] and "mixes" in view["tokens"]  # a NAT mixing, shown
    names = {t.name.split(":")[0] for t in view["panel"].data}  # "cmlm: Mask-Predict …"
    assert {"ar", "nat", "nat_kd", "cmlm", "flowseq", "depa"} <= names


# --- the recordings against the current decoders (slow) ---------------------------------------


@pytest.mark.slow
def test_every_recording_is_what_the_decoders_make_now():
    """Re-run each stop on the embedded model. Everywhere: every lossless stop identical to
    greedy (the autoregressive stop, re-run first), the drafting methods above one token per
    forward on this code prompt, each stop's rule finding its step in the new run. Step for step
    the same decisions as recorded, for a head-drafted stop only where this machine's kernels
    draft the recording machine's bits (the same draft_fingerprint). A failure means: re-run
    `python scripts/make_tour.py`. (This is also the lossless grid's run of every method at its
    defaults on the embedded model: tests/test_lossless.py runs the paper's settings.)"""
    greedy: list[int] = []
    stale, other_drafts = [], []
    same_drafts = side_by_side().get("draft_fingerprint") == draft_fingerprint()
    for stop in STOPS:
        if stop.same_run_as:
            continue
        was = recorded(stop.key)
        pin_prices(was)
        now = run_to_end(
            EMBEDDED_ID, PROMPT, stop.method, BUDGET, dict(stop.params), check_lossless=False
        )
        if stop.method == "autoregressive":
            greedy = now.token_ids
        if decisions(now.events) != decisions(was.events):
            drafted = not same_drafts and stop.head_drafted
            (other_drafts if drafted else stale).append(stop.key)
        lossless = METHODS[stop.method].claims_lossless(dict(stop.params))
        if lossless:
            assert now.token_ids == greedy, stop.key
        if was.stats["tokens_per_target_forward"] > 1.0:  # it drafted well on code then
            assert now.stats["tokens_per_target_forward"] > 1.0, stop.key
        committed = {e.step for e in now.events if type(e).__name__ == "Commit" and e.step}
        for rule in {s.pick for s in STOPS if s.recording == stop.key}:
            assert rule(now) in committed, stop.key  # its rule finds a step of this run
    assert not stale, f"recordings out of date: {stale}; run python scripts/make_tour.py"
    if other_drafts:
        print(f"another draft fingerprint here: {other_drafts} checked without their steps")


def test_a_live_run_says_whether_it_replayed_its_recording(monkeypatch):
    """The note a tour stop's live run gets: the same steps, or why not, by what differs
    (checked on the recordings themselves: no model runs)."""
    import ui.tour as tour

    stop = next(s for s in STOPS if s.key == "token_tree")
    trace = recorded(stop.key)
    assert replay_note(stop, trace).startswith("It took the same steps")
    other = recorded("speculative")  # another run's decisions, and no Priced event
    monkeypatch.setattr(tour, "draft_fingerprint", lambda: "elsewhere")
    note = replay_note(stop, other)
    assert "other steps" in note and "prices" in note and "rounds bfloat16 differently" in note
    monkeypatch.setattr(tour, "draft_fingerprint", lambda: side_by_side()["draft_fingerprint"])
    assert "bfloat16" not in replay_note(stop, other)


def test_a_stops_live_run_opens_at_the_step_its_rule_picks_once():
    from ui.tour import LIVE, tour_step

    trace = recorded("speculative")
    LIVE["s1"] = "speculative"
    rule = "the tour stop's rule, the step that committed the most tokens"
    opened = tour_step("s1", trace)
    assert (opened.step, opened.why, opened.note) == (
        most_committed(trace),
        rule,
        replay_note(STOPS[3], trace),
    )
    assert tour_step("s1", trace) is None  # once: the session's next run opens as usual
    LIVE["s1"] = "jacobi"
    assert tour_step("s1", trace) is None  # another method's run: not this stop's


def test_a_question_paints_the_answer_over_and_the_reveal_shows_it():
    """Predict, then reveal: at its telling step a stop that asks shows its question, with the
    verdict colours painted over and its concealed entries hidden; the reveal is the stop's own
    figure. The figure `question` is given stays as it was."""
    asking = [s for s in STOPS if s.ask]
    assert {"speculative", "prompt_lookup", "jacobi", "calm"} <= {s.key for s in asking}
    for stop in asking:
        asked, shown = show(stop.key, 700, asking=True), show(stop.key, 700)
        assert asked["asked"] == stop.ask and not shown["asked"]
        # its tokens stop before the step: none to come (greyed), none rolled back
        assert not {"dl-tok dl-pending", "dl-tok dl-ghost"} & set(
            re.findall(r"dl-tok [a-z-]+", asked["tokens"])
        )
        q = asked["panel"].to_plotly_json()
        colours = json.dumps([[t for t in q["data"] if t.get("visible") is not False], q["layout"]])
        assert not any(c in colours for c in VERDICT_COLOURS), stop.key
        hidden = [t.name for t in asked["panel"].data if t.visible is False]
        assert all(any(c in (n or "") for n in hidden) for c in stop.conceal), stop.key
        assert UNKNOWN in colours or hidden, stop.key  # something of the answer is held back
    fig = show("speculative", 700)["panel"]
    before = fig.to_json()
    question(fig, ("target",))
    assert fig.to_json() == before
    # another step than the telling one asks nothing
    assert not show("speculative", 700, step=1, asking=True)["asked"]


def test_tour_links_open_a_stop_at_a_step_and_name_a_bad_value():
    n = KEYS.index("speculative") + 1
    last = recorded("speculative").last_step
    assert read_link({}) is None
    assert read_link({"tour": str(n), "step": "2"}) == {
        "key": "speculative",
        "step": 2,
        "lesson": False,
        "error": "",
    }
    assert link("speculative", 2, False) == f"?tour={n}&step=2"
    for bad, names in (({"tour": "0"}, "tour='0'"), ({"tour": "x"}, "tour='x'")):
        got = read_link(bad)
        assert got["key"] == KEYS[0] and names in got["error"]
    got = read_link({"tour": str(n), "step": str(last + 1)})
    assert got["step"] is None and f"0–{last}" in got["error"]
    # the lesson: about 15 minutes in about eight stops, walked in the tour's order
    lesson = path(True)
    assert 6 <= len(lesson) <= 10 and lesson == [k for k in KEYS if k in lesson]
    assert moved(lesson[0], 1, True) == lesson[1] and moved(lesson[-1], 1, True) == lesson[-1]
    assert moved(KEYS[KEYS.index(lesson[1]) + 1], -1, True) == lesson[1]  # off the path: back on
