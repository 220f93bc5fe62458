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
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache
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
    event: Forward
    features: torch.Tensor | None = None  # [n_inputs, d] what the LM head reads (after the norm)


def new_cache(bundle: ModelBundle) -> DynamicCache:
    return DynamicCache(config=bundle.model.config)


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
    model = bundle.model
    device = bundle.device
    ids = torch.as_tensor(tokens, dtype=torch.long, device=device).view(1, -1)
    n = ids.shape[1]
    past = cache.get_seq_length()
    pos = (
        torch.arange(past, past + n, device=device)
        if positions is None
        else torch.as_tensor(positions, dtype=torch.long, device=device)
    ).view(1, -1)
    if mask is not None:
        mask = mask.to(device=device, dtype=bundle.dtype)
    layer_ids = _layer_ids(bundle, layers, need_inner=features or bool(hidden_at))

    # No hooks, no attributes: the model is shared by concurrent runs, so everything this forward
    # computes stays in local variables (a hook on a shared module fires for every run's forward).
    start = time.perf_counter()
    feats = None
    if skip:
        assert n == 1 and positions is not None, "skip-layer forwards take one token at a position"
        feats = _forward_skipping(bundle, cache, ids, pos, skip)
        hidden: dict[int, torch.Tensor] = {}
        n_layers = bundle.n_layers - len(skip.attn & skip.mlp)
    elif layer_ids is None and not (features or hidden_at):
        # The plain path: the model's own forward, which works for any causal LM.
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(cache),
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        logits, hidden, n_layers = out.logits[0], {}, bundle.n_layers
    elif layer_ids is None and not hidden_at:
        # Full depth with features: the inner model's output is the final norm's (what the LM
        # head reads), then the head on the kept rows, exactly as the model's own forward does.
        feats = model.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(cache),
            use_cache=True,
        ).last_hidden_state
        hidden, n_layers = {}, bundle.n_layers
    else:
        # transformers records hidden states with hooks it installs on the shared layers; our own
        # layer loop hands them back as return values instead.
        run = layer_ids if layer_ids is not None else list(range(bundle.n_layers))
        feats, hidden = _forward_layers(bundle, cache, ids, pos, mask, run, hidden_at)
        n_layers = len(run)
    if feats is not None:  # [1, n, d] after the final norm: the LM head reads the kept rows
        logits = model.lm_head(feats[:, -logits_to_keep:] if logits_to_keep else feats)[0]
    wall_ms = elapsed_ms(bundle, start)
    event = Forward(step=step, kind=kind, n_input_tokens=n, layers=n_layers, wall_ms=wall_ms)
    return ForwardResult(logits.float(), hidden, event, feats[0] if features else None)


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
    states asked for."""
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
                h = h + a
            if i not in skip.mlp:
                h = h + layer.mlp(layer.post_attention_layernorm(h))
    return inner.norm(h)


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
    logits = bundle.model.lm_head(inner.norm(h))[0]
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
    same tokens, the two sides of an exit may not), or under the given additive `mask`."""
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


_input_costs: dict[int, float] = {}
_forward_ms: dict[int, float] = {}
_cost_lock = threading.Lock()


def input_cost(
    bundle: ModelBundle, *, context: int = 64, extra: int = 16, repeats: int = 7
) -> float:
    """What one more input costs a forward on this machine, as a fraction of a one-token forward.

    Measured once per loaded model, after a `context`-token cache, each shape warmed up first: the
    median over `repeats` rounds of one forward of 1 token and one of 1 + `extra`, taken in turns
    (a burst of noise on a shared machine then falls on both sides of a round, not on all of one
    size: measured a size at a time, one burst once priced inputs at half their cost and grew a
    whole benchmark's trees to 8 layers a token). About 0.035 on a 2-core Intel CPU and 0.045 on a
    2-core AMD one, where compute grows with every input, and near 0 on a GPU, where a forward of
    a few dozen tokens costs what one does. Tree drafts use it to verify only the nodes worth
    their price here (`token_tree`'s size=cost).
    """
    key = id(bundle.model)
    with _cost_lock:
        if key not in _input_costs:
            _input_costs[key], one = _measure_input_cost(bundle, context, extra, repeats)
            _forward_ms.setdefault(key, one)
        return _input_costs[key]


def _measure_input_cost(
    bundle: ModelBundle, context: int = 64, extra: int = 16, repeats: int = 7
) -> tuple[float, float]:
    """(input cost, one-token forward ms), measured now (see input_cost)."""
    ones, manys = _timed_forwards(bundle, context, (1, 1 + extra), repeats)
    rounds = [(m - o) / extra / max(o, 1e-6) for o, m in zip(ones, manys, strict=True)]
    return max(0.0, statistics.median(rounds)), statistics.median(ones)


def forward_ms(bundle: ModelBundle) -> float:
    """Wall milliseconds of a one-token forward of this model on this machine (after a 64-token
    cache), measured once per loaded model: what a draft forward's time is weighed against."""
    key = id(bundle.model)
    with _cost_lock:
        if key not in _forward_ms:
            _forward_ms[key] = statistics.median(_timed_forwards(bundle, 64, (1,), 3)[0])
        return _forward_ms[key]


def measured_costs(bundle: ModelBundle) -> dict[str, float]:
    """What this process has measured of `bundle`'s costs so far (`input_cost`, `forward_ms`),
    measuring nothing: a benchmark records the prices its trees were sized by."""
    key = id(bundle.model)
    with _cost_lock:
        found = {"input_cost": _input_costs.get(key), "forward_ms": _forward_ms.get(key)}
    return {k: round(v, 4) for k, v in found.items() if v is not None}


def calibrate(bundle: ModelBundle, *, again: bool = False) -> dict[str, float]:
    """Measure what draft sizes are priced by (`input_cost`, `forward_ms`): the app calls it when
    a model loads, in the background, so no visitor's run pays for it or waits behind it (a run
    that starts before it finishes waits on the lock, as it would have measured itself).
    `again`: measure even when prices are stored, and replace them when done (runs go on with
    the old ones meanwhile)."""
    if again:
        price, one = _measure_input_cost(bundle)
        with _cost_lock:
            _input_costs[id(bundle.model)] = price
            _forward_ms[id(bundle.model)] = one
    input_cost(bundle)
    forward_ms(bundle)
    return measured_costs(bundle)


def calibrate_in_background(bundle: ModelBundle, *, again: bool = False) -> threading.Thread | None:
    """`calibrate` on a daemon thread, unless this model's prices are stored (and not `again`)
    or being measured already."""
    key = id(bundle.model)
    with _cost_lock:
        if (key in _input_costs and not again) or key in _remeasuring:
            return None
        _remeasuring.add(key)

    def run() -> None:
        try:
            calibrate(bundle, again=again)
        finally:
            with _cost_lock:
                _remeasuring.discard(key)

    thread = threading.Thread(target=run, name="decoding-lab-calibrate", daemon=True)
    thread.start()
    return thread


# A run's own verify forwards second-guess the price: when the price they imply is off by more
# than this factor (either way) over at least MIN_OBSERVED forwards of 4+ inputs, the model is
# re-measured in the background for later runs. Not below MIN_TIMED_MS a one-token forward: there
# the timer and the scheduler, not the inputs, make the differences (the tiny test models).
REPRICE_FACTOR = 2.0
MIN_OBSERVED = 8
MIN_TIMED_MS = 5.0
_remeasuring: set[int] = set()
# "0" keeps every price as first measured: what a process that compares runs with each other
# needs (the test suite: a run alone and the same run among others must size the same trees).
REPRICE_ENV = "DECODING_LAB_REPRICE"


def implied_input_cost(bundle: ModelBundle, forwards: Sequence[tuple[int, float]]) -> float | None:
    """The per-input price a run's own verify forwards (inputs, wall ms) imply against the
    measured one-token forward: the median of (ms / one - 1) / (n - 1) over forwards of 4+
    inputs; None when there are too few of them or no measured one-token forward."""
    one = _forward_ms.get(id(bundle.model))
    seen = [(ms / one - 1.0) / (n - 1) for n, ms in forwards if n >= 4] if one else []
    return statistics.median(seen) if len(seen) >= MIN_OBSERVED else None


def second_guess_price(bundle: ModelBundle, forwards: Sequence[tuple[int, float]]) -> bool:
    """After a sized run: when its verify forwards imply a per-input price off by more than
    REPRICE_FACTOR from the stored one, re-measure them in the background (later runs use the new
    ones; this one kept its own). True when it started that."""
    if os.environ.get(REPRICE_ENV, "1") == "0":
        return False
    key = id(bundle.model)
    price, one = _input_costs.get(key), _forward_ms.get(key)
    if price is None or one is None or one < MIN_TIMED_MS:
        return False
    implied = implied_input_cost(bundle, forwards)
    if implied is None:
        return False
    floor = 0.005  # near 0 (a GPU) a ratio says nothing
    if max(implied, floor) <= REPRICE_FACTOR * max(price, floor) and max(
        price, floor
    ) <= REPRICE_FACTOR * max(implied, floor):
        return False
    return calibrate_in_background(bundle, again=True) is not None


def _timed_forwards(
    bundle: ModelBundle, context: int, sizes: Sequence[int], repeats: int
) -> list[list[float]]:
    """Wall ms of `repeats` forwards of each size after a `context`-token cache, per size; the
    sizes take turns, round by round."""
    vocab = bundle.model.config.vocab_size
    ids = torch.arange(context + max(sizes)) % vocab
    cache = new_cache(bundle)
    forward(bundle, cache, ids[:context], step=0, kind="prefill")

    def timed(n: int) -> float:
        out = forward(bundle, cache, ids[context : context + n], step=0, kind="verify")
        crop_cache(cache, context)
        return out.event.wall_ms

    for n in sizes:  # warm-up: the first forwards of a shape pay for its kernels (oneDNN's
        timed(n), timed(n)  # primitives); a cold 17-token forward once priced inputs 1.6x too dear
    rounds = [[timed(n) for n in sizes] for _ in range(repeats)]
    return [list(times) for times in zip(*rounds, strict=True)]


def pays(score: float, total: float, n: int, cost: float, spent: float = 0.0) -> bool:
    """Is one more draft node with path probability `score` worth its input? A draft of n nodes
    whose path probabilities sum to `total` yields about 1 + total tokens per step costing
    1 + spent + cost·n one-token forwards (`spent`: the drafting done for it); the node raises
    that rate exactly when its score beats cost × (1 + total) / (1 + spent + cost·n)."""
    return score > cost * (1.0 + total) / (1.0 + spent + cost * n)


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
