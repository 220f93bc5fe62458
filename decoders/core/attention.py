"""Grouped-query attention over a masked block of queries, without copying the KV cache.

A model with grouped-query attention (the embedded SmolLM2: 9 query heads share 3 key/value
heads) keeps 3 heads in its cache. transformers' `sdpa` attention hands a masked multi-query
forward (every tree, window or chain verification: the mask is ours, or its own causal one over
the cache) to `repeat_kv`, which copies the whole cache out to 9 heads in every layer before
attending. The copy grows with the context; a one-token forward never pays it (transformers
folds one query's heads onto the cache's instead). Measured on the embedded model, 2-core AMD
EPYC, one thread: a 6-input tree forward after 1,200 cached tokens cost 1.62 one-token forwards
with the copy and 1.31 without (after 300 tokens, 1.29 and 1.21).

`sdpa_gqa` is `sdpa` but for that case, where it asks torch's SDPA to read each key/value head for
its group of query heads in place (`enable_gqa`). Each query row is the same sum in the same
order, so the outputs are bit for bit those of the copy (tests/test_runtime.py). On a GPU
transformers' own rule stands: with a mask, torch's fused kernels refuse grouped heads and the
math kernel is slower than the copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [b, heads, n, d], key and value
    [b, kv heads, cache + n, d]; returns [b, n, heads, d]."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (
        grouped
        and attention_mask is not None
        and query.shape[2] > 1
        and query.device.type == "cpu"
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
    ):
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=True,
        )
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def kernel(config) -> Callable[..., tuple[torch.Tensor, None]]:
    """The attention function a model loaded here attends with, for code that runs a layer's
    attention by hand (SPACE's masked rows): `sdpa_gqa` where `use_grouped_sdpa` switched it,
    else transformers' `sdpa`."""
    return (
        sdpa_gqa
        if getattr(config, "_attn_implementation", None) == NAME
        else sdpa_attention_forward
    )


AttentionInterface.register(NAME, sdpa_gqa)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the masks `sdpa` gets


def use_grouped_sdpa(model: torch.nn.Module) -> bool:
    """Switch a CPU model that attends with `sdpa` over grouped key/value heads to `sdpa_gqa`;
    returns whether it was switched. `DECODING_LAB_GQA=0` keeps transformers' `sdpa`."""
    if os.environ.get("DECODING_LAB_GQA", "1") == "0":
        return False
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if config._attn_implementation != "sdpa" or not heads or kv_heads == heads:
        return False
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():  # its code does not read the attention interface
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError):  # a sub-model that cannot take sdpa: leave it all as it was
        model.set_attn_implementation("sdpa")
        return False
    return model.config._attn_implementation == NAME
