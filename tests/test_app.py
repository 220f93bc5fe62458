"""The app served on a free port and driven through gradio_client, as scripts would use it."""

import pytest

pytestmark = pytest.mark.slow


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
