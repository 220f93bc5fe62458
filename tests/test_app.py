"""The app served on a free port and driven through gradio_client, as scripts would use it; and the
page's checks that need no server: shared links, a stopped run, where a finished run opens, a
sampled run's badge. Trace files and the page's handlers: test_app_traces.py."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client

from conftest import PROMPTS, ROOT
from decoders import METHODS, InvalidInput, generate
from ui.links import UI_MAX_NEW_TOKENS, parse_link
from ui.live import run_live, run_to_end, stopped
from ui.traces import read_trace, recheck_lossless

slow = pytest.mark.slow


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False)


@slow
def test_run_on_the_embedded_model_matches_the_cli(client):
    text, stats, trace = client.predict(
        prompt="Write a haiku about the sea.",
        method="autoregressive",
        model="SmolLM2-135M-Instruct",
        max_new_tokens=16,
        params="{}",
        api_name="/run",
    )
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "decoders",
            "--prompt",
            "Write a haiku about the sea.",
            "--max-new-tokens",
            "16",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # one torch thread, as the app server's
    )
    expected = json.loads(cli.stdout)
    assert trace["token_ids"] == expected["token_ids"]
    assert trace["prompt_ids"] == expected["prompt_ids"]
    assert text == expected["text"]
    assert stats["new_tokens"] == len(expected["token_ids"])
    assert trace["format"] == "decoding-lab-trace" and trace["events"][-1]["type"] == "Done"
    assert trace["token_text"]  # replayable without a model


@slow
def test_five_concurrent_clients_get_their_own_results(server, tiny):
    def one(prompt):
        c = Client(server, verbose=False)
        return c.predict(
            prompt=prompt,
            method="autoregressive",
            model="tiny-random",
            max_new_tokens=12,
            params='{"temperature": 0}',
            api_name="/run",
        )

    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(one, PROMPTS[:5]))
    for prompt, (text, _stats, trace) in zip(PROMPTS[:5], results, strict=True):
        expected = generate(tiny, prompt, max_new_tokens=12)
        assert trace["token_ids"] == expected.token_ids
        assert trace["prompt"] == prompt and text == expected.text


@slow
def test_the_api_docs_name_every_output(client):
    """view_api's outputs by name and type, not "1st: Any"."""
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert [r["label"] for r in api["/run"]["returns"]] == ["text", "stats", "trace"]
    assert api["/run"]["returns"][0]["python_type"]["type"] == "str"
    assert [r["label"] for r in api["/compare"]["returns"]] == ["comparison"]


def test_compare_endpoint(client, tiny):
    out = client.predict(
        prompt="def f(x):",
        methods="autoregressive",
        model="tiny-random",
        max_new_tokens=6,
        api_name="/compare",
    )
    assert [r["method"] for r in out["rows"]] == ["autoregressive"]
    assert out["rows"][0]["speedup"] == 1.0 and out["rows"][0]["lossless"] == "reference"
    assert out["texts"]["autoregressive"] == generate(tiny, "def f(x):", max_new_tokens=6).text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(prompt="   "), "prompt is empty"),
        (dict(model="evil/model"), "not offered here"),
        (dict(method="warp-drive"), "unknown method"),
        (dict(max_new_tokens=100000), "max_new_tokens must be a whole number between 1 and 512"),
        (dict(max_new_tokens=0), "max_new_tokens must be a whole number between 1 and 512"),
        (dict(max_new_tokens=2.7), "max_new_tokens must be a whole number between 1 and 512"),
        (dict(params='{"temperature": 99}'), "temperature"),
        (dict(params='{"gamma": 3}'), "unknown parameter"),
        (dict(params="{nope"), "not valid JSON"),
    ],
)
@slow
def test_bad_input_is_a_message_not_a_traceback(client, kwargs, message):
    args = (
        dict(
            prompt="hi", method="autoregressive", model="tiny-random", max_new_tokens=4, params="{}"
        )
        | kwargs
    )
    with pytest.raises(Exception, match=message) as info:
        client.predict(**args, api_name="/run")
    assert "Traceback" not in str(info.value)


@slow
def test_cancelling_a_stream_ends_its_decode_thread(embedded):
    """Stop (or a dropped client) must not leave a worker decoding: the thread ends promptly.
    The embedded model needs ~40 s for 512 tokens, so only a real cancel ends it within 10 s."""
    import threading
    import time

    from ui import build_demo

    def decoding() -> int:
        return sum(t.name == "decode" for t in threading.enumerate())

    demo = build_demo()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=None, quiet=True)
    try:
        job = Client(url, verbose=False).submit(
            "tiny-random",
            "Tell me a long story.",
            "autoregressive",
            512,
            0.0,
            1.0,
            0,
            api_name="/run_stream",
        )
        deadline = time.time() + 30
        while decoding() == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert decoding() == 1
        job.cancel()
        deadline = time.time() + 10
        while decoding() and time.time() < deadline:
            time.sleep(0.1)
        assert decoding() == 0
    finally:
        demo.close()


# Every registered method at its defaults and at each of its presets (built from METHODS, so a new
# method is covered the day it registers), plus the drafts and shapes worth a case of their own.
EVERY_METHOD = [
    (name, params)
    for name, m in METHODS.items()
    for params in ({}, *(m.preset(p) for p in m.presets))
] + [
    ("speculative", {"draft": "self:2", "gamma": 3}),
    ("speculative", {"draft": "tiny-random", "schedule": "fixed"}),
    ("token_tree", {"draft": "tiny-random-2"}),
    ("token_tree", {"draft": "self:3", "shape": "static"}),
    ("speculative", {"draft": "eagle", "gamma": 3}),
    ("token_tree", {"draft": "eagle", "depth": 3}),
    ("self_speculative", {"skip": "attn:1 mlp:2", "threshold": 0.0}),
    ("jacobi", {"block": 4}),
    ("lookahead", {"N": 3, "W": 3, "G": 3}),
]


@slow
@pytest.mark.parametrize(("method", "params"), EVERY_METHOD)
def test_every_method_runs_through_the_api_and_is_lossless_or_says_it_is_not(
    client, tiny, method, params
):
    _text, stats, trace = client.predict(
        prompt="def f(x):",
        method=method,
        model="tiny-random",
        max_new_tokens=16,
        params=json.dumps(params),
        api_name="/run",
    )
    expected = generate(tiny, "def f(x):", max_new_tokens=16)
    assert trace["method"] == method
    if METHODS[method].lossless:
        assert trace["token_ids"] == expected.token_ids
    else:  # no claim to check: the badge must say how close it came, never "identical"
        badge = stats["lossless"]
        assert badge["status"] == "lossy"
        ours, greedy = trace["token_ids"], expected.token_ids
        same = sum(a == b for a, b in zip(ours, greedy, strict=False))
        assert badge["agreement"] == pytest.approx(same / max(len(ours), len(greedy)), abs=1e-4)
        assert 0.0 <= badge["consistency"] <= 1.0


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("speculative", {"draft": "self:99"}, "k must be in 1..4"),
        ("speculative", {"draft": "no/such-model"}, "offline|not offered|could not"),
        ("token_tree", {"draft": "eagle:/etc/passwd"}, "not offered"),
        ("token_tree", {"shape": "static", "choices": "0.0"}, "needs its parent"),
        ("self_speculative", {"skip": "attn:x"}, "integers"),
        ("self_speculative", {"skip": "mlp:7"}, "layers must be in 0..3"),
    ],
)
@slow
def test_bad_method_parameters_are_messages(client, method, params, message):
    with pytest.raises(Exception, match=message) as info:
        client.predict(
            prompt="hi",
            method=method,
            model="tiny-random",
            max_new_tokens=4,
            params=json.dumps(params),
            api_name="/run",
        )
    assert "Traceback" not in str(info.value)


# --- shared links: every bad parameter answered, by name ------------------------------------------


def test_a_good_link_prefills_the_form():
    link = parse_link(
        {
            "prompt": "Hello from a link",
            "max_new_tokens": "7",
            "seed": "3",
            "method": "jacobi",
            "block": "8",
            "model": "tiny-random",
            "step": "3",
        },
        "token_tree",
    )
    assert link.errors == []
    assert link.fields == {
        "prompt": "Hello from a link",
        "max_new_tokens": 7,
        "seed": 3,
        "method": "jacobi",
        "model": "tiny-random",
        "step": 3,  # its next run opens there
    }
    assert link.params == {"block": 8}
    # a tour link's fields are the tour's (ui/tour_show.read_link), never a method's parameter
    tour = {"tour": "5", "step": "2", "present": "1", "lesson": "1"}
    assert (
        parse_link(tour, "token_tree").errors == []
        and "step" not in parse_link(tour, "jacobi").fields
    )
    from decoders.core.params import SAMPLING_PARAMS
    from ui.links import TOUR_LINK_FIELDS

    taken = {p.name for m in METHODS.values() for p in (*m.knobs, *SAMPLING_PARAMS)}
    assert not taken & set(TOUR_LINK_FIELDS)


def test_a_link_takes_params_json_and_presets():
    link = parse_link({"method": "lookahead", "preset": "paper", "params": '{"G": 4}'}, "x")
    assert link.errors == []
    assert link.params == {**METHODS["lookahead"].preset("paper"), "G": 4}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"seed": "1e30"}, "seed must be between 0 and 2147483647, got 1e30"),
        ({"seed": "nan"}, "seed must be a finite number"),
        ({"seed": "1.5"}, "seed must be a whole number"),
        ({"temperature": "inf"}, "temperature must be a finite number"),
        ({"top_p": "abc"}, "top_p must be a number"),
        ({"max_new_tokens": "nan"}, "max_new_tokens must be a whole number between 1 and 512"),
        ({"max_new_tokens": "999"}, "max_new_tokens must be a whole number between 1 and 512"),
        ({"max_new_tokens": "1e30"}, "max_new_tokens must be a whole number between 1 and 512"),
        ({"method": "nosuch"}, "method='nosuch' is not a method here"),
        ({"model": "evil/model"}, "model 'evil/model' is not offered here"),
        ({"params": "notjson"}, "params is not valid JSON"),
        ({"params": "[1, 2]"}, "params must be a JSON object"),
        ({"params": '{"gamma": 3}'}, "params: 'gamma' is not a parameter of token_tree"),
        ({"method": "lookahead", "N": "999"}, "N must be between 2 and"),
        ({"method": "jacobi", "block": "abc"}, "block must be a number, got 'abc'"),
        ({"block": "8"}, "block is a parameter of block_draft, jacobi, not of token_tree"),
        # every method that has it (not the last one found): calm, free
        ({"threshold": "0.9"}, "threshold is a parameter of self_speculative, calm, free, not of"),
        ({"method": "token_tree", "shape": "round"}, "'shape' must be one of"),
        ({"method": "speculative", "draft": "evil/model"}, "draft 'evil/model' is not offered"),
        ({"preset": "fastest"}, "preset='fastest' is not a preset of token_tree"),
        ({"frobnicate": "1"}, "unknown link parameter 'frobnicate'"),
        ({"step": "-1"}, "step must be a whole number"),
    ],
)
def test_a_bad_link_is_answered_by_name_and_leaves_the_field_alone(query, message):
    link = parse_link({"prompt": "kept", **query}, "token_tree")
    assert len(link.errors) == 1 and message in link.errors[0], link.errors
    assert link.fields.get("prompt") == "kept"  # the good parameters still pre-fill
    bad = set(query) - {"method"} if "method" in query and len(query) > 1 else set(query)
    assert not bad & (set(link.fields) | set(link.params))


def test_the_cap_reads_the_same_in_links_the_form_and_the_api(tiny):
    link = parse_link({"max_new_tokens": "600"}, "token_tree")
    with pytest.raises(InvalidInput) as form:
        run_to_end("tiny-random", "hi", "autoregressive", 600, {})
    expected = (
        f"max_new_tokens must be a whole number between 1 and {UI_MAX_NEW_TOKENS} on this page"
    )
    assert link.errors[0].startswith(expected) and str(form.value).startswith(expected)


def test_a_stopped_run_keeps_its_trace_to_step_and_export(tiny):
    runs = run_live("tiny-random", "def f(x):", "autoregressive", 40, {})
    partial = next(runs).trace
    for _ in range(2):
        partial = next(runs).trace
    runs.close()  # what Stop does to the stream
    kept = stopped(partial)
    assert kept.meta["finish_reason"] == "cancelled" and kept.stats["new_tokens"] == len(
        kept.token_ids
    )
    assert kept.last_step == len(kept.token_ids) - 1 > 0
    again = read_trace(kept.to_json())  # exported, it imports like any trace
    assert again.token_ids == kept.token_ids and again.meta["finish_reason"] == "cancelled"
    assert recheck_lossless(again)["status"] == "identical"  # a prefix of greedy


@pytest.mark.parametrize(
    ("method", "params"),
    [("token_tree", {"draft": "self:2", "size": "fixed"}), ("mask_predict", {"m": 4, "T": 1})],
)
def test_a_finished_run_opens_at_its_methods_telling_step(method, params):
    """A run opens where its method's tour stop's rule points (and says the rule); a method
    with no stop opens at the first step with the most drafts accepted."""
    from decoders.core.events import Verify
    from ui.run_views import opened_at, showcase
    from ui.tour import DECLARED

    trace = run_to_end("tiny-random", PROMPTS[2], method, 24, params, check_lossless=False)
    stop = next(s for s in DECLARED if s.method == method)
    opened = opened_at(trace)
    assert opened.step == stop.pick(trace) and stop.rule in opened.why
    trace.meta["method"] = "rest"  # a method that declares no stop
    assert opened_at(trace).step == showcase(trace)[0]
    if method == "token_tree":
        kept = {e.step: len(e.accepted) for e in trace.events if isinstance(e, Verify)}
        best = max(kept.values())
        assert best > 0 and showcase(trace)[0] == min(s for s, n in kept.items() if n == best)


def test_the_run_streams_its_phases(tiny):
    phases = [live.phase for live in run_live("tiny-random", "hi", "prompt_lookup", 8, {})]
    assert phases[-2:] == ["checking", "done"] and set(phases[:-2]) == {"decoding"}


def test_a_sampled_runs_badge_says_what_it_keeps_for_its_kind_of_method(tiny):
    from ui.live import lossless_info

    ids = tiny.encode("hello", chat=False)
    sampled = {"temperature": 0.8}
    reference = lossless_info(tiny, "autoregressive", sampled, ids, 4, [1, 2])
    assert reference["status"] == "n/a" and "the reference itself" in reference["note"]
    exact = lossless_info(tiny, "speculative", sampled, ids, 4, [1, 2])
    assert "lossless in distribution" in exact["note"]
    lossy = lossless_info(tiny, "mask_predict", sampled, ids, 4, [1, 2])
    assert "lossy method" in lossy["note"] and "not the target's distribution" in lossy["note"]
