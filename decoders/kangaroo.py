"""Kangaroo (Liu et al. 2024): self-speculative decoding with a double early exit.

The model's first ℓ layers are the shallow sub-network; a small adapter (one attention layer and
two norms, its own KV cache) turns their layer-ℓ state into a draft token through the target's own
LM head. Drafting exits early twice: at layer ℓ for every draft token, and from the draft loop as
soon as the adapter's top-1 confidence falls below η. Verification runs only layers ℓ..L, on the
layer-ℓ states the drafts already computed: the shallow layers never run twice.

The adapter is trained by `python -m decoders.train kangaroo` and ships per exit layer as
`assets/kangaroo/<model>-l<ℓ>.safetensors`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from .artifacts import ASSETS, artifact_path, load_artifact
from .errors import InvalidParameter
from .models import ModelBundle, slug

KIND = "kangaroo"


class KangarooAdapter(nn.Module):
    """A(h) = norm(h + attention(input_norm(h))): the layer-ℓ state in, the features the target's
    LM head reads out. Shaped like one of the target's attention blocks."""

    def __init__(self, config, exit_layer: int, vocab: torch.Tensor) -> None:
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)
        self.register_buffer("vocab", vocab.long())  # draft vocabulary: target token ids
        self.register_buffer("exit_layer", torch.tensor(int(exit_layer)))  # ℓ

    def forward(
        self,
        hidden: torch.Tensor,  # [b, n, d] layer-ℓ states (after ℓ decoder layers)
        positions: torch.Tensor,  # [b, n]
        mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Features for the LM head, [b, n, d]. Without a mask: causal (training, or a chain)."""
        a, _ = self.self_attn(
            self.input_layernorm(hidden),
            position_embeddings=self.rotary(hidden, position_ids=positions),
            attention_mask=mask,
            past_key_values=cache,
        )
        return self.norm(hidden + a)

    @classmethod
    def from_target(cls, bundle: ModelBundle, exit_layer: int, vocab: torch.Tensor):
        """A fresh adapter initialised from the target's own layer ℓ attention and final norm
        (a better start than random: it already reads layer-ℓ-like states)."""
        adapter = cls(bundle.model.config, exit_layer, vocab)
        layer = bundle.model.model.layers[min(exit_layer, bundle.n_layers - 1)]
        adapter.input_layernorm.load_state_dict(layer.input_layernorm.state_dict())
        adapter.self_attn.load_state_dict(layer.self_attn.state_dict())
        adapter.norm.load_state_dict(bundle.model.model.norm.state_dict())
        return adapter.to(bundle.device)


def adapter_path(model_id: str, exit_layer: int) -> Path:
    return artifact_path(KIND, model_id, f"l{exit_layer}")


def shipped_exit_layers(model_id: str) -> list[int]:
    """The ℓ values with a shipped adapter for this model, ascending."""
    base = slug(model_id)
    folder = ASSETS / KIND
    found = []
    for p in folder.glob(f"{base}-l*.safetensors") if folder.is_dir() else ():
        tail = p.stem[len(base) + 2 :]
        if tail.isdigit():
            found.append(int(tail))
    return sorted(found)


def best_exit_layer(model_id: str) -> int | None:
    """The ℓ the training sweep chose (`assets/kangaroo/<model>.json`), else the smallest shipped."""
    sweep = ASSETS / KIND / f"{slug(model_id)}.json"
    if sweep.is_file():
        chosen = json.loads(sweep.read_text()).get("chosen")
        if chosen is not None:
            return int(chosen)
    shipped = shipped_exit_layers(model_id)
    return shipped[0] if shipped else None


def load_adapter(bundle: ModelBundle, exit_layer: int | None = None) -> KangarooAdapter:
    """The trained adapter at ℓ = `exit_layer` (default: the sweep's choice) for `bundle`'s model."""
    if exit_layer is None:
        exit_layer = best_exit_layer(bundle.model_id)
        if exit_layer is None:
            raise InvalidParameter(
                f"kangaroo: no trained adapter for {bundle.model_id}; train one with "
                f"`python -m decoders.train kangaroo --model {bundle.model_id}`"
            )
    if not 1 <= exit_layer < bundle.n_layers:
        raise InvalidParameter(
            f"kangaroo: the exit layer ℓ must be in 1..{bundle.n_layers - 1}, got {exit_layer}"
        )
    return load_artifact(
        bundle,
        adapter_path(bundle.model_id, exit_layer),
        lambda state: KangarooAdapter(
            bundle.model.config, int(state["exit_layer"]), state["vocab"]
        ),
        f"Kangaroo adapter at layer {exit_layer}",
        f"python -m decoders.train kangaroo --model {bundle.model_id} --exit-layers {exit_layer}",
    )
