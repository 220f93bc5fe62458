"""CPU weight prepacking: every `nn.Linear` runs through oneDNN with its weight packed once.

Why: with PyTorch's default CPU path, a linear layer on 2–16 rows costs about twice what it costs on
one row (measured on these 2-core machines: the 49152 × 576 LM head takes 10 ms for one token and
22 ms for eight). Verifying a draft is exactly such a small-batch forward, so speculative methods
paid double for every verification. With the weight reordered once for oneDNN (what
`torch.compile`'s CPU backend does when it freezes weights), one token costs ~5 ms and eight ~7 ms,
and the whole forward of eight tokens costs ~1.3× one token instead of ~1.7×.

Every method, the autoregressive baseline and the transformers peers in the benchmark run on the
same packed model, so ratios stay fair. Numerics move by ~1e-4 in the logits. `DECODING_LAB_PACK=0`
turns packing off.

Trained drafting heads (EAGLE, Kangaroo's adapter, Medusa) may run in bfloat16 where the CPU
multiplies it natively (AMX / AVX512-BF16): a draft only has to be a good guess, the target still
verifies in float32, so the output cannot change; the head reads half the bytes. `draft_dtype`
decides; `DECODING_LAB_DRAFT_BF16=0` keeps drafts in float32.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

BATCH_HINT = 8  # oneDNN picks its weight layout for this many rows: small verification batches
# Below this many weights the packed call never pays: oneDNN's per-call cost (~20–40 µs on these
# machines) exceeds what its layout saves. Measured on 1 and 8 rows, one thread: 64 × 64 takes
# 6 µs through F.linear and 23 µs packed, 256 × 256 on 8 rows 33 µs and 57 µs; from the embedded
# model's 576 × 576 up, packed wins on 8 rows (80 µs against 96 µs). Such small linears (the
# tiny test models' layers, one-output classifiers) run through F.linear.
MIN_PACKED = 1 << 16


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (not emulated, which would be slower)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return bool({"amx_bf16", "avx512_bf16"} & set(flags)) and torch.backends.mkldnn.is_available()


def draft_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype trained drafting heads run in beside a target in `dtype` on `device`."""
    if (
        device.type == "cpu"
        and dtype == torch.float32
        and os.environ.get("DECODING_LAB_DRAFT_BF16", "1") != "0"
        and available()
        and native_bf16()
    ):
        return torch.bfloat16
    return dtype


def available() -> bool:
    """Whether this torch build has the oneDNN packed-linear ops and they agree with F.linear."""
    if os.environ.get("DECODING_LAB_PACK", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    return _packs(torch.float32)


@functools.cache
def bf16_packable() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU: it needs AVX512 (BW, VL, DQ) or
    AVX-NE-CONVERT, and raises on an AVX2-only CPU (seen on a 2-core AMD EPYC)."""
    return _packs(torch.bfloat16)


def _packs(dtype: torch.dtype) -> bool:
    """Probe with a small weight: oneDNN packs and multiplies `dtype`, and agrees with F.linear."""
    try:
        g = torch.Generator().manual_seed(0)  # leave the global RNG alone (tiny models seed it)
        w, x = torch.randn(16, 8, generator=g), torch.randn(3, 8, generator=g)
        w, x = w.to(dtype), x.to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        atol = 1e-4 if dtype == torch.float32 else 1e-1
        return bool(torch.allclose(y.float(), (x @ w.T).float(), atol=atol))
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """A frozen `nn.Linear` whose weight lives in oneDNN's packed layout. The packed op has no
    backward, so an input that needs gradients (training an adapter that feeds this layer, e.g.
    SPACE's mask rows) takes the plain weight instead."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = True) -> None:
        """keep_weight=False: only the packed copy stays (an inference-only linear built for
        decoding, e.g. SPACE's stacked one: its weight is not saved, takes no gradients, and
        costs half the memory)."""
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # Small weights, and bfloat16 ones where oneDNN cannot pack them, run through F.linear.
        self.unpacked = ""  # why the layer is not packed ("" when it is)
        if linear.weight.numel() <= MIN_PACKED:
            self.unpacked = "small"
        elif linear.weight.dtype == torch.bfloat16 and not bf16_packable():
            self.unpacked = "bfloat16, which oneDNN cannot pack on this CPU"
        small = bool(self.unpacked)
        packed = None
        if not small:
            with torch.no_grad():
                w = linear.weight.detach()
                packed = torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT)
        self.register_buffer("packed_weight", packed, persistent=False)
        # The plain weight stays too (unless asked not to, and the layer is packed), so
        # state_dict / save_pretrained / tied embeddings still work.
        self.weight = linear.weight if keep_weight or small else None
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is None or (
            self.weight is not None
            and torch.is_grad_enabled()
            and (x.requires_grad or self.weight.requires_grad)
        ):
            return nn.functional.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        how = f"{self.unpacked}: not packed" if self.unpacked else "packed"
        return f"in_features={self.in_features}, out_features={self.out_features}, {how}"


def pack_linears(model: nn.Module) -> int:
    """Swap every float32 (or bfloat16: drafting heads) CPU `nn.Linear` in `model` for a
    `PackedLinear`; returns how many. Tied weights stay usable: the embedding keeps its own
    tensor, the LM head gets a packed copy."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
        and child.weight.device.type == "cpu"
        and child.weight.dtype in (torch.float32, torch.bfloat16)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
