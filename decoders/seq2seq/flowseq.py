"""FlowSeq (Ma et al. 2019), compact: a non-autoregressive decoder that reads a latent sequence.

Each target position t has a latent z_t (`LATENT` numbers). Training sees the target: a
*posterior* q(z | x, y) (a decoder layer over the target's embeddings, attending to the source)
gives each z_t a Gaussian, a sample of it is decoded by a NAT decoder p(y | z, x), and the loss is
the reconstruction plus the KL between the posterior and the *prior* p(z | x), its weight rising
from 0 to 1 over the first batches (KL warm-up). Past the warm-up the KL alone pulled the
posterior onto the prior (its means shrank to 0.23 against a unit spread: z said little, and
noisy parallel decoding found a right translation for a third of the sentences). So free bits
(Kingma et al. 2016): the batch's KL below FREE_NATS nats per position is not penalised; and,
since a clamped KL gives the prior no gradient, the prior also fits the posterior's latents by a
term of its own, always on (docs/TRANSLATION.md has each step's numbers).

The prior is a *flow*: v ~ N(0, I) at every position, pushed through invertible steps — actnorm
(a per-feature scale and shift), an invertible linear map of the features, and an affine coupling
(half the features scale and shift the other half, through a decoder layer that attends to the
other positions and to the source) — so z = f(v; x) can hold what a Gaussian cannot: which
register and which order the sentence is in, the same at every position. Its density is
log p(z | x) = log N(f⁻¹(z)) + log |det ∂f⁻¹/∂z|.

A sentence's choice lives in z, so the decoder need not mix: decode one z and every position
reads the same choice. Decoding (`decode`):
- `argmax`: z = f(0), the image of the base Gaussian's mode (FlowSeq's stand-in for the prior's argmax);
- `npd`: n latents sampled from the prior, each decoded, the candidate the autoregressive teacher
  scores best kept (noisy parallel decoding);
- `iw`: the same candidates, each scored by FlowSeq itself with an importance-weighted estimate
  of log p(y | x) = log E_q[p(y | z, x) p(z | x) / q(z | y, x)] over k posterior samples.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .models import AR, DEFAULT, Config, LengthHead, Seq2Seq, pad
from .tasks import PAD

LATENT = 16
FREE_NATS = 0.5  # per target position: see `FlowSeq.loss`


def _layer(d: int, heads: int) -> nn.TransformerDecoderLayer:
    return nn.TransformerDecoderLayer(d, heads, 2 * d, 0.0, batch_first=True, norm_first=True)


class ActNorm(nn.Module):
    """z = v · exp(s) + b, per feature."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, v, mask, cond):
        z = v * self.log_scale.exp() + self.shift
        return z * mask[..., None], self.log_scale.sum() * mask.sum(1)

    def inverse(self, z, mask, cond):
        v = (z - self.shift) * (-self.log_scale).exp()
        return v * mask[..., None], -self.log_scale.sum() * mask.sum(1)


class InvertibleLinear(nn.Module):
    """z = W v over the features (Glow's invertible 1×1 convolution), W initially a rotation."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linalg.qr(torch.randn(dim, dim))[0])

    def forward(self, v, mask, cond):
        return v @ self.weight.T, torch.linalg.slogdet(self.weight)[1] * mask.sum(1)

    def inverse(self, z, mask, cond):
        v = z @ torch.linalg.inv(self.weight).T
        return v, -torch.linalg.slogdet(self.weight)[1] * mask.sum(1)


class Coupling(nn.Module):
    """Half the features pass through and set a scale and shift for the other half, through a
    decoder layer over the positions that attends to the source (`cond`: memory and its mask)."""

    def __init__(self, dim: int, d: int, heads: int, flip: bool) -> None:
        super().__init__()
        self.flip, self.half = flip, dim // 2
        self.inp = nn.Linear(self.half, d)
        self.layer = _layer(d, heads)
        self.out = nn.Linear(d, 2 * (dim - self.half))
        nn.init.zeros_(self.out.weight)  # the identity at first
        nn.init.zeros_(self.out.bias)

    def _split(self, x):
        a, b = x[..., : self.half], x[..., self.half :]
        return (b, a) if self.flip else (a, b)

    def _join(self, a, b):
        return torch.cat([b, a] if self.flip else [a, b], -1)

    def _scale_shift(self, a, mask, cond):
        memory, mmask, positions = cond
        h = self.layer(
            self.inp(a) + positions[:, : a.shape[1]],
            memory,
            tgt_key_padding_mask=~mask,
            memory_key_padding_mask=mmask,
        )
        log_s, t = self.out(h).chunk(2, -1)
        keep = mask[..., None]
        return torch.tanh(log_s) * keep, t * keep

    def forward(self, v, mask, cond):
        a, b = self._split(v)
        log_s, t = self._scale_shift(a, mask, cond)
        return self._join(a, b * log_s.exp() + t), log_s.sum((1, 2))

    def inverse(self, z, mask, cond):
        a, b = self._split(z)
        log_s, t = self._scale_shift(a, mask, cond)
        return self._join(a, (b - t) * (-log_s).exp()), -log_s.sum((1, 2))


class Flow(nn.Module):
    """Steps of (actnorm, invertible linear, coupling), the couplings' halves alternating."""

    def __init__(self, dim: int, d: int, heads: int, steps: int = 2) -> None:
        super().__init__()
        self.steps = nn.ModuleList()
        for i in range(steps):
            self.steps.extend(
                [ActNorm(dim), InvertibleLinear(dim), Coupling(dim, d, heads, bool(i % 2))]
            )

    def forward(self, v, mask, cond):
        """z = f(v), and log |det ∂f/∂v| per sentence."""
        logdet = torch.zeros(v.shape[0])
        for step in self.steps:
            v, ld = step(v, mask, cond)
            logdet = logdet + ld
        return v, logdet

    def inverse(self, z, mask, cond):
        """v = f⁻¹(z), and log |det ∂f⁻¹/∂z| per sentence."""
        logdet = torch.zeros(z.shape[0])
        for step in reversed(self.steps):
            z, ld = step.inverse(z, mask, cond)
            logdet = logdet + ld
        return z, logdet


def _gaussian(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log N(x; 0, I) per sentence over its real positions."""
    per = -0.5 * (x**2 + math.log(2 * math.pi))
    return (per * mask[..., None]).sum((1, 2))


class FlowSeq(Seq2Seq):
    name = "flowseq"

    def __init__(
        self, cfg: Config = DEFAULT, warmup: int = 500, free_nats: float = FREE_NATS
    ) -> None:
        super().__init__(cfg)
        self.length = LengthHead(cfg.d)
        self.posterior_layer = _layer(cfg.d, cfg.heads)
        self.posterior_out = nn.Linear(cfg.d, 2 * LATENT)
        nn.init.constant_(self.posterior_out.bias[LATENT:], -2.0)  # narrow at first: z says y
        self.flow = Flow(LATENT, cfg.d, cfg.heads)
        self.latent_in = nn.Linear(LATENT, cfg.d)
        self.warmup = warmup
        self.free_nats = free_nats
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    # --- the three distributions --------------------------------------------------------------

    def cond(self, memory: torch.Tensor, mmask: torch.Tensor, n: int):
        return memory, mmask, self.positions(n)

    def posterior(self, memory, mmask, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(z | x, y): each position's mean and log standard deviation."""
        x = self.embed(tgt) * math.sqrt(self.cfg.d) + self.positions(tgt.shape[1])
        h = self.posterior_layer(
            x, memory, tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=mmask
        )
        mean, log_std = self.posterior_out(h).chunk(2, -1)
        # at most the prior's unit scale: a posterior wider than that drowns what z says
        return mean, log_std.clamp(-6, 0)

    def prior_logp(self, z, mask, memory, mmask) -> torch.Tensor:
        """log p(z | x) through the flow's inverse."""
        v, logdet = self.flow.inverse(z, mask, self.cond(memory, mmask, z.shape[1]))
        return _gaussian(v, mask) + logdet

    def logits(self, z, mask, memory, mmask) -> torch.Tensor:
        """p(y | z, x): the NAT decoder reading the latents."""
        return self.decode(self.latent_in(z), memory, mmask, ~mask)

    # --- training -----------------------------------------------------------------------------

    def kl_weight(self) -> float:
        return min(1.0, float(self.batches) / max(self.warmup, 1))

    def loss(self, src: torch.Tensor, tgt: list[tuple[int, ...]]) -> torch.Tensor:
        memory, mmask = self.encode(src)
        out = pad(list(tgt))
        mask = out != PAD
        mean, log_std = self.posterior(memory, mmask, out)
        z = (mean + log_std.exp() * torch.randn_like(mean)) * mask[..., None]
        log_q = (
            (-0.5 * ((z - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi))
            * mask[..., None]
        ).sum((1, 2))
        kl = log_q - self.prior_logp(z, mask, memory, mmask)
        # the prior also learns the posterior's latents by a term of its own, always on: free
        # bits below leave the KL without a gradient whenever it is under the threshold
        fit_prior = -self.prior_logp(z.detach(), mask, memory, mmask).sum()
        logits = self.logits(z, mask, memory, mmask)
        rec = nn.functional.cross_entropy(
            logits.transpose(1, 2), out, ignore_index=PAD, reduction="sum"
        )
        lengths = mask.sum(1)
        length = nn.functional.cross_entropy(self.length(memory, mmask), lengths)
        if self.training:
            self.batches += 1
        # free bits (over the batch, as Kingma et al.): a KL below `free_nats` per position costs
        # nothing, so the posterior keeps saying which choice y made instead of collapsing
        kl = torch.clamp(kl.sum(), min=self.free_nats * lengths.sum())
        return (rec + self.kl_weight() * kl + fit_prior) / lengths.sum() + 0.1 * length

    # --- decoding -----------------------------------------------------------------------------

    @torch.no_grad()
    def sample(self, src: torch.Tensor, n: int, temperature: float = 1.0, seed: int = 0):
        """Per source row, `n` latents from the prior (the first at v = 0, the image of its
        mean), each decoded in one batch: the candidates, their latents' log p(z | x)."""
        memory, mmask = self.encode(src)
        logits = self.length(memory, mmask)
        logits[:, 0] = -math.inf
        lengths = logits.argmax(-1)
        gen = torch.Generator().manual_seed(seed)
        out = []
        for i in range(src.shape[0]):
            L = int(lengths[i])
            mem, mm = memory[i : i + 1].expand(n, -1, -1), mmask[i : i + 1].expand(n, -1)
            mask = torch.ones(n, L, dtype=torch.bool)
            v = torch.randn(n, L, LATENT, generator=gen) * temperature
            v[0] = 0
            z, logdet = self.flow(v, mask, self.cond(mem, mm, L))
            prior = _gaussian(v, mask) - logdet  # log p(z) = log N(v) − log|det ∂f/∂v|
            tokens = self.logits(z, mask, mem, mm).argmax(-1).tolist()
            out.append(([tuple(t) for t in tokens], prior.tolist()))
        return out

    @torch.no_grad()
    def iw_score(
        self, src_row: torch.Tensor, candidates: list[tuple[int, ...]], k: int = 8, seed: int = 0
    ) -> list[float]:
        """log p(y | x) of each candidate, importance-weighted over `k` posterior samples."""
        gen = torch.Generator().manual_seed(seed)
        n = len(candidates)
        out = pad(candidates).repeat_interleave(k, 0)
        mask = out != PAD
        src = src_row[None].expand(n * k, -1)
        memory, mmask = self.encode(src)
        mean, log_std = self.posterior(memory, mmask, out)
        eps = torch.randn(mean.shape, generator=gen)
        z = (mean + log_std.exp() * eps) * mask[..., None]
        log_q = ((-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)) * mask[..., None]).sum(
            (1, 2)
        )
        log_prior = self.prior_logp(z, mask, memory, mmask)
        logp = torch.log_softmax(self.logits(z, mask, memory, mmask), -1)
        log_y = (logp.gather(-1, out[..., None])[..., 0] * mask).sum(1)
        w = (log_y + log_prior - log_q).view(n, k)
        return (torch.logsumexp(w, 1) - math.log(k)).tolist()

    @torch.no_grad()
    def decode_all(
        self,
        src: torch.Tensor,
        how: str = "argmax",
        n: int = 8,
        teacher: AR | None = None,
        temperature: float = 1.0,
    ) -> tuple[list[tuple[int, ...]], int, list[dict]]:
        """Translations by `how` (argmax, npd or iw), the decoder passes per sentence, and per
        sentence its candidates (tokens, prior log p(z | x), the scores that ranked them)."""
        if how not in ("argmax", "npd", "iw"):
            raise ValueError(f"unknown FlowSeq decoding {how!r}: argmax, npd or iw")
        if how == "npd" and teacher is None:
            raise ValueError("noisy parallel decoding needs the autoregressive teacher")
        drawn = self.sample(src, 1 if how == "argmax" else n, temperature)
        outs, details = [], []
        for row, (cands, prior) in zip(src, drawn, strict=True):
            if how == "argmax":
                scores = prior
            elif how == "npd":
                scores = teacher.score(row[None].expand(len(cands), -1), cands).tolist()
            else:
                scores = self.iw_score(row, cands)
            best = max(range(len(cands)), key=lambda i: scores[i])
            outs.append(cands[best])
            details.append({"candidates": cands, "prior": prior, "scores": scores, "chosen": best})
        # argmax: one decoder pass; npd and iw: the candidates' pass (one batch) and the scoring's
        return outs, 1 if how == "argmax" else 2, details
