"""Sliding-window models (Gemma-2, Mistral, Qwen2 with its window on) inside their window.

A sliding layer attends to its last W positions only; while prompt + budget fit in W that is every
position, so its mask is the causal mask and the runtime gives it a full cache (runtime.new_cache):
such a model loads, and every method decodes on it exactly as on a full-attention model. A request
that would outgrow the smallest window is refused before decoding, by name, with the numbers
(never a silent difference past the window, never a shape error mid-run: token_tree and lookahead
once stopped on "The size of tensor a (14) must match the size of tensor b (68)"). Recurrent or
shared-KV layers keep no per-position entries and stay refused at load.

The checkpoints are written here, tiny (2-4 layers, hidden 64) and peaked (no near-ties), with the
embedded tokenizer, and loaded by path as any user's checkpoint is."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from conftest import assert_greedy, close
from decoders import METHODS, generate, load_model, stream
from decoders.core import costs
from decoders.core.errors import DecodingLabError, InvalidInput, ModelLoadError
from decoders.core.models import check_cache_supported, embedded_tokenizer
from decoders.core.prices import PriceTable
from decoders.core.runtime import (
    SkipSet,
    _forward_skipping,
    forward,
    forward_from,
    forward_shallow,
    head_logits,
    new_cache,
)
from decoders.engine import greedy_reference

PROMPT = "Write a haiku about the sea and the sky"  # 40 tokens with the chat template
WINDOW = 64
BUDGET = 24  # 40 + 24 = 64: the request fills the window to its last position

# Lossless methods that need a trained part shipped only for the embedded model: on any other
# model they refuse by name before decoding (and that is what is checked for them here).
NEEDS_ARTIFACTS = {
    "medusa": "trained Medusa heads",
    "blockwise": "trained Medusa heads",
    "block_draft": "a trained block drafter",
    "kangaroo": "a trained adapter",
    "space": "a trained mask model (for Llama-style decoders)",
}
# A default that reads a shipped artifact (self_speculative's searched skip set), replaced by an
# explicit setting that needs none, so the method itself still runs.
WITHOUT_ARTIFACTS = {"self_speculative": {"skip": "attn:1 mlp:0"}}


def tiny_checkpoint(path, kind: str, layers: int = 2, **config) -> str:
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    config_class, model_class = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "gemma2": (Gemma2Config, Gemma2ForCausalLM),
    }[kind]
    tok = embedded_tokenizer()
    torch.manual_seed(0)
    m = model_class(
        config_class(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.eos_token_id,
            **config,
        )
    )
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)  # peaked logits: no near-ties
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def load(path: str):
    """Load by path, as any user's checkpoint, priced by a stated table (measuring one runs
    every method: seconds this test has no use for)."""
    bundle = load_model(path)
    costs.set_table(bundle, PriceTable.linear(bundle.model_id, 0.04))
    return bundle


# Gemma-2 as it ships, in small: sliding and full layers alternating, embeddings scaled by
# sqrt(hidden) inside the model, softcapped attention and final logits (caps low enough here to
# bend the logits: a path that forgot them would show), queries scaled by query_pre_attn_scalar.
GEMMA2 = {
    "layers": 4,
    "head_dim": 16,
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "query_pre_attn_scalar": 32,
    "attn_logit_softcapping": 5.0,
    "final_logit_softcapping": 5.0,
}


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    return load(tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "gemma2", "gemma2", **GEMMA2))


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):  # every layer slides
    path = tmp_path_factory.mktemp("ckpt") / "mistral"
    return load(tiny_checkpoint(path, "mistral", sliding_window=WINDOW))


def hf_greedy(bundle, prompt_ids, n: int) -> list[int]:
    """transformers' own greedy decoding, with its own (sliding-window) cache and masks."""
    ids = torch.tensor([prompt_ids], device=bundle.device)
    with torch.inference_mode():
        out = bundle.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n
        )
    return out[0, len(prompt_ids) :].tolist()


def test_a_gemma2_checkpoint_loads_by_path_and_its_reference_is_transformers_greedy(gemma2):
    assert gemma2.window == WINDOW
    assert gemma2.model.config._attn_implementation == "eager"  # softcapping needs it
    prompt = gemma2.encode(PROMPT)
    assert len(prompt) + BUDGET == WINDOW
    reference = greedy_reference(gemma2, prompt, BUDGET)
    assert len(reference) == BUDGET
    assert reference == hf_greedy(gemma2, prompt, BUDGET)
    # Inside the window the runtime's cache keeps every position in every layer.
    cache = new_cache(gemma2)
    assert len(cache.layers) == 4
    assert all(type(layer) is DynamicLayer and not layer.is_sliding for layer in cache.layers)


def test_the_runtimes_own_layer_loops_reproduce_gemma2s_forward(gemma2):
    """Every path that runs Gemma-2's parts itself (layers written out for hidden states or
    features, a forward split at an exit, sublayers one by one) gives the model's own logits:
    scaled embeddings, per-layer masks, sandwich norms and the final softcap included."""
    prompt = gemma2.encode(PROMPT)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        own = gemma2.model(input_ids=ids).logits[0].float()
    assert own.abs().max() < 5.0 and own.abs().max() > 2.0  # the cap bends these logits

    def run(**kw):
        return forward(gemma2, new_cache(gemma2), prompt, step=0, kind="prefill", **kw)

    assert close(run(hidden_at=(2,)).logits, own)  # decoder layers written out
    assert close(run(features=True).logits, own)  # the inner model, then the head
    cache = new_cache(gemma2)
    shallow = forward_shallow(gemma2, cache, prompt, 2, step=0, kind="draft")
    deep = forward_from(gemma2, cache, shallow.hidden[2], 2, step=0, kind="verify")
    assert close(deep.logits, own)
    # One token through the sublayers as residual blocks (self_speculative's draft), none left
    # out: the model's logits for the last position.
    cache = new_cache(gemma2)
    forward(gemma2, cache, prompt[:-1], step=0, kind="prefill")
    pos = torch.tensor([[len(prompt) - 1]])
    with torch.inference_mode():
        feats = _forward_skipping(gemma2, cache, torch.tensor([prompt[-1:]]), pos, SkipSet())
        assert close(head_logits(gemma2, feats)[0, -1].float(), own[-1])


def check_every_method(bundle) -> None:
    """Every method the registry claims lossless matches autoregressive greedy token for token
    (those needing artifacts this model lacks refuse by name); every other method runs or
    refuses by name, never crashes."""
    prompt = bundle.encode(PROMPT)
    reference = greedy_reference(bundle, prompt, BUDGET)
    ran = []
    for name, method in METHODS.items():
        params = WITHOUT_ARTIFACTS.get(name, {})
        lossless = method.claims_lossless(params)
        try:
            result = generate(bundle, prompt, name, BUDGET, **params)
        except DecodingLabError as exc:
            if lossless and name not in NEEDS_ARTIFACTS:
                raise
            assert bundle.model_id in str(exc), f"{name}: {exc}"  # refused by name
            continue
        if lossless:
            assert_greedy(bundle, result, reference)
            ran.append(name)
    assert {"autoregressive", "token_tree", "lookahead", "jacobi", "layerskip"} <= set(ran)
    assert "self_speculative" in ran


def test_every_lossless_method_matches_greedy_on_gemma2(gemma2):
    check_every_method(gemma2)


@pytest.mark.slow  # every layer slides; the window-of-8 test below runs Mistral fast
def test_every_lossless_method_matches_greedy_on_mistral(mistral):
    assert mistral.window == WINDOW
    assert hf_greedy(mistral, mistral.encode(PROMPT), BUDGET) == greedy_reference(
        mistral, mistral.encode(PROMPT), BUDGET
    )
    check_every_method(mistral)


@pytest.mark.parametrize("method", ["autoregressive", "token_tree", "lookahead"])
def test_a_request_outgrowing_the_window_is_refused_before_decoding(gemma2, method):
    prompt = gemma2.encode(PROMPT)
    with pytest.raises(InvalidInput) as refused:
        stream(gemma2, prompt, method, BUDGET + 1)  # validation only: not one forward yet
    message = str(refused.value)
    assert f"{WINDOW}-token sliding attention window" in message
    assert f"is {WINDOW + 1} tokens" in message and gemma2.model_id in message


def test_the_cli_says_so_in_one_line(gemma2, capsys):
    from decoders.__main__ import main

    args = ["--model", gemma2.model_id, "--prompt", PROMPT, "--max-new-tokens", "30"]
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"{WINDOW}-token sliding attention window" in lines[0] and "70 tokens" in lines[0]


@pytest.mark.parametrize(
    "kind, window",
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}),
        ("mistral", {"sliding_window": 8}),
    ],
)
def test_a_window_of_8_refuses_a_30_token_request_and_decodes_inside_it(tmp_path, kind, window):
    bundle = load(tiny_checkpoint(tmp_path / kind, kind, **window))
    assert bundle.window == 8
    prompt = bundle.encode("Write a haiku about the sea", chat=False)[:4]
    with pytest.raises(InvalidInput, match=r"is 30 tokens, longer than the 8-token sliding") as e:
        generate(bundle, prompt, "token_tree", 26)
    assert bundle.model_id in str(e.value)
    # Up to the window's last position, every method decodes as transformers does with its own
    # sliding-window cache.
    reference = hf_greedy(bundle, prompt, 4)
    assert greedy_reference(bundle, prompt, 4) == reference
    for method in ("token_tree", "lookahead", "jacobi", "prompt_lookup"):
        assert_greedy(bundle, generate(bundle, prompt, method, 4), reference)


def test_recurrent_and_shared_kv_layers_stay_refused_at_load():
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2)
    config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ModelLoadError, match=r"has linear_attention layers \(1 of 2\)"):
        check_cache_supported("some/model", config)


def test_the_same_family_with_full_attention_loads_and_stays_lossless(tmp_path):
    """Qwen2 with its window switched off (as the released Qwen2.5 models ship) is a full-attention
    model: no window to check, and drafts roll back on it past 8 positions as on Llama."""
    path = tiny_checkpoint(
        tmp_path / "qwen2-full", "qwen2", use_sliding_window=False, sliding_window=8
    )
    bundle = load(path)
    assert bundle.window is None
    prompt = bundle.encode("Write a haiku about the sea and the sky")
    reference = greedy_reference(bundle, prompt, 24)
    for method in ("token_tree", "lookahead", "jacobi", "prompt_lookup"):
        assert METHODS[method].claims_lossless({})
        assert_greedy(bundle, generate(bundle, prompt, method, 24), reference)
