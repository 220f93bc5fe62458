"""A model whose KV cache the runtime cannot roll back (sliding-window attention, recurrent or
shared-KV layers) is refused at load, by name; never a silent difference past the window, never a
shape error mid-run (token_tree and lookahead once stopped on "The size of tensor a (14) must
match the size of tensor b (68)")."""

import pytest
import torch

from conftest import assert_greedy
from decoders import METHODS, generate, load_model
from decoders.core.errors import ModelLoadError
from decoders.core.models import embedded_tokenizer
from decoders.engine import greedy_reference


def tiny_checkpoint(path, kind: str, **window) -> str:
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config, model = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }[kind]
    tok = embedded_tokenizer()
    torch.manual_seed(0)
    m = model(
        config(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id,
            **window,
        )
    )
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)  # peaked logits: no near-ties
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    "kind, window",
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}),
        ("mistral", {"sliding_window": 8}),
    ],
)
def test_a_sliding_window_model_is_refused_at_load_by_name(tmp_path, kind, window):
    path = tiny_checkpoint(tmp_path / kind, kind, **window)
    with pytest.raises(ModelLoadError, match="sliding-window attention \\(a window of 8 tokens"):
        load_model(path)


def test_the_same_family_with_full_attention_loads_and_stays_lossless(tmp_path):
    """Qwen2 with its window switched off (as the released Qwen2.5 models ship) is a full-attention
    model: it loads, and drafts roll back on it past 8 positions as on Llama."""
    path = tiny_checkpoint(
        tmp_path / "qwen2-full", "qwen2", use_sliding_window=False, sliding_window=8
    )
    bundle = load_model(path)
    prompt = bundle.encode("Write a haiku about the sea and the sky")
    reference = greedy_reference(bundle, prompt, 24)
    for method in ("token_tree", "lookahead", "jacobi", "prompt_lookup"):
        assert METHODS[method].claims_lossless({})
        assert_greedy(bundle, generate(bundle, prompt, method, 24), reference)
