"""The exit-tuned model: the embedded SmolLM2-135M-Instruct tuned for early exit (LayerSkip,
Elhoushi et al. 2024), a model of its own, shipped as a small delta on the embedded weights.

The frozen model was never trained to be read before its last layer: an intermediate layer read
through the final norm and the LM head agrees with the last one ~5 % of the time up to layer 16.
LayerSkip tunes the model itself for that (`python -m decoders.train layerskip`):

    layer dropout   each token skips decoder layer l (its residual update) with probability
                    p_l = p_max · (exp(l · ln 2 / (L − 1)) − 1): 0 at the first layer, p_max at
                    the last; a token that skips a layer still writes that layer's keys and
                    values from its input, exactly what an early exit's state propagation writes
    early exit      every layer's state is also read through the shared final norm and LM head
                    and learns the next token there, deeper exits weighed more, a rotating subset
                    of the exits each step (the rotational curriculum)

What ships (`assets/layerskip/<model>.safetensors`, with its card): for every linear W of every
decoder layer (attention q, k, v, o; MLP gate, up, down) a low-rank update W + (α/r)·B·A, and
each layer's two RMSNorm weights; the embeddings, the final norm and the LM head stay the
embedded model's (they are the shared exit head). Loading merges it into the float32 weights on
the CPU, so the tuned model is the same numbers wherever it runs. Also the draft vocabulary that
`layerskip` scores its drafts over (rows of the LM head, as the trained drafters do).

Decoding on it is lossless against *its own* greedy output, not the embedded model's.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

KIND = "layerskip"
TUNED_SUFFIX = "-exit-tuned"
LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
NORMS = ("input_layernorm", "post_attention_layernorm")


DELTA_ENV = "DECODING_LAB_LAYERSKIP_DELTA"  # another delta for the embedded model (a GPU run's)


def delta_path(base_id: str) -> Path:
    """assets/layerskip/<base model>.safetensors: the delta that makes `<base>-exit-tuned` (for
    the embedded model, $DECODING_LAB_LAYERSKIP_DELTA instead where it is set: a delta just
    trained, tried before it ships)."""
    from decoders.core.models import EMBEDDED_ID
    from decoders.trained.artifacts import artifact_path

    if base_id == EMBEDDED_ID and os.environ.get(DELTA_ENV):
        return Path(os.environ[DELTA_ENV])
    return artifact_path(KIND, base_id)


def dropout_rates(n_layers: int, p_max: float) -> list[float]:
    """LayerSkip's per-layer dropout: p_max · (exp(l · ln 2 / (L − 1)) − 1) for l = 0 .. L − 1,
    rising exponentially from 0 at the first layer to p_max at the last."""
    if n_layers == 1:
        return [p_max]
    return [p_max * (math.exp(i * math.log(2) / (n_layers - 1)) - 1) for i in range(n_layers)]


class LoRALinear(nn.Module):
    """A frozen linear plus a trainable low-rank update: y = W x + (α/r) · B (A x). B starts at
    zero, so a fresh one is the original linear. For training only: loading merges the update."""

    def __init__(self, base: nn.Module, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        d_in, d_out = base.weight.shape[1], base.weight.shape[0]
        dev = base.weight.device
        self.A = nn.Parameter(torch.randn(rank, d_in, device=dev) / math.sqrt(d_in))
        self.B = nn.Parameter(torch.zeros(d_out, rank, device=dev))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * nn.functional.linear(
            nn.functional.linear(x, self.A.to(x.dtype)), self.B.to(x.dtype)
        )


def attach(model: nn.Module, rank: int, alpha: float) -> nn.ParameterDict:
    """Make a private copy of a model trainable as LayerSkip tunes it: a LoRALinear around every
    linear of every decoder layer, each layer's norms trainable, everything else frozen. Returns
    the trainable tensors under the names `delta_state` saves them by."""
    model.requires_grad_(False)
    found: dict[str, nn.Parameter] = {}
    for i, layer in enumerate(model.model.layers):
        for name in LINEARS:
            parent_name, _, leaf = name.rpartition(".")
            parent = layer.get_submodule(parent_name)
            lora = LoRALinear(getattr(parent, leaf), rank, alpha)
            setattr(parent, leaf, lora)
            found[f"layers.{i}.{name}.A"] = lora.A
            found[f"layers.{i}.{name}.B"] = lora.B
        for name in NORMS:
            weight = layer.get_submodule(name).weight
            weight.requires_grad_(True)
            found[f"layers.{i}.{name}.weight"] = weight
    return nn.ParameterDict({k.replace(".", "/"): v for k, v in found.items()})


def delta_state(params: nn.ParameterDict, rank: int, alpha: float, vocab: torch.Tensor) -> dict:
    """What ships: the trainable tensors of `attach`, the LoRA shape, and the draft vocabulary."""
    state = {k.replace("/", "."): v.detach() for k, v in params.items()}
    state["rank"] = torch.tensor(rank)
    state["alpha"] = torch.tensor(float(alpha))
    state["vocab"] = vocab.long()
    return state


@torch.no_grad()
def apply_delta(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Merge a delta into a plain (unpacked) model in place: W += (α/r) · B · A, computed in
    float32 on the CPU, and the norms' weights replaced."""
    rank, alpha = int(state["rank"]), float(state["alpha"])
    scale = alpha / rank
    layers = model.model.layers
    expected = {f"layers.{i}.{n}.{p}" for i in range(len(layers)) for n in LINEARS for p in "AB"}
    expected |= {f"layers.{i}.{n}.weight" for i in range(len(layers)) for n in NORMS}
    missing = expected - set(state)
    if missing:
        raise ValueError(f"the delta lacks {len(missing)} tensors, e.g. {sorted(missing)[:2]}")
    for i, layer in enumerate(layers):
        for name in LINEARS:
            linear = layer.get_submodule(name)
            a = state[f"layers.{i}.{name}.A"].float().cpu()
            b = state[f"layers.{i}.{name}.B"].float().cpu()
            w = linear.weight
            merged = w.detach().float().cpu() + scale * (b @ a)
            w.copy_(merged.to(w.device, w.dtype))
        for name in NORMS:
            w = layer.get_submodule(name).weight
            w.copy_(state[f"layers.{i}.{name}.weight"].to(w.device, w.dtype))


def load_delta(base_id: str, path: Path | None = None) -> dict[str, torch.Tensor]:
    """The shipped delta for `base_id` (or the file at `path`)."""
    from decoders.core.errors import ModelLoadError

    path = path or delta_path(base_id)
    if not path.is_file():
        raise ModelLoadError(
            f"the exit-tuned model needs {path.name} in assets/{KIND}/; make it with "
            "`python -m decoders.train layerskip`"
        )
    return load_file(str(path))
