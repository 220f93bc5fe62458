"""Kangaroo (Liu et al. 2024): self-speculative decoding with a double early exit.

The model's first ℓ layers are the shallow sub-network; a small adapter (one attention layer and
two norms, its own KV cache) turns their layer-ℓ state into a draft token through the target's own
LM head. Drafting exits early twice: at layer ℓ for every draft token, and from the draft loop as
soon as the adapter's top-1 confidence falls below η. Verification runs only layers ℓ..L, on the
layer-ℓ states the drafts already computed: the shallow layers never run twice.

    repeat:
        x = last committed token
        drafting: feed x, then each draft token, through layers 1..ℓ (the target's own KV cache),
                  the adapter (its own cache) and the LM head: d_j = argmax (or a draw) of q_j;
                  stop after the first d_j whose top-1 probability is below η (it is kept), at γ
                  tokens, at an end token, or where the budget ends
        runners-up (siblings = s > 0, our extension): beside each d_j, the next s tokens of q_j
                  as leaves: a small tree that costs s inputs per draft token and no draft forward
        p = layers ℓ+1..L([h_ℓ(x), h_ℓ(d_1) .. h_ℓ(d_{n-1}), h_ℓ(d_n), h_ℓ(runners-up)])
                  # ONE forward; only d_n and the runners-up run layers 1..ℓ there first, the
                  # others reuse the states drafting computed; a tree mask when there are leaves
        keep the longest prefix the target agrees with (greedy) / the rejection rule with q
                  (sampling; with runners-up the drafts are q's top tokens, kept as point masses
                  by the multi-draft residual rule); a path may end on a runner-up
        roll both caches back to what was committed

Why runners-up: on the tuning prompts the adapter's top-1 is the target's token 56% of the time
on code (34% on chat), and where it is not, its second choice is in 26% of cases (16%). The draft
forward already computed that choice; verifying it costs one more input of a forward that is
memory-bound on a CPU (a few percent of a one-token forward), where the step would otherwise end.

The adapter is trained by `python -m decoders.train kangaroo` and ships per exit layer as
`assets/kangaroo/<model>-l<ℓ>.safetensors`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from decoders.core import exit_drafting
from decoders.core.base import DecodeConfig, Method
from decoders.core.errors import InvalidParameter
from decoders.core.events import Event, Forward
from decoders.core.models import ModelBundle, slug
from decoders.core.params import Param
from decoders.core.runtime import cache_arg, crop_cache, elapsed_ms
from decoders.core.tree import chain, tree_mask
from decoders.trained.artifacts import ASSETS, artifact_path, full_logits, load_artifact

KIND = "kangaroo"
MAX_SIBLINGS = 4  # beyond the 4th choice the adapter is almost never right (tuning prompts)


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


# --- the decoder ------------------------------------------------------------------------------------

PARAMS = (
    Param(
        "exit_layer",
        str,
        "auto",
        "ℓ: drafts exit after layer ℓ. 'auto' = the layer the training sweep chose for this "
        "model; or a layer number with a trained adapter",
    ),
    Param(
        "eta",
        float,
        0.6,
        "η: the draft ends with the first token whose top-1 probability is below η",
        0.0,
        1.0,
    ),
    Param("gamma", int, 6, "γ: most draft tokens per step", 1, 16),
    Param(
        "siblings",
        int,
        1,
        "runners-up: at each drafted position, also verify the adapter's next most likely "
        "tokens, as leaves of a small tree (they cost an input each, no draft forward); "
        "0 = the paper's chain",
        0,
        MAX_SIBLINGS,
    ),
)


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


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    load_adapter(bundle, resolve_exit_layer(bundle, params["exit_layer"]))


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    exit_layer = resolve_exit_layer(bundle, p["exit_layer"])  # ℓ
    head = AdapterHead(bundle, load_adapter(bundle, exit_layer), exit_layer)
    yield from exit_drafting.decode(bundle, prompt_ids, cfg, exit_layer, head)


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


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    family_best=True,  # Compare's "each family at its best"
    name="kangaroo",
    family="self-drafting",
    rank=2,
    title="Kangaroo (self-speculative, double early exit + adapter)",
    decode=decode,
    params=PARAMS,
    # Liu et al. 2024: η = 0.6, γ = 6 (their code's threshold and steps), a chain (no
    # runners-up); ℓ from the sweep
    presets={"paper": {"eta": 0.6, "gamma": 6, "siblings": 0}},
    check=check,
    summary="The first ℓ layers and a small trained adapter draft; the remaining layers verify.",
    relaxable=True,
    # the confidences, then where in the model each step ran
    views=(
        "kangaroo_confidence",
        "kangaroo_layers",
    ),
    events=("Draft", "DraftStop", "Verify"),
    compare={
        # The paper's chain against ours: the adapter's runners-up beside each draft token,
        # verified in the same pass for an input each.
        "Kangaroo: the paper's chain vs runners-up": (
            "kangaroo:siblings=0",
            "kangaroo",
            "kangaroo:siblings=2",
        ),
    },
)
