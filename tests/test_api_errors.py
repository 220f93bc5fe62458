"""Bad input fails fast with a project error and a message that says what to do."""

import time

import pytest

from decoders import (
    MAX_NEW_TOKENS_CAP,
    InvalidInput,
    InvalidParameter,
    ModelLoadError,
    UnknownMethod,
    generate,
    load_model,
    stream,
)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(prompt=""), InvalidInput, "prompt is empty"),
        (dict(prompt="   \n"), InvalidInput, "prompt is empty"),
        (dict(prompt=[]), InvalidInput, "prompt is empty"),
        (dict(prompt=[1, 10**9]), InvalidInput, "prompt ids must be in"),
        (dict(prompt="x" * 70_000), InvalidInput, "characters; the limit"),
        (dict(max_new_tokens=0), InvalidInput, "between 1 and"),
        (dict(max_new_tokens=-3), InvalidInput, "between 1 and"),
        (dict(max_new_tokens=MAX_NEW_TOKENS_CAP + 1), InvalidInput, "between 1 and"),
        (dict(max_new_tokens=2.5), InvalidInput, "must be an integer"),
        (dict(method="medusa-9000"), UnknownMethod, "valid: autoregressive"),
        (dict(gamma=4), InvalidParameter, "valid: temperature, top_p, seed"),
        (dict(temperature=-1), InvalidParameter, "temperature"),
        (dict(temperature="hot"), InvalidParameter, "expects float"),
        (dict(temperature=float("nan")), InvalidParameter, "finite number"),
        (dict(top_p="nan"), InvalidParameter, "finite number"),
        (dict(method="calm", threshold=float("inf")), InvalidParameter, "finite number"),
        (dict(seed=1.5), InvalidParameter, "expects int"),
    ],
)
def test_bad_requests(tiny, kwargs, error, message):
    args = {"prompt": "hello", "max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=message):
        generate(tiny, **args)


def test_stream_validates_before_decoding(tiny):
    with pytest.raises(InvalidInput):
        stream(tiny, "", "autoregressive", 4)  # raised at call time, not on first next()


def test_prompt_plus_budget_longer_than_context_names_both_lengths(tiny):
    with pytest.raises(
        InvalidInput, match=r"prompt \(2040 tokens\) plus max_new_tokens \(20\).*context of 2048"
    ):
        generate(tiny, [5] * 2040, max_new_tokens=20)


def test_unknown_model_without_network_fails_fast_and_points_offline():
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="embedded model works offline"):
        load_model("no-such-org/no-such-model-123")
    assert time.perf_counter() - start < 20


def test_unknown_dtype(tiny):
    with pytest.raises(InvalidInput, match="unknown dtype"):
        load_model("tiny-random", dtype="float8")


def test_models_load_once(tiny):
    assert load_model("tiny-random") is tiny


def test_a_local_path_loads_through_the_hub_code_path(tiny, tmp_path):
    """The same from_pretrained path a hub id takes, on a checkpoint saved to disk."""
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    bundle = load_model(str(tmp_path))
    assert bundle.model_id == str(tmp_path)
    a = generate(bundle, "def f(x):", max_new_tokens=6, chat=False).token_ids
    assert a == generate(tiny, "def f(x):", max_new_tokens=6, chat=False).token_ids


@pytest.fixture(scope="module")
def gpt2(tiny, tmp_path_factory):
    """A tiny GPT-2 (not Llama-style: its layers cannot be run one by one) on tiny's tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(vocab_size=len(tiny.tokenizer), n_embd=32, n_layer=2, n_head=2)
    config.bos_token_id = config.eos_token_id = tiny.tokenizer.eos_token_id
    GPT2LMHeadModel(config).save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return load_model(str(path))


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("autoregressive", {}),
        ("prompt_lookup", {}),
        ("jacobi", {}),
        ("lookahead", {}),
        ("speculative", {"draft": "self:2"}),  # all its layers: a whole-model forward
    ],
)
def test_methods_that_call_the_whole_model_run_on_a_non_llama_model(gpt2, method, params):
    ref = generate(gpt2, "def f(x): return x", max_new_tokens=8, chat=False).token_ids
    assert generate(gpt2, "def f(x): return x", method, 8, chat=False, **params).token_ids == ref


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("speculative", {}),  # draft=auto: no EAGLE head for it, so self:k
        ("speculative", {"draft": "self:1"}),
        ("token_tree", {}),
        ("self_speculative", {"skip": "attn:0"}),
        ("calm", {}),
    ],
)
def test_methods_that_run_part_of_the_model_refuse_a_non_llama_model_before_decoding(
    gpt2, method, params
):
    with pytest.raises(InvalidParameter, match="Llama-style decoder"):
        stream(gpt2, "def f(x): return x", method, 8, chat=False, **params)
