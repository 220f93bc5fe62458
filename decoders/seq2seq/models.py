"""Small encoder-decoder translation models, each as its paper decodes:

- `AR`: the autoregressive Transformer (Vaswani et al. 2017): one decoder pass per target token,
  greedy or beam search. It is also the teacher that sequence-level distillation copies.
- `NAT`: the non-autoregressive Transformer (Gu et al. 2018): the target length is predicted from
  the encoder, the decoder's inputs are the source embeddings copied uniformly onto that many
  positions, and every target token comes from one decoder pass, each position on its own. Noisy
  parallel decoding tries several lengths and keeps the candidate the autoregressive model scores
  best.
- `CMLM` with Mask-Predict (Ghazvininejad et al. 2019): a decoder that fills masked target
  positions; decoding starts fully masked and, for T iterations, re-masks the
  ⌊L·(T−t)/T⌋ tokens it is least sure of and predicts them again.

One codebase: the same embeddings, encoder and decoder layers (`Seq2Seq`); the models differ in
their decoder's inputs and attention mask, and in how they decode.
"""

from __future__ import annotations

import torch
from torch import nn

# The shared parts and the non-autoregressive models are modules of their own; every name stays
# importable from here.
from .backbone import (  # noqa: F401
    DEFAULT,
    MAX_LEN,
    Config,
    LengthHead,
    Seq2Seq,
    count_parameters,
    pad,
    sources,
)
from .parallel import (  # noqa: F401
    CMLM,
    MAX_FERTILITY,
    NAT,
    _word_of,
    fertilities,
    fertility_copy,
    remask_count,
    uniform_copy,
)
from .tasks import (  # noqa: F401
    BOS,
    EOS,
    MASK,
    MAX_TARGET,
    MAX_WORDS,
    N_WORDS,
    PAD,
    REG,
    SRC,
    VOCAB,
    is_word,
)

# --- the autoregressive Transformer -------------------------------------------------------------


class AR(Seq2Seq):
    name = "ar"

    def loss(self, src: torch.Tensor, tgt: list[tuple[int, ...]]) -> torch.Tensor:
        memory, mmask = self.encode(src)
        full = pad([(BOS, *t, EOS) for t in tgt])
        inp, out = full[:, :-1], full[:, 1:]
        logits = self.decode(self.embed(inp), memory, mmask, inp == PAD, causal=True)
        return nn.functional.cross_entropy(logits.transpose(1, 2), out, ignore_index=PAD)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor) -> tuple[list[tuple[int, ...]], int]:
        """Each source's translation, one token per decoder pass; and the passes run."""
        memory, mmask = self.encode(src)
        rows = torch.full((src.shape[0], 1), BOS, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        passes = 0
        for _ in range(MAX_TARGET + 1):
            logits = self.decode(self.embed(rows), memory, mmask, causal=True)[:, -1]
            passes += 1
            nxt = logits.argmax(-1).masked_fill(done, PAD)
            rows = torch.cat([rows, nxt[:, None]], dim=1)
            done |= nxt == EOS
            if done.all():
                break
        return [_until_eos(r[1:].tolist()) for r in rows], passes

    @torch.no_grad()
    def nbest(self, src: torch.Tensor, k: int) -> list[list[tuple[int, ...]]]:
        """Per source, up to `k` distinct translations: the `k` likeliest first tokens, each
        continued greedily (a cheap diverse n-best: here a sentence's choices are made by its
        first token). Translations that never end are left out."""
        memory, mmask = self.encode(src)
        first = self.decode(self.embed(torch.full((src.shape[0], 1), BOS)), memory, mmask)[:, -1]
        tops = torch.topk(first, k, -1).indices  # (n, k)
        rows = torch.stack([torch.full_like(tops, BOS), tops], -1).view(-1, 2)
        memory, mmask = memory.repeat_interleave(k, 0), mmask.repeat_interleave(k, 0)
        done = rows[:, -1] == EOS
        for _ in range(MAX_TARGET):
            if done.all():
                break
            nxt = self.decode(self.embed(rows), memory, mmask, causal=True)[:, -1].argmax(-1)
            nxt = nxt.masked_fill(done, PAD)
            rows = torch.cat([rows, nxt[:, None]], dim=1)
            done |= nxt == EOS
        out: list[list[tuple[int, ...]]] = []
        for i in range(src.shape[0]):
            cands = []
            for r, ended in zip(
                rows[i * k : (i + 1) * k].tolist(), done[i * k : (i + 1) * k], strict=True
            ):
                t = _until_eos(r[1:])
                if ended and t and t not in cands:
                    cands.append(t)
            out.append(cands)
        return out

    @torch.no_grad()
    def score(self, src: torch.Tensor, candidates: list[tuple[int, ...]]) -> torch.Tensor:
        """Log-probability of each candidate (with its EOS) given its source row: the teacher's
        rescoring of noisy parallel decoding's candidates (one pass for all of them)."""
        memory, mmask = self.encode(src)
        full = pad([(BOS, *c, EOS) for c in candidates])
        inp, out = full[:, :-1], full[:, 1:]
        logits = self.decode(self.embed(inp), memory, mmask, inp == PAD, causal=True)
        logp = torch.log_softmax(logits, -1).gather(-1, out[..., None])[..., 0]
        return (logp * (out != PAD)).sum(-1)

    @torch.no_grad()
    def beam(self, src: torch.Tensor, width: int = 4) -> tuple[list[tuple[int, ...]], float]:
        """Beam search, one source at a time (`width` hypotheses, ended ones kept aside); and the
        decoder passes per sentence."""
        outs, passes = [], 0
        for row in src:
            memory, mmask = self.encode(row[None])
            beams: list[tuple[float, list[int]]] = [(0.0, [BOS])]
            ended: list[tuple[float, list[int]]] = []
            steps = 0
            while beams and steps <= MAX_TARGET:
                inp = torch.tensor([b for _, b in beams])
                logits = self.decode(
                    self.embed(inp),
                    memory.expand(len(beams), -1, -1),
                    mmask.expand(len(beams), -1),
                    causal=True,
                )[:, -1]
                steps += 1
                logp = torch.log_softmax(logits, -1)
                grown = [
                    (score + float(logp[i, t]), [*seq, t])
                    for i, (score, seq) in enumerate(beams)
                    for t in torch.topk(logp[i], width).indices.tolist()
                ]
                grown.sort(key=lambda x: x[0], reverse=True)
                beams = []
                for score, seq in grown:
                    (ended if seq[-1] == EOS else beams).append((score, seq))
                    if len(beams) == width:
                        break
                if len(ended) >= width:
                    break
            best = max(ended or beams, key=lambda x: x[0] / len(x[1]))
            outs.append(_until_eos(best[1][1:]))
            passes += steps
        return outs, passes / max(len(src), 1)


def _until_eos(tokens: list[int]) -> tuple[int, ...]:
    out = []
    for t in tokens:
        if t in (EOS, PAD):
            break
        out.append(t)
    return tuple(out)
