"""The app served on a free port and driven through gradio_client, as scripts would use it."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client

from conftest import PROMPTS, ROOT
from decoders import generate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False)


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
    )
    expected = json.loads(cli.stdout)
    assert trace["token_ids"] == expected["token_ids"]
    assert trace["prompt_ids"] == expected["prompt_ids"]
    assert text == expected["text"]
    assert stats["new_tokens"] == len(expected["token_ids"])
    assert trace["format"] == "decoding-lab-trace" and trace["events"][-1]["type"] == "Done"
    assert trace["token_text"]  # replayable without a model


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
        (dict(max_new_tokens=100000), "capped at"),
        (dict(max_new_tokens=0), "between 1 and"),
        (dict(params='{"temperature": 99}'), "temperature"),
        (dict(params='{"gamma": 3}'), "unknown parameter"),
        (dict(params="{nope"), "not valid JSON"),
    ],
)
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


def test_cancelling_a_stream_ends_its_decode_thread(embedded):
    """Stop (or a dropped client) must not leave a worker decoding: the thread ends promptly.
    The embedded model needs ~40 s for 512 tokens, so only a real cancel ends it within 10 s."""
    import threading
    import time

    from decoders import METHODS
    from ui import build_demo

    def decoding() -> int:
        return sum(t.name == "decode" for t in threading.enumerate())

    demo = build_demo()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=None, quiet=True)
    try:
        controls = [p.default for m in METHODS.values() for p in m.params]
        job = Client(url, verbose=False).submit(
            "tiny-random",
            "Tell me a long story.",
            "autoregressive",
            512,
            0.0,
            1.0,
            0,
            *controls,
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


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("prompt_lookup", {}),
        ("speculative", {"draft": "self:2", "gamma": 3}),
        ("speculative", {"draft": "tiny-random", "schedule": "fixed"}),
        ("token_tree", {"draft": "tiny-random-2"}),
        ("token_tree", {"draft": "self:3", "shape": "static"}),
        ("speculative", {"draft": "eagle", "gamma": 3}),
        ("token_tree", {"draft": "eagle", "depth": 3}),
        ("self_speculative", {"skip": "attn:1 mlp:2", "threshold": 0.0}),
        ("self_speculative", {}),
    ],
)
def test_every_method_runs_through_the_api_and_is_lossless(client, tiny, method, params):
    _text, _stats, trace = client.predict(
        prompt="def f(x):",
        method=method,
        model="tiny-random",
        max_new_tokens=16,
        params=json.dumps(params),
        api_name="/run",
    )
    expected = generate(tiny, "def f(x):", max_new_tokens=16)
    assert trace["token_ids"] == expected.token_ids
    assert trace["method"] == method


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
