"""Kangaroo's trained adapter (Liu et al. 2024) and its exit head: one attention layer and two
norms that turn the target's layer-ℓ state into the features its LM head reads.

Trained by `python -m decoders.train kangaroo`, shipped per exit layer ℓ as
`assets/kangaroo/<model>-l<ℓ>.safetensors`; the sweep's choice of ℓ in `assets/kangaroo/<model>.json`.
The method (decoders/methods/kangaroo.py) drafts through `AdapterHead`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from decoders.core.errors import InvalidParameter
from decoders.core.events import Forward
from decoders.core.models import ModelBundle, slug
from decoders.core.runtime import cache_arg, crop_cache, elapsed_ms
from decoders.core.tree import chain, tree_mask
from decoders.trained.artifacts import ASSETS, artifact_path, full_logits, load_artifact

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
            **cache_arg(cache),
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
    """Where the adapter at ℓ = `exit_layer` ships for `model_id`."""
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


def resolve_exit_layer(bundle: ModelBundle, text: str) -> int:
    """`auto` -> the sweep's ℓ for this model; a number -> that ℓ, if an adapter ships for it."""
    text = str(text).strip().lower()
    shipped = shipped_exit_layers(bundle.model_id)
    listed = ", ".join(map(str, shipped)) or "none"
    if text == "auto":
        chosen = best_exit_layer(bundle.model_id)
        if chosen is None:
            raise InvalidParameter(
                f"kangaroo: no trained adapter for {bundle.model_id}; train one with "
                f"`python -m decoders.train kangaroo --model {bundle.model_id}`"
            )
        return chosen
    if not text.isdigit():
        raise InvalidParameter(
            f"exit_layer {text!r}: write 'auto' or a layer number (adapters ship for: {listed})"
        )
    exit_layer = int(text)
    if exit_layer not in shipped:
        raise InvalidParameter(
            f"exit_layer {exit_layer}: no trained Kangaroo adapter for {bundle.model_id} at that "
            f"layer (adapters ship for: {listed}; or 'auto'); train one with `python -m "
            f"decoders.train kangaroo --model {bundle.model_id} --exit-layers {exit_layer}`"
        )
    return exit_layer


def load_adapter(bundle: ModelBundle, exit_layer: int | None = None) -> KangarooAdapter:
    """The trained adapter at ℓ = `exit_layer` (default: the sweep's choice) for `bundle`'s model."""
    if exit_layer is None:
        exit_layer = resolve_exit_layer(bundle, "auto")
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
        drafts=True,
    )


# --- drafting through the adapter -------------------------------------------------------------------


class AdapterHead:
    """Kangaroo's exit head (exit_drafting.ExitHead): the adapter, on its own KV cache, then the
    LM head's draft-vocabulary rows. The adapter reads every committed token's layer-ℓ state once,
    in order: x, d_1 .. d_{n-1} as they are drafted; the others (the last draft token when every
    draft was accepted, an accepted runner-up, x when nothing was drafted) ride along with the
    next adapter pass."""

    def __init__(self, bundle: ModelBundle, adapter: KangarooAdapter, exit_layer: int) -> None:
        self.bundle, self.adapter = bundle, adapter
        self.label = f"kangaroo: exit at layer {exit_layer} + adapter"
        self.cache = DynamicCache()  # the adapter's own
        self.behind: torch.Tensor | None = None  # layer-ℓ states owed to the adapter

    def prefill(self, states: torch.Tensor) -> Forward:
        self.behind = states[:0]
        return _adapter_prefill(self.bundle, self.adapter, self.cache, states)

    def head(self, position: int) -> Callable[[torch.Tensor], torch.Tensor]:
        behind, self.behind = self.behind, self.behind[:0]  # this pass reads what was owed
        return _draft_head(self.bundle, self.adapter, self.cache, behind, position)

    def settle(self, in_cache: int, n_draft: int, path, states: torch.Tensor) -> None:
        # The adapter has read x, d_1 .. d_{n-1}: keep what the target accepted of them. The
        # path's last node may be one it has not read (d_n, or a runner-up; x itself when
        # nothing was drafted, which happens only for the output's last token): its state
        # rides along.
        read = sum(i < n_draft - 1 for i in path)
        crop_cache(self.cache, in_cache + 1 + read)
        if not n_draft or len(path) > read:
            row = 1 + path[-1] if path else 0  # its input row in the verify pass (x is row 0)
            self.behind = torch.cat([self.behind, states[row : row + 1]])


@torch.inference_mode()
def _adapter_prefill(
    bundle: ModelBundle, adapter: KangarooAdapter, adapter_cache: DynamicCache, h: torch.Tensor
) -> Forward:
    """The adapter over the prompt's layer-ℓ states: its cache then covers the prompt."""
    start = time.perf_counter()
    n = h.shape[0]
    positions = torch.arange(n, device=bundle.device).view(1, -1)
    adapter(_as(adapter, h).unsqueeze(0), positions, _causal(adapter, n, 0), adapter_cache)
    return Forward(0, "draft", n, 1, elapsed_ms(bundle, start))


def _draft_head(
    bundle: ModelBundle,
    adapter: KangarooAdapter,
    adapter_cache: DynamicCache,
    behind: torch.Tensor,
    position: int,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The early-exit head for the token at `position`: the adapter over its layer-ℓ state (after
    the states it still owes, `behind`), then the LM head's draft-vocabulary rows; full-vocabulary
    logits of the next token, [1, vocab]."""

    def head(h: torch.Tensor) -> torch.Tensor:
        states = torch.cat([behind, h])
        n = states.shape[0]
        past = adapter_cache.get_seq_length()
        assert past == position + 1 - n, "the adapter's cache must end right before its inputs"
        positions = torch.arange(past, past + n, device=bundle.device).view(1, -1)
        mask = _causal(adapter, n, past)
        feats = adapter(_as(adapter, states).unsqueeze(0), positions, mask, adapter_cache)
        return full_logits(bundle, adapter.vocab, adapter.lm_head(feats[0, -1:]))

    return head


def _as(adapter: KangarooAdapter, h: torch.Tensor) -> torch.Tensor:
    """The target's layer-ℓ states in the adapter's dtype (bfloat16 where drafts may run in it)."""
    return h.to(adapter.norm.weight.dtype)


def _causal(adapter: KangarooAdapter, n: int, past: int) -> torch.Tensor | None:
    """The adapter's mask for n new inputs after `past` cached ones (one input sees everything)."""
    if n == 1:
        return None
    weight = adapter.norm.weight
    return tree_mask(chain(n), past, weight.dtype).to(weight.device)
