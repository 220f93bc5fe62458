"""EAGLE (Li et al. 2024): a draft head that extrapolates the target's features, not its tokens.

    entry i  = fc([embed(t_{i+1}) ; f_i])        f_i: the target's final hidden state at position i
    f̂_{i+1} = decoder_layer(entries ≤ i)        one trained layer, its own small KV cache
    q(t_{i+2}) = softmax(lm_head(f̂_{i+1}))       the target's own LM head (rows of the draft vocab)

Drafting several tokens ahead feeds the head its own predicted features: the second draft token's
entry is fc([embed(d_1) ; f̂_{L-1}]). After verification the target's real features for the kept
tokens replace the predictions, so errors never accumulate across steps.

EAGLE-3 (Li et al. 2025) changes the input and the training: the target's states after a low and a
middle layer are fused with its final features (`fuse`, e.g. layers 2 and 15 of 30), one linear map
`fuse_fc` taking the three to one d-wide input; the head predicts tokens directly (no feature
loss), and a training-time test unrolls it over its own outputs, so from the second draft step on
it is fed its own last hidden state in place of the fused features. A head with `fuse` empty is
EAGLE-1's. Both load from the same kind of file; the drafter asks the target for the layers the
head fuses.

The head scores a draft vocabulary (the tokens the target predicts most often on the training
data, FR-Spec-style) rather than all 49152, which keeps a draft step at a few milliseconds; a token
outside it simply is never drafted. The weights are trained by `python -m decoders.train eagle` and
ship in `assets/eagle/<model>.safetensors` (saved and loaded like every trained part: artifacts.py).

`Eagle3Head` is EAGLE-3 as its authors publish it (SafeAILab/EAGLE's `LlamaForCausalLMEagle3`, the
layout SpecForge writes and vLLM reads): three target layers fused, then a layer that normalises
the token embedding and the hidden input separately and attends over the two side by side, and
its own final norm and LM head over a draft vocabulary. `EagleDrafter` drives either head; the
published files are read by published.py, and `decoders.train eagle --official` trains this one.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from decoders.core.drafter import Drafter
from decoders.core.events import Forward
from decoders.core.models import ModelBundle
from decoders.core.runtime import ForwardResult, cache_arg, crop_cache, elapsed_ms
from decoders.trained.artifacts import artifact_path, load_artifact, save_artifact

KIND = "eagle"  # assets/eagle/<model>.safetensors


class EagleHead(nn.Module):
    """fc over [token embedding ; feature], then one Llama decoder layer shaped like the target's.
    With `fuse` (EAGLE-3), the feature of a real position is `fuse_fc` over the target's states
    after those layers and its final features, side by side."""

    # A warm start from an EAGLE-1 head lacks these: they keep their own initialization, which
    # passes the final features through unchanged (the fused head starts as the head it grew from).
    GROWN = ("fuse_fc.weight", "fuse")

    def __init__(
        self, config, vocab: torch.Tensor, fuse: Sequence[int] | torch.Tensor = ()
    ) -> None:
        super().__init__()
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config)
        self.register_buffer("vocab", vocab.long())  # draft vocabulary: target token ids
        fuse = [int(ell) for ell in (fuse.tolist() if torch.is_tensor(fuse) else fuse)]
        if fuse:
            bad = [ell for ell in fuse if not 1 <= ell < config.num_hidden_layers]
            if bad or fuse != sorted(set(fuse)):
                raise ValueError(
                    f"fuse: increasing layers in 1..{config.num_hidden_layers - 1}, got {fuse}"
                )
            self.register_buffer("fuse", torch.tensor(fuse, dtype=torch.long))
            self.fuse_fc = nn.Linear((len(fuse) + 1) * d, d, bias=False)
            with torch.no_grad():
                self.fuse_fc.weight.zero_()
                self.fuse_fc.weight[:, -d:] = torch.eye(d)

    @property
    def fused_layers(self) -> tuple[int, ...]:
        """The target layers (after ℓ layers) whose states the head reads beside the final ones."""
        return tuple(self.fuse.tolist()) if hasattr(self, "fuse") else ()

    def fused(self, states: torch.Tensor) -> torch.Tensor:
        """[..., (k + 1) d] -> [..., d]: the states after the fused layers and the final features,
        side by side in that order, as one input feature (EAGLE-1: the final features as given)."""
        return self.fuse_fc(states) if hasattr(self, "fuse_fc") else states

    @property
    def token_ids(self) -> torch.Tensor:
        """The target token each column of `scores` stands for (the draft vocabulary)."""
        return self.vocab

    def scores(self, predicted: torch.Tensor) -> torch.Tensor:
        """[..., d] predicted features -> [..., |draft vocab|] logits: the target's LM head rows."""
        return self.lm_head(predicted)

    def forward(
        self,
        embeds: torch.Tensor,  # [b, n, d] embeddings of t_{i+1}
        features: torch.Tensor,  # [b, n, d] f_i, real or predicted
        positions: torch.Tensor,  # [b, n]
        mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Predicted features f̂_{i+1}, [b, n, d]. Without a mask: causal (training, no cache)."""
        h = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layer(
            h,
            attention_mask=mask,
            position_ids=positions,
            **cache_arg(cache),
            use_cache=cache is not None,
            position_embeddings=self.rotary(h, position_ids=positions),
        )


class Eagle3Layer(nn.Module):
    """The official EAGLE-3 decoder layer (`midlayer`): the token embedding e and the hidden input
    g are normalised apart and attended over side by side (q, k and v read 2d inputs).

        u = [RMSNorm_in(e) ; RMSNorm_h(g)]
        a = r + o_proj(attention(u))          r = g (norm_before_residual: RMSNorm_h(g))
        out = a + mlp(RMSNorm_post(a))
    """

    def __init__(self, config) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(d, eps=eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        attn, bias = self.self_attn, config.attention_bias
        for name in ("q_proj", "k_proj", "v_proj"):  # the two inputs side by side
            setattr(attn, name, nn.Linear(2 * d, getattr(attn, name).out_features, bias=bias))
        self.mlp = LlamaMLP(config)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, embeds, hidden, mask, cache, rope) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        u = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        a, _ = self.self_attn(
            hidden_states=u, position_embeddings=rope, attention_mask=mask, **cache_arg(cache)
        )
        h = residual + a
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """EAGLE-3's head in the official layout (its state dict is the published files' keys):

        g_i = fc([h^{l1}_i ; h^{l2}_i ; h^{l3}_i])     real positions: the target's states after
                                                        layers l1 < l2 < l3, side by side
        ĝ_{i+1} = midlayer(embed(t_{i+1}), g_i)         (Eagle3Layer; its own small KV cache)
        q(t_{i+2}) = softmax(lm_head(norm(ĝ_{i+1})))    its own LM head: column r = token_ids[r]

    From the second draft step on the head is fed its own ĝ (before `norm`) in place of g, as in
    the official drafting loop. `fuse` names the layers (the published `eagle_aux_hidden_state_
    layer_ids`; by default 2, L // 2 and L - 3); `target_width` is the target's hidden size when
    the head is narrower or wider (then it brings its own `embed_tokens`)."""

    # lm_head's rows follow token_ids: a warm start (`--init`) must keep the same vocabulary
    FROM_CORPUS: tuple[str, ...] = ()

    def __init__(
        self,
        config,
        token_ids: torch.Tensor,
        fuse: Sequence[int] | torch.Tensor,
        target_width: int | None = None,
        own_embedding: bool = False,
    ) -> None:
        super().__init__()
        fuse = [int(ell) for ell in (fuse.tolist() if torch.is_tensor(fuse) else fuse)]
        if not fuse or fuse != sorted(set(fuse)) or fuse[0] < 0:
            raise ValueError(f"fuse: increasing target layers, got {fuse}")
        d = config.hidden_size
        self.config = config  # the head's own (a Llama config of one layer): export writes it
        self.target_width = target_width or d
        self.fc = nn.Linear(len(fuse) * self.target_width, d, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(d, len(token_ids), bias=False)
        self.rotary = LlamaRotaryEmbedding(config)
        if own_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.register_buffer("token_ids", token_ids.long())
        self.register_buffer("fuse", torch.tensor(fuse, dtype=torch.long))

    @property
    def fused_layers(self) -> tuple[int, ...]:
        return tuple(self.fuse.tolist())

    def fused(self, states: torch.Tensor) -> torch.Tensor:
        """[..., (k + 1) d_target] (the fused layers' states, then the final features, as the
        decoding loop and the trainer hand them) -> [..., d]: fc over the k layers' states."""
        return self.fc(states[..., : self.fc.in_features])

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] ĝ -> [..., |draft vocab|] logits."""
        return self.lm_head(self.norm(hidden))

    def forward(
        self,
        embeds: torch.Tensor,  # [b, n, d] embeddings of t_{i+1}
        features: torch.Tensor,  # [b, n, d] g_i (fused) or the head's own ĝ
        positions: torch.Tensor,  # [b, n]
        mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """ĝ_{i+1}, [b, n, d], before the final norm. Without a mask: causal (training)."""
        rope = self.rotary(features, position_ids=positions)
        return self.midlayer(embeds, features, mask, cache, rope)


def head_config(target_config):
    """The config of an official-architecture head trained on a target: the target's own widths,
    norms and rope, one layer (the head's attention reads it: heads, head_dim, attention impl)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    return config


def new_eagle3_head(bundle: ModelBundle, vocab: torch.Tensor, fuse: Sequence[int]) -> Eagle3Head:
    """An official-architecture head to train on `bundle`'s target: the draft vocabulary in
    ascending token order (so the exported d2t and t2d agree), its LM head and final norm
    starting as the target's own rows and norm, the rest at PyTorch's default initialisation."""
    vocab = vocab.sort().values
    head = Eagle3Head(head_config(bundle.model.config), vocab, fuse)
    with torch.no_grad():
        head.lm_head.weight.copy_(bundle.model.lm_head.weight[vocab.to(bundle.device)].cpu())
        head.norm.weight.copy_(bundle.model.model.norm.weight.cpu())
    return head


def head_path(model_id: str) -> Path:
    return artifact_path(KIND, model_id)


def save_head(head: EagleHead, path: Path, card: dict) -> None:
    """float16 weights + the JSON card (artifacts.save_artifact)."""
    save_artifact(head, path, card)


def load_head(bundle: ModelBundle, path: Path | None = None) -> EagleHead | Eagle3Head:
    """The trained head for `bundle`'s model, in its device and dtype (cached per process), with
    `lm_head` = the target's LM head cut to its draft vocabulary (an official-architecture head,
    `--official`, keeps its own). Heads saved before the artifacts module existed load too: same
    keys (their metadata says "record" where new files say "card")."""

    def build(state: dict[str, torch.Tensor]) -> EagleHead | Eagle3Head:
        if "midlayer.hidden_norm.weight" in state:  # trained with --official
            own = "embed_tokens.weight" in state
            return Eagle3Head(
                head_config(bundle.model.config), state["token_ids"], state["fuse"], None, own
            )
        return EagleHead(bundle.model.config, state["vocab"], state.get("fuse", ()))

    return load_artifact(
        bundle,
        path or head_path(bundle.model_id),
        build,
        "EAGLE head",
        f"python -m decoders.train eagle --model {bundle.model_id}",
        drafts=True,
    )


class EagleDrafter(Drafter):
    """Drafts with an EAGLE head. Needs the target's final features (and, for an EAGLE-3 head, its
    states after the fused layers): the decoding loop hands it those of every input the target
    keeps (`observe`), prefill included."""

    needs_features = True

    def __init__(self, target: ModelBundle, head: EagleHead | Eagle3Head) -> None:
        fused = head.fused_layers
        layers = ", ".join(map(str, fused))
        if isinstance(head, Eagle3Head):
            # A published head (`source`: where published.py read it) is priced as "eagle3",
            # whichever it is (the price table's key is the label up to its parenthesis).
            source = getattr(head, "source", "")
            name, where = ("eagle3", f"{source}: ") if source else ("eagle-3", "")
            label = (
                f"{name} ({where}the official EAGLE-3 architecture, 1 trained layer on the "
                f"target's layers {layers})"
            )
        elif fused:
            label = f"eagle-3 (1 trained layer on the target's layers {layers} and its features)"
        else:
            label = "eagle (1 trained layer on the target's features)"
        super().__init__(target, DynamicCache(), 1, label)
        self.feature_layers = fused
        self.head = head
        self.dtype = head.fc.weight.dtype  # bundle.draft_dtype: maybe bfloat16 beside float32
        own = getattr(head, "embed_tokens", None)  # a published head may bring its own
        self.embed = own if own is not None else target.model.model.embed_tokens
        self.features = torch.empty(0, head.fc.out_features, device=target.device)
        self.filled = 0  # entries in the head's cache built from real target features
        self.step_features: list[torch.Tensor] = []  # predicted features of this step's inputs
        self.context: Sequence[int] = ()

    @torch.inference_mode()
    def observe(self, features: torch.Tensor) -> None:
        """Append the target's features for the inputs it just kept (positions in order): the
        final ones, or for an EAGLE-3 head the fused layers' states beside them, fused here."""
        if self.feature_layers:
            features = self.head.fused(features.to(self.dtype))
        self.features = torch.cat([self.features, features.to(self.features.dtype)])

    def begin(self, context: Sequence[int], step: int) -> list[ForwardResult]:
        # Entry i pairs f_i with t_{i+1}; x = context[-1] is entry L-2, so entries < L-2 are history.
        self.context = context
        self.prefix = len(context) - 2
        self.step_features = []
        assert len(self.features) == len(context) - 1, (
            "the target's features must cover context[:-1]"
        )
        return []  # the catch-up rides along with the first draft forward

    @torch.inference_mode()
    def forward(
        self,
        tokens: Sequence[int],
        step: int,
        positions: Sequence[int] | None = None,
        mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        parents: Sequence[int] | None = None,
    ) -> ForwardResult:
        start = time.perf_counter()
        tokens = list(tokens)
        if not self.step_features:  # the first input this step is x: prepend the history entries
            assert tokens == [self.context[-1]] and mask is None
            tokens = list(self.context[self.filled + 1 :])
            feats = self.features[self.filled :]
            n_new = 1
        else:
            if parents is None:  # a chain: each input continues the previous one
                last = len(self.step_features) - 1
                parents = range(last, last + len(tokens))
            feats = torch.stack([self.step_features[p] for p in parents])
            n_new = len(tokens)
        n = len(tokens)
        past = self.cache.get_seq_length()
        pos = torch.arange(past, past + n) if positions is None else torch.as_tensor(positions)
        if mask is None and n > 1:
            mask = torch.full((n, past + n), torch.finfo(self.dtype).min)
            mask = mask.triu(past + 1).view(1, 1, n, past + n)
        device = self.bundle.device
        ids = torch.as_tensor(tokens, device=device).view(1, -1)
        pred = self.head(
            self.embed(ids).to(self.dtype),
            feats.view(1, n, -1).to(self.dtype),
            pos.to(device).view(1, -1),
            None if mask is None else mask.to(device=device, dtype=self.dtype),
            self.cache,
        )[0]
        if n_new == 1 and len(self.step_features) == 0:
            self.filled = self.prefix  # every history entry is now in the cache
        self.step_features.extend(pred[n - n_new :])
        kept = pred[-logits_to_keep:] if logits_to_keep else pred[n - n_new :]
        logits = torch.full(
            (len(kept), self.bundle.model.config.vocab_size),
            float("-inf"),
            device=device,
        )
        logits[:, self.head.token_ids] = self.head.scores(kept).float()
        wall_ms = elapsed_ms(self.bundle, start)
        event = Forward(step=step, kind="draft", n_input_tokens=n, layers=1, wall_ms=wall_ms)
        return ForwardResult(logits, {}, event)

    def end(self) -> None:
        crop_cache(self.cache, self.filled)
        self.step_features = []
