"""Forward primitives every decoder shares: a timed forward against a KV cache, and cache rollback.

One call, `forward()`, covers all the shapes the methods need:
- a chain of new tokens (causal), or any token tree / interleaved branches via a 4D mask and
  explicit position ids;
- full depth through the model's own forward, or a partial depth (`layers=k`: the first k layers,
  then the final norm and LM head — self-drafting) or any layer subset, by iterating
  `model.model.layers` here rather than touching the model's config;
- hidden states at chosen layers on request.
A forward split at an exit layer ℓ (Kangaroo) has two more: `forward_shallow()` (the first ℓ layers
and an optional early-exit head, no LM head) and `forward_from()` (resume from layer-ℓ states
through the rest of the model).
Each call times itself (synchronizing CUDA) into a `Forward` event.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import create_causal_mask

from decoders.core.errors import InvalidParameter
from decoders.core.events import Forward
from decoders.core.models import ModelBundle

Tokens = Sequence[int] | torch.Tensor

# transformers 5.2x renamed the models' `past_key_values` argument to `cache` (the old name warns
# until its removal in 5.40): pass the cache under whichever name this install knows.
CACHE_ARG = (
    "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
)


def cache_arg(cache: DynamicCache | None) -> dict[str, DynamicCache | None]:
    """`**cache_arg(cache)`: the KV cache as a keyword of a model, layer or mask call."""
    return {CACHE_ARG: cache}


@dataclass
class ForwardResult:
    logits: (
        torch.Tensor
    )  # [n_kept, vocab], float32, for the last `logits_to_keep` inputs (all if 0)
    hidden: dict[int, torch.Tensor]  # layer -> [n_inputs, d]; layer L = after L decoder layers
    event: Forward | None  # None: nothing ran (a block drafter's deeper levels: BlockTreeDrafter)
    features: torch.Tensor | None = None  # [n_inputs, d] what the LM head reads (after the norm)


def new_cache(bundle: ModelBundle) -> DynamicCache:
    """An empty KV cache for one run: a full `DynamicLayer` for every decoder layer, the
    sliding-window ones too. transformers would give those a cache that keeps only the last W
    positions, which a crop cannot roll back; inside the window (the engine refuses a request
    that outgrows it: models.check_window) such a layer keeps every position anyway, so a full
    one holds the very same entries, and crop_cache / keep_cache work on it as on any other."""
    if bundle.window is None:
        return DynamicCache(config=bundle.model.config)
    # Made up front, as transformers makes them from a config: code that reads layer i's length
    # before layer i has run finds it empty.
    cache = DynamicCache()  # without a config: full layers, made as layers first write
    cache.layers.extend(DynamicLayer() for _ in range(bundle.n_layers))
    return cache


def head_logits(bundle: ModelBundle, feats: torch.Tensor) -> torch.Tensor:
    """The LM head on final features (the final norm's output), as the model's own forward
    applies it: with its final logit softcapping where it has one (Gemma-2: cap * tanh(z / cap))."""
    logits = bundle.model.lm_head(feats)
    if bundle.logit_softcap:
        logits = torch.tanh(logits / bundle.logit_softcap) * bundle.logit_softcap
    return logits


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


@torch.inference_mode()
def forward(
    bundle: ModelBundle,
    cache: DynamicCache,
    tokens: Tokens,
    *,
    step: int,
    kind: str,
    positions: Sequence[int] | torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    layers: int | Sequence[int] | None = None,
    logits_to_keep: int = 0,
    hidden_at: Sequence[int] = (),
    skip: SkipSet | None = None,
    features: bool = False,
) -> ForwardResult:
    """Run `tokens` (appended to `cache`) and return their logits.

    positions: absolute position of each input (default: right after the cache).
    mask: optional additive 4D mask [1, 1, n, cache_len + n] (0 = attend, -inf = blocked); see
        `tree.py`. Without one, new tokens attend causally to the cache and each other.
    layers: None = every layer; k = the first k layers; a sequence = exactly those layer indices.
        Partial depth appends KV only for the layers run: crop the cache afterwards.
    skip: sublayers to leave out (Draft & Verify): every layer runs, minus these attention / MLP
        blocks. One input token at a time, at an explicit position (skipped attention writes no
        KV, so the layers' caches differ in length until the cache is cropped back).
    features: also return the final features (the norm's output, every input) for EAGLE's head.
    """
    ids = torch.as_tensor(tokens, dtype=torch.long, device=bundle.device).view(1, -1)
    n = ids.shape[1]
    pos = _positions(bundle, positions, cache.get_seq_length(), n)
    if mask is not None:
        mask = mask.to(device=bundle.device, dtype=bundle.dtype)
    layer_ids = _layer_ids(bundle, layers, need_inner=features or bool(hidden_at))
    if skip:
        assert n == 1 and positions is not None, "skip-layer forwards take one token at a position"

    # No hooks, no attributes: the model is shared by concurrent runs, so everything this forward
    # computes stays in local variables (a hook on a shared module fires for every run's forward).
    start = time.perf_counter()
    logits, feats, hidden, n_layers = _run_model(
        bundle, cache, ids, pos, mask, layer_ids, logits_to_keep, hidden_at, skip, features
    )
    if feats is not None:  # [1, n, d] after the final norm: the LM head reads the kept rows
        logits = head_logits(bundle, feats[:, -logits_to_keep:] if logits_to_keep else feats)[0]
    wall_ms = elapsed_ms(bundle, start)
    event = Forward(step=step, kind=kind, n_input_tokens=n, layers=n_layers, wall_ms=wall_ms)
    return ForwardResult(logits.float(), hidden, event, feats[0] if features else None)


def _run_model(
    bundle: ModelBundle,
    cache: DynamicCache,
    ids: torch.Tensor,
    pos: torch.Tensor,
    mask: torch.Tensor | None,
    layer_ids: list[int] | None,
    logits_to_keep: int,
    hidden_at: Sequence[int],
    skip: SkipSet | None,
    features: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[int, torch.Tensor], int]:
    """`forward`'s model pass, by the cheapest path that gives what was asked: the model's own
    forward (logits), its inner model (final features), or the decoder layers written out (a
    partial depth, hidden states) or as their residual blocks (skipped sublayers). Returns the
    logits (None where the LM head is still to run), the final features [1, n, d] (None for the
    model's own forward), the hidden states asked for and the decoder layers run."""
    model = bundle.model
    if skip:
        feats = _forward_skipping(bundle, cache, ids, pos, skip)
        return None, feats, {}, bundle.n_layers - len(skip.attn & skip.mlp)
    if layer_ids is None and not (features or hidden_at):
        # The plain path: the model's own forward, which works for any causal LM.
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(cache),
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        return out.logits[0], None, {}, bundle.n_layers
    if layer_ids is None and not hidden_at:
        # Full depth with features: the inner model's output is the final norm's (what the LM
        # head reads), then the head on the kept rows, exactly as the model's own forward does.
        feats = model.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(cache),
            use_cache=True,
        ).last_hidden_state
        return None, feats, {}, bundle.n_layers
    # transformers records hidden states with hooks it installs on the shared layers; our own
    # layer loop hands them back as return values instead.
    run = layer_ids if layer_ids is not None else list(range(bundle.n_layers))
    feats, hidden = _forward_layers(bundle, cache, ids, pos, mask, run, hidden_at)
    return None, feats, hidden, len(run)


def _layer_ids(
    bundle: ModelBundle, layers: int | Sequence[int] | None, need_inner: bool = False
) -> list[int] | None:
    """The decoder layers to run, None = all of them; checks that the model's parts can be run
    one by one where that is needed (partial depth, features, hidden states)."""
    total = bundle.n_layers
    if layers is None or (isinstance(layers, int) and layers == total):
        ids = None
    else:
        ids = list(range(layers)) if isinstance(layers, int) else sorted(set(layers))
        if not ids or ids[0] < 0 or ids[-1] >= total:
            raise ValueError(f"layers must select from 0..{total - 1}, got {layers!r}")
        if ids == list(range(total)):
            ids = None
    if ids is None and not need_inner:
        return None
    require_layers(bundle, "running part of the model (or reading its features)")
    return ids


def require_layers(bundle: ModelBundle, what: str) -> None:
    """Refuse, by name, a model whose decoder layers cannot be run one by one (`what` needs that):
    methods call it from their `check`, so the run is refused before it starts."""
    inner = getattr(bundle.model, "model", None)
    if inner is None or not all(
        hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")
    ):
        raise InvalidParameter(
            f"{what} needs a Llama-style decoder whose layers run one by one; "
            f"{type(bundle.model).__name__} is not one (autoregressive, prompt_lookup, jacobi, "
            "lookahead and speculative with a draft model call only the whole model: they run "
            "on it)"
        )


def _forward_layers(bundle, cache, ids, pos, mask, layer_ids, hidden_at):
    """The inner model's forward, written out so that we choose which decoder layers run and
    hand back hidden states as values. Returns the final norm's output [1, n, d] and the hidden
    states asked for. One causal mask serves every layer: inside the window the engine keeps a
    run to (models.check_window), a sliding layer's mask is that causal mask."""
    inner = bundle.model.model
    h = inner.embed_tokens(ids)
    if mask is None:
        mask = _causal_mask(bundle, cache, h, pos)
    rope = inner.rotary_emb(h, position_ids=pos)
    hidden = {0: h[0]} if 0 in hidden_at else {}
    for depth, i in enumerate(layer_ids, start=1):
        h = inner.layers[i](
            h,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(cache),
            use_cache=True,
            position_embeddings=rope,
        )
        if depth in hidden_at:
            hidden[depth] = h[0]
    return inner.norm(h), hidden


@dataclass(frozen=True)
class SkipSet:
    """Which sublayers a self-speculative draft leaves out: layer indices for attention and MLP."""

    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.attn or self.mlp)

    def kept_fraction(self, bundle: ModelBundle) -> float:
        """Share of the model's weights a draft forward still reads (decoding is memory-bound)."""
        layer = bundle.model.model.layers[0]
        attn = sum(p.numel() for p in layer.self_attn.parameters())
        mlp = sum(p.numel() for p in layer.mlp.parameters())
        head = bundle.model.config.vocab_size * bundle.model.config.hidden_size
        total = bundle.n_layers * (attn + mlp) + head
        return (total - len(self.attn) * attn - len(self.mlp) * mlp) / total


def _forward_skipping(bundle, cache, ids, pos, skip: SkipSet) -> torch.Tensor:
    """Each decoder layer written out as its two residual blocks, so either can be left out.
    Returns the final norm's output [1, n, d]."""
    inner = bundle.model.model
    h = inner.embed_tokens(ids)
    rope = inner.rotary_emb(h, position_ids=pos)
    for i, layer in enumerate(inner.layers):
        with weights_of(layer, h) as h:
            here = tuple(r.to(h.device) for r in rope)
            if i not in skip.attn:
                a, _ = layer.self_attn(
                    hidden_states=layer.input_layernorm(h),
                    attention_mask=None,  # one query token: it may see its whole (per-layer) cache
                    position_ids=pos.to(h.device),
                    **cache_arg(cache),
                    use_cache=True,
                    position_embeddings=here,
                )
                h = h + attention_out(layer, a)
            if i not in skip.mlp:
                h = h + mlp_out(layer, h)
    return inner.norm(h)


def attention_out(layer: torch.nn.Module, a: torch.Tensor) -> torch.Tensor:
    """What a decoder layer adds to its residual stream from its attention's output `a`: `a`
    itself (Llama), or `a` normed (Gemma-2's sandwich norms: `post_attention_layernorm` is the
    attention output's norm there, and `pre_feedforward_layernorm` the MLP input's)."""
    return layer.post_attention_layernorm(a) if _sandwich(layer) else a


def mlp_out(layer: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """What a decoder layer's MLP block adds to the residual stream `h`, as its own forward
    computes it (Llama: mlp(norm(h)); Gemma-2: norm(mlp(norm(h))), see attention_out)."""
    if _sandwich(layer):
        return layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
    return layer.mlp(layer.post_attention_layernorm(h))


def _sandwich(layer: torch.nn.Module) -> bool:
    return hasattr(layer, "pre_feedforward_layernorm") and hasattr(
        layer, "post_feedforward_layernorm"
    )


# --- early exit: a forward split at layer ℓ (Kangaroo) ---------------------------------------------


@torch.inference_mode()
def forward_shallow(
    bundle: ModelBundle,
    cache: DynamicCache,
    tokens: Tokens,
    depth: int,
    *,
    step: int,
    kind: str,
    positions: Sequence[int] | torch.Tensor | None = None,
    exit_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ForwardResult:
    """Early exit: `tokens` through the first `depth` decoder layers only (their KV appended to
    those layers of `cache`; the deeper layers are not touched), with no final norm and no LM head.
    Returns their layer-`depth` states as `hidden[depth]`, [n, d].
    exit_head: runs on those states inside the same timed forward (an early-exit head, e.g.
        Kangaroo's adapter and LM head rows); its output is the result's `logits` and it counts
        as one more layer in the Forward event. Without one, `logits` is empty."""
    ids = torch.as_tensor(tokens, dtype=torch.long, device=bundle.device).view(1, -1)
    n = ids.shape[1]
    past = cache.get_seq_length(0)
    pos = _positions(bundle, positions, past, n)
    start = time.perf_counter()
    h = _run_layers(bundle, cache, bundle.model.model.embed_tokens(ids), pos, range(depth))
    logits = exit_head(h[0]).float() if exit_head is not None else h.new_empty(0)
    event = Forward(
        step=step,
        kind=kind,
        n_input_tokens=n,
        layers=depth + (exit_head is not None),
        wall_ms=elapsed_ms(bundle, start),
        split=depth,
        shallow=n,
    )
    return ForwardResult(logits, {depth: h[0]}, event)


@torch.inference_mode()
def forward_from(
    bundle: ModelBundle,
    cache: DynamicCache,
    hidden: torch.Tensor,
    depth: int,
    *,
    step: int,
    kind: str,
    tokens: Tokens = (),
    positions: Sequence[int] | None = None,
    mask: torch.Tensor | None = None,
) -> ForwardResult:
    """Resume a forward at layer `depth`: `hidden` [m, d] are the layer-`depth` states of inputs
    whose KV for the first `depth` layers is already in `cache` (an early exit computed them);
    `tokens` come after them and have not been that far: they run the first `depth` layers here,
    first. Then all m + len(tokens) inputs run layers depth..L-1, the final norm and the LM head,
    at the positions right after what the deeper layers have cached. Returns every input's logits
    and their layer-`depth` states (`hidden[depth]`); Forward.layers counts the decoder layers
    run: L when there were `tokens`, else L - depth.
    positions / mask: for a tree (see `tree.py`), every input's position and the additive mask
    [1, 1, m + k, past + m + k] over the deep layers' cache; `tokens` take its last k rows in the
    shallow layers, whose cache already holds the m states' keys. The m inputs are a chain, their
    shallow keys computed causally (drafting); only the `tokens` may branch. Default: a chain."""
    inner = bundle.model.model
    past = cache.get_seq_length(depth)  # the deep layers hold the context, not the drafts
    m = hidden.shape[0]
    ids = torch.as_tensor(tokens, dtype=torch.long, device=bundle.device).view(1, -1)
    k = ids.shape[1]
    assert not k or cache.get_seq_length(0) == past + m, "the shallow layers must hold the states"
    start = time.perf_counter()
    h = hidden.view(1, m, bundle.model.config.hidden_size).to(bundle.dtype)
    pos = _positions(bundle, positions, past, m + k)
    if mask is not None:
        mask = mask.to(device=bundle.device, dtype=bundle.dtype)
    if k:
        shallow = _run_layers(
            bundle,
            cache,
            inner.embed_tokens(ids),
            pos[:, m:],
            range(depth),
            mask=None if mask is None else mask[:, :, m:],
        )
        h = torch.cat([h, shallow], dim=1)
    states = h[0]
    h = _run_layers(bundle, cache, h, pos, range(depth, bundle.n_layers), depth, mask)
    logits = head_logits(bundle, inner.norm(h))[0]
    event = Forward(
        step=step,
        kind=kind,
        n_input_tokens=m + k,
        layers=bundle.n_layers - (0 if k else depth),
        wall_ms=elapsed_ms(bundle, start),
        split=depth,
        shallow=k,
    )
    return ForwardResult(logits.float(), {depth: states}, event)


def _positions(bundle: ModelBundle, positions, past: int, n: int) -> torch.Tensor:
    """[1, n] absolute positions: the given ones, else right after `past`."""
    if positions is None:
        return torch.arange(past, past + n, device=bundle.device).view(1, -1)
    return torch.as_tensor(positions, dtype=torch.long, device=bundle.device).view(1, -1)


def _causal_mask(bundle, cache, h, pos, layer: int | None = None):
    """The model's own causal mask for inputs h at positions `pos`, after what `cache` holds (at
    decoder layer `layer`; None: transformers' default)."""
    return create_causal_mask(
        config=bundle.model.config,
        inputs_embeds=h,
        attention_mask=None,
        **cache_arg(cache),
        position_ids=pos,
        layer_idx=layer,
    )


def _run_layers(
    bundle, cache, h, pos, layer_ids, mask_layer: int = 0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Decoder layers `layer_ids`, in order, on states h [1, n, d] at positions `pos`, causally
    against what `cache` holds for them (sized by layer `mask_layer`: layers of one split hold the
    same tokens, the two sides of an exit may not), or under the given additive `mask` (for
    sliding layers as for full ones: inside the window they see every position too)."""
    inner = bundle.model.model
    if mask is None:
        mask = _causal_mask(bundle, cache, h, pos, mask_layer)
    rope = inner.rotary_emb(h, position_ids=pos)
    for i in layer_ids:
        h = inner.layers[i](
            h,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(cache),
            use_cache=True,
            position_embeddings=rope,
        )
    return h


@contextmanager
def weights_of(
    module: torch.nn.Module, h: torch.Tensor | None = None
) -> Iterator[torch.Tensor | None]:
    """Run a block's parts one by one under accelerate's device map (models.load_model's
    `device_map`): a block offloaded to the CPU or disk holds its weights only inside its own
    forward, so calling its attention, MLP or projections directly needs them brought in first
    (the block's hook does it, and takes them back after) and the input on the block's execution
    device. Yields `h` there. Without a hook (no device map): nothing to do."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        yield h
        return
    hook.pre_forward(module)
    try:
        device = getattr(hook, "execution_device", None)
        yield h.to(device) if h is not None and device is not None else h
    finally:
        hook.post_forward(module, None)


def elapsed_ms(bundle: ModelBundle, start: float) -> float:
    """Milliseconds since `start` (perf_counter), once the device is done (CUDA runs async)."""
    if bundle.device.type == "cuda":
        torch.cuda.synchronize(bundle.device)
    return round((time.perf_counter() - start) * 1000.0, 3)


# --- KV-cache rollback ------------------------------------------------------------------------------


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Chains: forget everything after the first `length` positions (every layer)."""
    for layer in cache.layers:
        if (
            getattr(layer, "keys", None) is not None
            and layer.keys.numel()
            and layer.keys.shape[-2] > length
        ):
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_cache(cache: DynamicCache, prefix: int, keep: Sequence[int]) -> None:
    """Trees and interleaved inputs: keep the first `prefix` positions, then only the entries at
    `prefix + i` for i in `keep` (in that order), compacted so the cache stays contiguous."""
    keep = list(keep)
    if keep == list(range(len(keep))):  # the accepted entries already sit in place: a crop suffices
        crop_cache(cache, prefix + len(keep))
        return
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or not layer.keys.numel():
            continue
        index = torch.cat(
            [
                torch.arange(prefix, device=layer.keys.device),
                torch.as_tensor(keep, dtype=torch.long, device=layer.keys.device) + prefix,
            ]
        )
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
