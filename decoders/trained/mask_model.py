"""SPACE's mask-tuned model on a frozen base (Yi et al. 2024, "Generation Meets Verification"):
the original weights plus a learned [MASK] input embedding and low-rank adapters whose output is
added on the rows of mask inputs only.

    h_row = embed(token)               a real token: the base embedding
          = m                          a mask: one learned vector (not a vocabulary entry, so the
                                       LM head and the distribution over tokens are untouched)
    W x  + [row is a mask] · B A x     every linear of every layer (q, k, v, o, gate, up, down)

Every non-mask row is then computed by the original weights, and wherever mask rows are hidden
from real rows (SPACE's layout hides each mask group from every later row), a real row's logits
are exactly the base model's: decoding with this model is lossless against the original one.

`masked_forward` is one functional pass through the base model's own layers with the adapters
added (no hooks, no module swapped: the base model stays shared, untouched, by concurrent runs).
Training (`python -m decoders.train space`) and decoding (`decoders/methods/space.py`) both call it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from decoders.core.attention import kernel as attention_kernel
from decoders.core.errors import InvalidParameter
from decoders.core.events import Forward
from decoders.core.models import ModelBundle
from decoders.core.packing import PackedLinear
from decoders.core.runtime import ForwardResult, elapsed_ms, weights_of
from decoders.trained.artifacts import artifact_path, load_artifact

KIND = "space"  # assets/space/<model>.safetensors
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
# Projections that read the same input: a frozen adapter updates each group in one go.
GROUPS = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}
SUPPORTED = ("llama",)  # the layer layout masked_forward follows


def _shapes(config) -> dict[str, tuple[int, int]]:
    """(in, out) of each adapted linear."""
    d, f = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    return {
        "q": (d, q),
        "k": (d, kv),
        "v": (d, kv),
        "o": (q, d),
        "gate": (d, f),
        "up": (d, f),
        "down": (f, d),
    }


FusedGroup = tuple[nn.Module | None, torch.Tensor | None, list]  # see MaskAdapter.fused


class MaskAdapter(nn.Module):
    """The trained part: the [MASK] embedding `mask` [d], and per layer and projection a LoRA pair
    `A` [r, in], `B` [out, r] scaled by alpha / r. B starts at zero (LoRA's init), so an untrained
    adapter is the base model reading a mask vector."""

    def __init__(self, config, k: int, rank: int = 16, alpha: float = 32.0) -> None:
        super().__init__()
        self.k, self.rank, self.scale = k, rank, alpha / rank if rank else 0.0
        self.register_buffer("meta", torch.tensor([k, rank, alpha], dtype=torch.float32))
        self.mask = nn.Parameter(torch.zeros(config.hidden_size))
        self.lora = nn.ParameterDict()  # empty at rank 0: the paper's full SFT (the mask alone)
        for layer in range(config.num_hidden_layers if rank else 0):
            for name, (n_in, n_out) in _shapes(config).items():
                a = torch.empty(rank, n_in)
                nn.init.kaiming_uniform_(a, a=5**0.5)
                self.lora[f"{layer}_{name}_A"] = nn.Parameter(a)
                self.lora[f"{layer}_{name}_B"] = nn.Parameter(torch.zeros(n_out, rank))
        # set by freeze(): per layer, group -> (packed: the first base and the A's in one
        # linear, else None; unpacked: the A's stacked [in, g·r], else None (the packed linear
        # has them); [(B scaled, transposed; its A rows)])
        self.fused: list[dict[str, FusedGroup]] | None = None
        self.frozen_for: weakref.ref | None = None  # the model `fused` was built for

    @classmethod
    def from_state(cls, config, state: dict[str, torch.Tensor]) -> MaskAdapter:
        k, rank, alpha = state["meta"].tolist()
        return cls(config, int(k), int(rank), float(alpha))

    def project(
        self, layer: int, group: str, bases: Sequence[nn.Linear], x: torch.Tensor, first: int
    ) -> list[torch.Tensor]:
        """The base linears of one input-sharing `group` (GROUPS) on x, each plus the adapter's
        low-rank update on the mask rows, x[:, first:]."""
        if self.fused is not None:  # frozen: one product for the group's A's, each B in place
            stacked, a, outputs = self.fused[layer][group]
            if stacked is not None:  # packed: the A's ride in the first base projection's linear
                z = stacked(x)  # [b, n, out + g·r]: every row's first base output, then A x
                width = bases[0].out_features
                ys = [z[..., :width], *(base(x) for base in bases[1:])]
            else:
                ys = [base(x) for base in bases]
            if first < x.shape[1]:
                t = z[:, first:, width:] if stacked is not None else x[:, first:] @ a  # [b, m, g·r]
                for y, (b, cols) in zip(ys, outputs, strict=True):
                    for row in range(x.shape[0]):  # addmm_ takes 2-D views; decoding has one
                        y[row, first:].addmm_(t[row, :, cols], b)
            return ys
        ys = [base(x) for base in bases]
        if self.rank and first < x.shape[1]:
            xm = x[:, first:]
            for y, name in zip(ys, GROUPS[group], strict=True):  # training: gradients flow
                a, b = self.lora[f"{layer}_{name}_A"], self.lora[f"{layer}_{name}_B"]
                y[:, first:] += ((xm @ a.T) @ b.T * self.scale).to(y.dtype)
        return ys

    def freeze(self, model: nn.Module, packed: bool = False) -> MaskAdapter:
        """For decoding on `model` (the base causal LM, frozen; the adapter then serves it only):
        per layer and input-sharing group (q, k and v read the same input, so do gate and up),
        the group's A's stacked [in, g·r] for one product, and each B transposed with the scale
        folded in, added in place on the mask rows.

        `packed` (oneDNN, the CPU path; packing.py): the stacked A's join the packed linear of
        the group's first base projection (q, o, gate, down), so they cost no op of their own:
        on this repo's 2-core CPU the ops, not the arithmetic, were what a 9-input SPACE forward
        paid for its adapter. That linear is a second, packed-only copy of those weights (~0.3 GB
        for the embedded model); a real row's outputs are the same bits as the base linear's when
        both are packed, as every layer of the embedded model is (the kernel reduces each output
        over the same inputs in the same order; tested). The other
        base projections (k, v, up) stay the model's own, so a layer runs as many base linears
        as a plain forward does: the speedup over autoregressive owes nothing to stacking base
        weights (stacking q, k, v and gate, up too would make every forward ~5% cheaper, the
        baseline's included). Unpacked (a GPU), no weight is copied and every base projection
        is the model's own."""
        if self.fused is not None:
            if self.frozen_for is None or self.frozen_for() is not model:
                raise RuntimeError("this mask adapter was frozen for another model")
            return self
        if not self.rank:
            return self
        self.frozen_for = weakref.ref(model)  # not an attribute module: not in state_dict
        r = self.rank
        with torch.no_grad():
            self.fused = []
            for i, layer in enumerate(model.model.layers):
                attn, mlp = layer.self_attn, layer.mlp
                first = {
                    "qkv": attn.q_proj,
                    "o": attn.o_proj,
                    "gate_up": mlp.gate_proj,
                    "down": mlp.down_proj,
                }
                groups = {}
                for group, names in GROUPS.items():
                    a = torch.cat([self.lora[f"{i}_{n}_A"] for n in names])  # [g·r, in]
                    stacked = _stacked(first[group], a) if packed else None
                    outputs = [
                        (
                            (self.lora[f"{i}_{n}_B"] * self.scale).T.contiguous(),
                            slice(j * r, (j + 1) * r),
                        )
                        for j, n in enumerate(names)
                    ]
                    groups[group] = (stacked, None if packed else a.T.contiguous(), outputs)
                self.fused.append(groups)
        return self


def _stacked(base: nn.Module, a: torch.Tensor) -> PackedLinear:
    """One packed linear computing [base(x), A x]: the base's weight with A's rows under it (A
    adds no bias). Only the packed copy is kept (a stacked weight of at most MIN_PACKED weights,
    a tiny test model's, is not packed and stays as it is)."""
    weight = torch.cat([base.weight, a])
    linear = nn.Linear(*weight.shape[::-1], bias=base.bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if base.bias is not None:
        bias = torch.cat([base.bias, base.bias.new_zeros(a.shape[0])])
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return PackedLinear(linear, keep_weight=False)


def masked_forward(
    bundle: ModelBundle,
    adapter: MaskAdapter,
    cache: DynamicCache | None,
    tokens: torch.Tensor,  # [b, n] ids; mask rows hold any id (it is not read)
    first: int,  # rows first.. are masks (real inputs come first, so the masks are one slice)
    positions: torch.Tensor,  # [b, n]
    attention: torch.Tensor | None,  # [b or 1, 1, n, past + n] additive, or None: causal
) -> torch.Tensor:
    """The final features (what the LM head reads), [b, n, d]: the base model's layers run here
    one by one, with the adapter on the mask rows. Appends every row's keys and values to
    `cache`, real rows first: keeping the real inputs later is a crop."""
    inner = bundle.model.model
    h = inner.embed_tokens(tokens)
    if first < h.shape[1]:
        masks = adapter.mask.to(h.dtype).expand(h.shape[0], h.shape[1] - first, -1)
        h = torch.cat([h[:, :first], masks], dim=1)
    rope = inner.rotary_emb(h, position_ids=positions)
    if attention is None:
        n, past = tokens.shape[1], cache.get_seq_length() if cache is not None else 0
        blocked = torch.ones(n, past + n, dtype=torch.bool, device=h.device).triu(past + 1)
        attention = torch.zeros(blocked.shape, dtype=h.dtype, device=h.device)
        attention = attention.masked_fill(blocked, torch.finfo(h.dtype).min)[None, None]
    for i, layer in enumerate(inner.layers):
        with weights_of(layer, h) as h:  # its weights, where a device map keeps them
            here = tuple(r.to(h.device) for r in rope)
            h = h + _attention(
                adapter,
                layer.self_attn,
                i,
                layer.input_layernorm(h),
                first,
                here,
                attention.to(h.device),
                cache,
            )
            x = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            gate, up = adapter.project(i, "gate_up", (mlp.gate_proj, mlp.up_proj), x, first)
            (down,) = adapter.project(i, "down", (mlp.down_proj,), mlp.act_fn(gate) * up, first)
            h = h + down
    return inner.norm(h)


def _attention(adapter, attn, i, x, first, rope, attention, cache) -> torch.Tensor:
    """The base layer's self-attention (its weights, its attention kernel), adapter added."""
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q, k, v = (
        y.view(shape).transpose(1, 2)
        for y in adapter.project(i, "qkv", (attn.q_proj, attn.k_proj, attn.v_proj), x, first)
    )
    q, k = apply_rotary_pos_emb(q, k, *rope)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    out, _ = attention_kernel(attn.config)(attn, q, k, v, attention, scaling=attn.scaling)
    out = out.reshape(*x.shape[:-1], -1).contiguous()
    (o,) = adapter.project(i, "o", (attn.o_proj,), out, first)
    return o


@torch.inference_mode()
def forward_masked(
    bundle: ModelBundle,
    adapter: MaskAdapter,
    cache: DynamicCache,
    tokens: Sequence[int],
    first: int,
    *,
    step: int,
    kind: str,
    positions: Sequence[int],
    attention: torch.Tensor,
) -> ForwardResult:
    """One decoding forward (batch 1) timed into a Forward event: every row's logits, float32."""
    device = bundle.device
    start = time.perf_counter()
    feats = masked_forward(
        bundle,
        adapter,
        cache,
        torch.as_tensor(tokens, dtype=torch.long, device=device).view(1, -1),
        first,
        torch.as_tensor(positions, dtype=torch.long, device=device).view(1, -1),
        attention.to(device=device, dtype=bundle.dtype),
    )
    logits = bundle.model.lm_head(feats)[0].float()
    wall_ms = elapsed_ms(bundle, start)
    event = Forward(
        step=step, kind=kind, n_input_tokens=len(tokens), layers=bundle.n_layers, wall_ms=wall_ms
    )
    return ForwardResult(logits, {}, event)


SFT_FILE = "space_mask.safetensors"  # beside a fully fine-tuned model (train --full)


def adapter_path(model_id: str) -> Path:
    """A model directory that holds its own mask (the full-SFT variant, saved to the model cache
    with its weights) uses it; any other model the shipped adapter in assets/space/."""
    local = Path(model_id).expanduser()
    if local.is_dir() and (local / SFT_FILE).is_file():
        return local / SFT_FILE
    return artifact_path(KIND, model_id)


def load_adapter(bundle: ModelBundle, path=None) -> MaskAdapter:
    """The shipped mask adapter for `bundle`'s model, frozen, in its device and dtype."""
    kind = getattr(bundle.model.config, "model_type", "?")
    if kind not in SUPPORTED:  # masked_forward re-runs the layers as Llama writes them
        raise InvalidParameter(
            f"SPACE's mask model runs Llama-style decoders ({', '.join(SUPPORTED)}); "
            f"{bundle.model_id} is a {kind!r} model"
        )
    return load_artifact(
        bundle,
        path or adapter_path(bundle.model_id),
        lambda state: MaskAdapter.from_state(bundle.model.config, state),
        "SPACE mask adapter",
        f"python -m decoders.train space --model {bundle.model_id}",
    ).freeze(bundle.model, bundle.packed)
