"""Early exit on a frozen target: trained exit adapters, and the forward that stops at one of them.

An exit at layer ℓ turns the state after ℓ decoder layers straight into next-token scores:

    logits_ℓ(h) = LM head(final norm(h + up_ℓ(down_ℓ(norm_ℓ(h)))))

a low-rank residual adapter per exit layer in front of the target's own final norm and LM head
(draft-vocabulary rows, as the drafting heads use). `up_ℓ` starts at zero, so an untrained exit is
the plain "logit lens"; training (`python -m decoders.train exits`) distils the final layer's
distribution into it. Each exit also carries CALM's early-exit classifier, a linear probe on the
adapted features that predicts whether this exit's top-1 is the final layer's.

The skipped layers still owe the exited token's keys and values: later tokens attend to it at
every layer. Two ways to pay them (`fill`):
- "propagate" (CALM's state propagation; HASH EE's copied states): the exited state h_ℓ stands in
  for the skipped layers' inputs, so each skipped layer only runs its key/value projections;
- "compute": the skipped layers run for real on the token (the true cache; no compute saved), to
  show what propagation changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from decoders.core.base import Budget
from decoders.core.errors import InvalidParameter
from decoders.core.events import Commit, Forward
from decoders.core.models import ModelBundle
from decoders.core.runtime import cache_arg, elapsed_ms, weights_of
from decoders.trained.artifacts import artifact_path, full_logits, load_artifact

KIND = "exits"
FILLS = ("propagate", "compute")


class ExitAdapters(nn.Module):
    """One exit per layer in `layers` (ℓ = decoder layers run before it, 1 ≤ ℓ < L)."""

    # Buffers counted on the training corpus: a warm start (`--init`) keeps this run's.
    FROM_CORPUS = ("vocab", "token_counts")

    def __init__(
        self,
        config,
        layers: Sequence[int],
        rank: int,
        vocab: torch.Tensor,
        token_counts: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.norms = nn.ModuleList(LlamaRMSNorm(d, eps=eps) for _ in layers)
        self.down = nn.ModuleList(nn.Linear(d, rank, bias=False) for _ in layers)
        self.up = nn.ModuleList(nn.Linear(rank, d, bias=False) for _ in layers)
        self.classifier = nn.ModuleList(nn.Linear(d, 1) for _ in layers)
        for up in self.up:
            nn.init.zeros_(up.weight)  # an untrained exit is the logit lens
        self.register_buffer("layers", torch.tensor(list(layers), dtype=torch.long))
        self.register_buffer("vocab", vocab.long())  # the LM-head rows an exit scores
        # How often the target predicted each token id on the training corpus (HASH EE's hash).
        counts = torch.zeros(config.vocab_size) if token_counts is None else token_counts
        counts = counts.long()  # integer: saved exactly (floating buffers are saved as float16)
        self.register_buffer("token_counts", counts)
        self._set_layers(layers)

    def _set_layers(self, layers) -> None:
        """Plain-Python copies of the `layers` buffer: the decode loop reads them every token."""
        self._exit_layers = tuple(int(x) for x in layers)
        self.index = {ell: i for i, ell in enumerate(self._exit_layers)}  # layer ℓ -> exit i

    @property
    def exit_layers(self) -> tuple[int, ...]:
        return self._exit_layers

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):
        out = super().load_state_dict(state, strict=strict, assign=assign)
        self._set_layers(self.layers.tolist())
        return out

    def features(self, i: int, h: torch.Tensor, final_norm: nn.Module) -> torch.Tensor:
        """What the LM head reads at exit i, [..., d]."""
        return final_norm(h + self.up[i](self.down[i](self.norms[i](h))))

    def confidence_logit(self, i: int, features: torch.Tensor) -> torch.Tensor:
        """The early-exit classifier's logit at exit i (sigmoid: P(top-1 = the final layer's))."""
        return self.classifier[i](features).squeeze(-1)

    @classmethod
    def fresh(cls, bundle: ModelBundle, layers: Sequence[int], rank: int, vocab, counts=None):
        return cls(bundle.model.config, layers, rank, vocab, counts).to(bundle.device)


def adapters_path(model_id: str) -> Path:
    return artifact_path(KIND, model_id)


def load_exits(bundle: ModelBundle) -> ExitAdapters:
    """The trained exit adapters for `bundle`'s model (cached, frozen, in its dtype)."""
    check_model(bundle)
    return load_artifact(
        bundle,
        adapters_path(bundle.model_id),
        lambda state: ExitAdapters(
            bundle.model.config,
            state["layers"].tolist(),
            state["down.0.weight"].shape[0],
            state["vocab"],
            state["token_counts"],
        ),
        "exit adapters",
        f"python -m decoders.train exits --model {bundle.model_id}",
    )


def check_model(bundle: ModelBundle) -> None:
    """Early exit writes keys and values layer by layer: it needs a Llama-style attention (q/k/v
    projections, rotary keys, no per-head key norm)."""
    layers = getattr(getattr(bundle.model, "model", None), "layers", None)
    attn = getattr(layers[0], "self_attn", None) if layers is not None else None
    if attn is None or not all(hasattr(attn, a) for a in ("k_proj", "v_proj", "head_dim")):
        raise InvalidParameter(
            f"early exit needs a Llama-style decoder; {type(bundle.model).__name__} is not one"
        )
    if hasattr(attn, "k_norm"):
        raise InvalidParameter(
            f"early exit's state propagation does not handle {type(bundle.model).__name__}'s "
            "key norm; use a Llama-style model"
        )


def exit_logits(bundle: ModelBundle, exits: ExitAdapters, i: int, h: torch.Tensor):
    """Exit i on states h [n, d]: (full-vocabulary logits [n, vocab], the adapted features)."""
    feats = exits.features(i, h, bundle.model.model.norm)
    return full_logits(bundle, exits.vocab, exits.lm_head(feats)), feats


# A decision at one exit: given (exit index i, layer ℓ, state after ℓ layers [1, d], state one
# layer below [1, d]), the next token's full-vocabulary logits to exit with, or None to go on.
Stop = Callable[[int, int, torch.Tensor, torch.Tensor], torch.Tensor | None]


def commit_exit(
    step: int, logits: torch.Tensor, depth: int, n_layers: int, budget: Budget
) -> Commit:
    """Write the greedy token of the logits the token left with, at `depth` of `n_layers`: from an
    exit, or from the full model when it climbed all the way."""
    token = int(logits.argmax())
    prob = round(float(torch.softmax(logits, -1)[token]), 6)
    origin = "exit" if depth < n_layers else "target"
    taken = budget.take([token])
    return Commit(step, tuple(taken), (origin,) * len(taken), (prob,) * len(taken))


@torch.inference_mode()
def exit_forward(
    bundle: ModelBundle,
    exits: ExitAdapters,
    cache: DynamicCache,
    token: int,
    position: int,
    stop: Stop,
    *,
    fill: str,
    step: int,
) -> tuple[torch.Tensor, int, Forward]:
    """One token through the decoder layers, offering `stop` each exit on the way up.
    Returns the next token's logits [vocab] (the exit's, or the full model's), the layer it left at
    (L = no exit) and the Forward event; `layers` there counts the decoder layers that ran (the key/
    value projections of propagation are not counted; `fill="compute"` runs every layer)."""
    inner = bundle.model.model
    n_layers = bundle.n_layers
    ids = torch.tensor([[token]], device=bundle.device)
    pos = torch.tensor([[position]], device=bundle.device)
    start = time.perf_counter()
    h = inner.embed_tokens(ids)
    rope = inner.rotary_emb(h, position_ids=pos)
    index = exits.index
    logits, depth = None, n_layers
    for ell, layer in enumerate(inner.layers, start=1):
        below = h
        h = layer(h, position_ids=pos, **cache_arg(cache), use_cache=True, position_embeddings=rope)
        if ell in index and ell < n_layers:
            logits = stop(index[ell], ell, h[0], below[0])
            if logits is not None:
                depth = ell
                break
    ran = depth
    if logits is None:
        logits = bundle.model.lm_head(inner.norm(h))[0]
    elif fill == "propagate":
        propagate(bundle, cache, h, rope, range(depth, n_layers))
    else:
        for layer in inner.layers[depth:]:
            h = layer(
                h, position_ids=pos, **cache_arg(cache), use_cache=True, position_embeddings=rope
            )
        ran = n_layers
    event = Forward(step, "target", 1, ran, elapsed_ms(bundle, start))
    return logits[-1].float(), depth, event


def propagate(
    bundle: ModelBundle,
    cache: DynamicCache,
    h: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    layer_ids: Sequence[int] | range,
) -> None:
    """State propagation: the exited states h [1, n, d] feed each skipped layer's key and value
    projections (its input norm, then k and v, keys rotated to their positions), appended to that
    layer's cache: exactly the entries the layer would own, from a stand-in for its input."""
    for i in layer_ids:
        layer = bundle.model.model.layers[i]
        with weights_of(layer, h) as here:  # its weights, where a device map keeps them
            attn = layer.self_attn
            x = layer.input_layernorm(here)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            cos, sin = (r.to(x.device) for r in rope)
            _, k = apply_rotary_pos_emb(k, k, cos, sin)
            cache.update(k, v, i)
