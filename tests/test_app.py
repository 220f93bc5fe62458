"""The app served on a free port and driven through gradio_client, as scripts would use it."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {
        **os.environ,
        "DECODING_LAB_MODEL": "tiny-random",
        "GRADIO_SERVER_PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    proc = subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited: {proc.stdout.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("app did not start in 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_run_endpoint_streams_the_same_tokens_as_the_engine(server, tiny):
    from gradio_client import Client

    from decoders import generate

    client = Client(server, verbose=False)
    text, stats = client.predict("def f(x):", "autoregressive", 8, api_name="/run")
    expected = generate(tiny, "def f(x):", max_new_tokens=8)
    assert text == expected.text
    assert stats["new_tokens"] == 8 and stats["finish_reason"] == "length"


def test_bad_input_is_a_message_not_a_traceback(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    with pytest.raises(Exception, match="prompt is empty") as info:
        client.predict("   ", "autoregressive", 8, api_name="/run")
    assert "Traceback" not in str(info.value)
