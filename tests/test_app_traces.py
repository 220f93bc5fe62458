"""Trace files as the page reads them, with no server: checked for meaning (stats recomputed, the
lossless badge rechecked, a bad field named), bounded work whatever the file says (events that
would mislead or hang the views, caps, no model loaded to read one); and every page handler
answers with a message, whatever fails inside."""

import copy
import json

import pytest

from conftest import PROMPTS
from decoders.core.errors import TraceError
from ui.links import UI_MAX_NEW_TOKENS
from ui.live import run_to_end
from ui.traces import EXAMPLE_PROMPTS, load_example, read_trace, recheck_lossless

# --- trace files: checked for meaning, the badge recomputed -----------------------------------------


@pytest.fixture(scope="module")
def tiny_trace(tiny) -> dict:
    trace = run_to_end("tiny-random", "def f(x):", "speculative", 12, {"draft": "self:2"})
    return json.loads(trace.to_json())


def edit(data: dict, fn) -> str:
    data = copy.deepcopy(data)
    fn(data)
    return json.dumps(data)


def first(data: dict, kind: str) -> dict:
    return next(e for e in data["events"] if e["type"] == kind)


def test_a_good_trace_is_read_with_its_stats_recomputed_and_its_badge_rechecked(tiny_trace):
    forged = edit(tiny_trace, lambda d: first(d, "Done")["stats"].update(new_tokens=999))
    trace = read_trace(forged)
    assert trace.stats["new_tokens"] == len(tiny_trace["token_ids"])  # from the events
    assert "lossless" not in trace.meta  # the file's claim is dropped...
    badge = recheck_lossless(trace)  # ...and recomputed against greedy with the model here
    assert badge["status"] == "identical" and badge["compared"] == len(trace.token_ids)


def test_a_trace_that_differs_from_greedy_is_shown_as_differing(tiny_trace):
    def swap(d):
        commit = [e for e in d["events"] if e["type"] == "Commit"][2]
        commit["tokens"][0] = (commit["tokens"][0] + 1) % 100
        d["token_ids"] = [t for e in d["events"] if e["type"] == "Commit" for t in e["tokens"]]
        d["lossless"] = {"status": "identical", "compared": 12}  # a lie the page must not repeat

    badge = recheck_lossless(read_trace(edit(tiny_trace, swap)))
    assert badge["status"] == "differs"


def test_a_trace_from_a_model_not_here_is_not_checked(tiny_trace):
    trace = read_trace(edit(tiny_trace, lambda d: d.update(model="someone/else")))
    assert recheck_lossless(trace)["status"] == "not checked"


def _commit_at_huge_step(d):
    first(d, "Commit")["step"] = 10**9


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda d: d.update(n_layers="abc"), "'n_layers' must be a whole number"),
        (lambda d: d.update(n_layers=10**9), "'n_layers' must be a whole number"),
        (lambda d: d.update(method="nosuch"), "'method' must be one of"),
        (lambda d: d.update(model=3), "'model' must be a model id"),
        (lambda d: d.update(max_new_tokens=0), "'max_new_tokens' must be a whole number"),
        (lambda d: d.update(max_new_tokens=2), "more than its max_new_tokens"),
        (lambda d: d.update(prompt_ids=[]), "'prompt_ids' is empty"),
        (lambda d: d.update(prompt_ids=[-1]), "'prompt_ids' holds token id -1 at position 0"),
        (lambda d: d.update(params=[1]), "'params' must be an object"),
        (lambda d: d.update(token_ids=[1, 2]), "'token_ids' differs from the committed tokens at "),
        (_commit_at_huge_step, "step 1000000000 is outside"),
        (
            lambda d: first(d, "Commit")["tokens"].__setitem__(0, 10**9),
            "holds token id 1000000000 at position 0, outside the model's vocabulary (0..49151)",
        ),
        (
            lambda d: first(d, "Commit")["probs"].__setitem__(0, 2.0),
            "probabilities must be in [0, 1]",
        ),
        (lambda d: first(d, "Commit")["origins"].__setitem__(0, "magic"), "origins must be among"),
        (lambda d: first(d, "Draft")["parents"].__setitem__(0, 5), "each parent must be -1"),
        (lambda d: first(d, "Verify")["accepted"].append(50), "accepted nodes must be among"),
        (lambda d: d["events"].append(dict(first(d, "Done"))), "Done must be the last event"),
        (lambda d: first(d, "Prefill")["prompt_ids"].append(1), "prompt_ids differ"),
        (lambda d: first(d, "Forward").update(kind="warp"), "kind must be among"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_field(tiny_trace, fn, message):
    data = edit(tiny_trace, fn)
    with pytest.raises(TraceError) as info:
        read_trace(data)
    assert message in str(info.value)


def test_the_shipped_example_trace_replays_without_a_model():
    example = load_example()
    assert example is not None, "assets/example_trace.json is missing or invalid"
    assert example.meta["method"] == "token_tree" and len(example.token_ids) == 64
    assert example.meta["prompt"] == EXAMPLE_PROMPTS[0]
    assert example.meta["lossless"]["status"] == "not checked"  # recorded, not re-checked
    assert "recorded as identical" in example.meta["lossless"]["note"]


def test_a_copy_source_outside_the_context_is_refused(tiny):
    for prompt in PROMPTS:  # the first whose run copies something
        data = json.loads(run_to_end("tiny-random", prompt, "prompt_lookup", 32, {}).to_json())
        sources = [e for e in data["events"] if e["type"] == "CopySource"]
        if sources:
            break
    assert sources, "prompt lookup copied nothing on any test prompt"
    read_trace(json.dumps(data))  # as recorded: fine
    sources[0]["start"] = 10**6
    with pytest.raises(TraceError, match="the copied span must lie within"):
        read_trace(json.dumps(data))


@pytest.fixture(scope="module")
def method_traces(tiny) -> dict[str, dict]:
    """One small trace per method whose events the holes below forge."""
    runs = {
        "jacobi": ("jacobi", {}),
        "lookahead": ("lookahead", {"W": 2, "N": 3, "G": 2}),
        "token_tree": ("token_tree", {"draft": "self:2", "size": "fixed"}),
        "self_speculative": ("self_speculative", {}),
        "mask_predict": ("mask_predict", {"m": 4, "T": 2}),
        "space": ("space", {"k": 2, "groups": 2}),
    }
    return {
        name: json.loads(run_to_end("tiny-random", "def f(x): return f(x)", m, 16, p).to_json())
        for name, (m, p) in runs.items()
    }


def _last(data: dict, kind: str) -> dict:
    return [e for e in data["events"] if e["type"] == kind][-1]


def _bad_accepted_path(d):
    verify = next(e for e in d["events"] if e["type"] == "Verify" and len(e["accepted"]) == 0)
    draft = next(e for e in d["events"] if e["type"] == "Draft" and e["step"] == verify["step"])
    # A node that is not the root's child cannot be accepted first.
    verify["accepted"] = [next(j for j, p in enumerate(draft["parents"]) if p != -1)]


def _huge_draft(d):
    draft = first(d, "Draft")
    n = 200
    draft.update(tokens=[1] * n, parents=list(range(-1, n - 1)), probs=[1.0] * n)


@pytest.mark.parametrize(
    ("method", "fn", "message"),
    [
        # The Jacobi trajectory spans absolute positions from `start`: 0 or 10^9 would hang the view.
        ("jacobi", lambda d: _last(d, "JacobiIteration").update(start=10**9), "start must be"),
        ("jacobi", lambda d: _last(d, "JacobiIteration").update(start=0), "start must be"),
        ("jacobi", lambda d: first(d, "JacobiIteration").update(iteration=-3), "iteration must"),
        ("jacobi", lambda d: first(d, "JacobiIteration").update(iteration=10**9), "iteration must"),
        ("lookahead", lambda d: first(d, "NgramPool").update(n=99), "n must be in 2..12"),
        ("lookahead", lambda d: first(d, "LookaheadWindow")["outputs"].append(1), "equally wide"),
        (
            "lookahead",
            lambda d: first(d, "LookaheadWindow")["levels"][0].append(1),
            "equally wide",
        ),
        (
            "lookahead",
            lambda d: first(d, "AttentionMask")["input_ids"].__setitem__(0, 10**9),
            "input_ids' holds token id 1000000000 at position 0, outside",
        ),
        (
            "lookahead",
            lambda d: first(d, "AttentionMask")["input_ids"].append(1),
            "one entry per label",
        ),
        (
            "lookahead",
            lambda d: first(d, "AttentionMask")["branches"].append("x"),
            "one entry per label",
        ),
        ("token_tree", _huge_draft, "a draft has at most"),
        ("token_tree", _bad_accepted_path, "form a path from the draft's root"),
        (
            "self_speculative",
            lambda d: first(d, "DraftStop").update(reason="bored"),
            "reason must be one of",
        ),
        (
            "mask_predict",
            lambda d: first(d, "MaskPredictStep")["probs"].append(0.5),
            "tokens and probs must be equally long",
        ),
        (
            "mask_predict",
            lambda d: first(d, "MaskPredictStep")["tokens"].extend([1] * 999),
            "at most",
        ),
        (
            "mask_predict",
            lambda d: first(d, "MaskPredictStep").update(remasked=[7]),
            "positions in the block",
        ),
        (
            "mask_predict",
            lambda d: _last(d, "MaskPredictStep").update(position=0),
            "position must be the",
        ),
        (
            "space",
            lambda d: first(d, "MaskGroups")["groups"][0].append(1),
            "groups and probs must have the same shape",
        ),
        ("space", lambda d: _last(d, "MaskGroups").update(handed=9), "handed must name"),
        (
            "token_tree",
            lambda d: d["params"].update(temperature="0.5"),
            "'params.temperature' must be a float",
        ),
        ("token_tree", lambda d: d["params"].update(depth=99), "'depth' must be in"),
        ("token_tree", lambda d: d["params"].update(bogus=1), "unknown parameter 'bogus'"),
    ],
)
def test_a_trace_whose_events_would_mislead_or_hang_the_views_is_refused(
    method_traces, method, fn, message
):
    data = method_traces[method]
    read_trace(json.dumps(data))  # as recorded: fine
    with pytest.raises(TraceError) as info:
        read_trace(edit(data, fn))
    assert message in str(info.value)


# --- trace files: bounded work, whatever the file says ----------------------------------------------


def test_a_trace_past_the_pages_cap_is_refused_with_the_pages_cap(tiny_trace):
    with pytest.raises(TraceError) as info:
        read_trace(edit(tiny_trace, lambda d: d.update(max_new_tokens=UI_MAX_NEW_TOKENS + 1)))
    assert f"'max_new_tokens' must be a whole number in 1..{UI_MAX_NEW_TOKENS}" in str(info.value)


def test_a_trace_with_a_huge_prompt_is_refused(tiny_trace):
    with pytest.raises(TraceError, match="'prompt_ids' holds 100000 tokens; the limit is"):
        read_trace(edit(tiny_trace, lambda d: d.update(prompt_ids=[1] * 100_000)))


def test_a_longer_trace_than_the_page_runs_is_not_rechecked(tiny_trace):
    trace = read_trace(json.dumps(tiny_trace))
    trace.meta["max_new_tokens"] = UI_MAX_NEW_TOKENS + 1  # as a trace made by the CLI could say
    badge = recheck_lossless(trace)
    assert badge["status"] == "not checked" and "longer than this page runs" in badge["note"]


def test_reading_a_trace_loads_no_model(tiny_trace, monkeypatch):
    import decoders.core.models
    from decoders.core.models import EMBEDDED_ID

    def refuse(*args):
        raise AssertionError("read_trace loaded a model")

    monkeypatch.setattr(decoders.core.models, "_load", refuse)
    # The embedded model is offered here: its trace is read without loading it.
    data = edit(tiny_trace, lambda d: d.update(model=EMBEDDED_ID, vocab_size=50_000))
    assert read_trace(data).meta["model"] == EMBEDDED_ID
    # Without the model, ids are held to the file's own vocabulary.
    bad = edit(
        tiny_trace,
        lambda d: (
            d.update(model="someone/not-loaded", vocab_size=100),
            d.update(prompt_ids=[500]),
        ),
    )
    with pytest.raises(
        TraceError, match=r"token id 500 at position 0, outside the model's vocabulary \(0\.\.99\)"
    ):
        read_trace(bad)


def test_the_recheck_refuses_ids_beyond_the_models_vocabulary(tiny_trace, monkeypatch):
    import ui.traces

    monkeypatch.setattr(ui.traces, "loaded", lambda model: None)  # as if tiny-random were cold
    big = edit(tiny_trace, lambda d: (d.update(vocab_size=10**6), d["prompt_ids"].append(900_000)))
    big = edit(json.loads(big), lambda d: first(d, "Prefill")["prompt_ids"].append(900_000))
    badge = recheck_lossless(read_trace(big))
    assert badge["status"] == "not checked" and "beyond tiny-random's vocabulary" in badge["note"]


def test_an_import_is_queued_with_the_runs():
    from ui import build_demo

    demo = build_demo()
    handlers = {getattr(f.fn, "__name__", ""): f for f in demo.fns.values()}
    assert handlers["on_import"].concurrency_id == handlers["on_run"].concurrency_id == "decode"


# --- every handler answers with a message, whatever fails inside ------------------------------------


@pytest.fixture(scope="module")
def handlers() -> dict:
    """The page's handler functions by name, as gradio calls them."""
    from ui import build_demo

    return {getattr(f.fn, "__name__", ""): f.fn for f in build_demo().fns.values()}


def _said(update: dict) -> list[str]:
    return [v for v in update.values() if isinstance(v, str) and "went wrong" in v]


def test_a_failing_view_during_a_run_is_a_message_with_the_views_cleared(
    tiny, handlers, monkeypatch
):
    import ui.run_tab
    import ui.run_views

    def broken(*args, **kwargs):
        raise IndexError("index 2 is out of bounds")

    for module in (ui.run_tab, ui.run_views):  # the tab's handlers and the views they draw
        monkeypatch.setattr(module, "method_panel", broken)
    updates = list(
        handlers["on_run"](None, "tiny-random", "hi", "autoregressive", 4, 0.0, 1.0, 0, None, {})
    )
    last = updates[-1]
    assert _said(last) == [
        "⚠️ **Something went wrong inside the app: IndexError: index 2 is out of bounds**"
    ]
    assert not any(hasattr(v, "to_plotly_json") for v in last.values())  # no stale figure kept


def test_a_failing_export_after_an_import_is_a_message(tiny_trace, handlers, monkeypatch, tmp_path):
    import ui.run_views
    import ui.run_wires

    def full_disk(trace):
        raise OSError(28, "No space left on device")

    for module in (ui.run_wires, ui.run_views):
        monkeypatch.setattr(module, "_export", full_disk)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(tiny_trace))
    last = list(handlers["on_import"](None, str(path), None))[-1]
    assert _said(last) and "OSError" in _said(last)[0] and "No space left" in _said(last)[0]


def test_the_pages_opening_redraw_leaves_views_an_import_replaced(
    tiny_trace, handlers, tmp_path, monkeypatch
):
    """On a busy server the page's opening redraw of its example, and a link's form filling, can
    land after a quick import: a bad file's cleared views and its message must stand."""
    import types

    import ui.run_session
    from ui.traces import load_example

    monkeypatch.setattr(ui.run_session, "REPLACED", set())
    example = load_example()
    opening = types.SimpleNamespace(session_hash="opened-then-imported")
    drawn = handlers["on_open"](opening, example, example.last_step, 700)
    assert any(isinstance(v, str) and "dl-tok" in v for v in drawn.values())  # the example
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**tiny_trace, "n_layers": "abc"}))
    cleared = list(handlers["on_import"](opening, str(bad), None))[-1]
    assert any(isinstance(v, str) and "Could not import the trace" in v for v in cleared.values())
    assert opening.session_hash in ui.run_session.REPLACED
    late = handlers["on_open"](opening, example, example.last_step, 700)
    assert not any(isinstance(v, str) and "dl-tok" in v for v in late.values())
    opening.query_params = {"method": "jacobi", "prompt": "hi"}  # opened from a link
    linked = handlers["from_url"](opening)
    assert not any(isinstance(v, str) and "link" in v for v in linked.values())
    assert "hi" not in linked.values()
    fresh = types.SimpleNamespace(session_hash="fresh", query_params=opening.query_params)
    assert "hi" in handlers["from_url"](fresh).values()  # a page nothing replaced is filled in


def test_a_closed_page_leaves_nothing_of_its_session_behind(handlers, monkeypatch):
    """The per-session entries (Stop, the views' width, replaced views, a tour stop's live run)
    go when the page closes, and only that page's."""
    import types

    import ui.run_session
    import ui.tour

    for name, empty in (("STOPS", {}), ("WIDTHS", {}), ("REPLACED", set())):
        monkeypatch.setattr(ui.run_session, name, empty)
    monkeypatch.setattr(ui.tour, "LIVE", {})
    closing, staying = (types.SimpleNamespace(session_hash=h) for h in ("closing", "staying"))
    for page in (closing, staying):
        ui.run_session.STOPS[page.session_hash] = 1.0
        handlers["on_step"](page, None, 0, 700)  # says its width
        ui.run_session.REPLACED.add(page.session_hash)
        ui.tour.LIVE[page.session_hash] = "jacobi"
    handlers["on_close"](closing)
    from ui import build_demo

    unload = [f for f in build_demo().fns.values() if any(t[1] == "unload" for t in f.targets)]
    assert [f.fn.__name__ for f in unload] == ["on_close"]  # what gradio calls when a page closes
    for kept in (
        ui.run_session.STOPS,
        ui.run_session.WIDTHS,
        ui.run_session.REPLACED,
        ui.tour.LIVE,
    ):
        assert "closing" not in kept and "staying" in kept


@pytest.mark.parametrize("budget", [2.7, float("nan"), 10**9])
def test_the_run_api_answers_a_bad_budget_by_name(tiny, handlers, budget):
    import gradio as gr

    with pytest.raises(gr.Error) as info:
        handlers["run"]("hi", "autoregressive", "tiny-random", budget, "{}")
    assert "max_new_tokens must be a whole number between 1 and" in str(info.value)
