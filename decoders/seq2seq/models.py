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

import math
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from .tasks import (
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

MAX_LEN = MAX_TARGET + 2  # positions: a target, and BOS or EOS around it


@dataclass(frozen=True)
class Config:
    d: int = 64
    heads: int = 4
    ff: int = 128
    enc_layers: int = 2
    dec_layers: int = 2
    dropout: float = 0.0


DEFAULT = Config()


def pad(rows: list[tuple[int, ...]] | list[list[int]], length: int | None = None) -> torch.Tensor:
    """A batch of token rows, right-padded with PAD."""
    n = length or max((len(r) for r in rows), default=1)
    out = torch.full((len(rows), max(n, 1)), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:n], dtype=torch.long)
    return out


class Seq2Seq(nn.Module):
    """Embeddings (shared by source and target), positions, an encoder, a decoder, the output
    head; `decode` takes the decoder's input embeddings and an optional causal mask."""

    def __init__(self, cfg: Config = DEFAULT) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB, cfg.d, padding_idx=PAD)
        self.pos = nn.Embedding(MAX_LEN, cfg.d)
        enc = nn.TransformerEncoderLayer(
            cfg.d, cfg.heads, cfg.ff, cfg.dropout, batch_first=True, norm_first=True
        )
        dec = nn.TransformerDecoderLayer(
            cfg.d, cfg.heads, cfg.ff, cfg.dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(enc, cfg.enc_layers, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(dec, cfg.dec_layers)
        self.norm = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, VOCAB)

    def positions(self, n: int) -> torch.Tensor:
        return self.pos(torch.arange(n))[None]

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(memory, padding mask) of a source batch."""
        mask = src == PAD
        x = self.embed(src) * math.sqrt(self.cfg.d) + self.positions(src.shape[1])
        return self.encoder(x, src_key_padding_mask=mask), mask

    def decode(
        self,
        inputs: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        input_mask: torch.Tensor | None = None,
        causal: bool = False,
        attend: str = "all",
    ) -> torch.Tensor:
        """Logits for each decoder position, from the decoder's input embeddings. A position
        attends to every position (`attend="all"`, a NAT), to those at or left of it
        (`causal`, or `attend="left"`) or at or right of it (`attend="right"`)."""
        n = inputs.shape[1]
        x = inputs + self.positions(n)
        attend = "left" if causal else attend
        # a boolean mask (True = may not attend), as the padding masks are
        square = torch.ones(n, n, dtype=torch.bool)
        attn = {"all": None, "left": square.triu(1), "right": square.tril(-1)}[attend]
        h = self.decoder(
            x,
            memory,
            tgt_mask=attn,
            tgt_key_padding_mask=input_mask,
            memory_key_padding_mask=memory_mask,
            tgt_is_causal=attend == "left",
        )
        return self.head(self.norm(h))


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


# --- length prediction, shared by the non-autoregressive models ---------------------------------


class LengthHead(nn.Module):
    """The target length, predicted from the mean of the encoder's states and the source's own
    length (a mean alone hides how many words it averaged)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.source_length = nn.Embedding(MAX_LEN + 1, d)
        self.proj = nn.Linear(d, MAX_TARGET + 1)

    def forward(self, memory: torch.Tensor, mmask: torch.Tensor) -> torch.Tensor:
        keep = (~mmask).float()[..., None]
        n = keep.sum(1).clamp(min=1)
        mean = (memory * keep).sum(1) / n
        return self.proj(mean + self.source_length(n[:, 0].long()))  # lengths 0..MAX_TARGET


def uniform_copy(src: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The source word of each target position: position j of a length-L target copies source
    word ⌊j·S/L⌋ (Gu et al.'s uniform copy; the task's tag is not a word)."""
    rows = []
    for s, n in zip(src.tolist(), lengths, strict=True):
        s = [t for t in s if is_word(t)]
        rows.append([s[min(len(s) - 1, (j * len(s)) // max(n, 1))] for j in range(n)])
    return pad(rows, max(max(lengths, default=1), 1))


# --- the non-autoregressive Transformer ---------------------------------------------------------

MAX_FERTILITY = 3


def fertilities(source: tuple[int, ...], target: tuple[int, ...]) -> list[int]:
    """How many target tokens each source position is translated into (0 for the task's tag):
    a word's target tokens (its synonym, and a phrase's second token) shared out among the
    word's occurrences in the source. The tasks' own alignment, where Gu et al. use an aligner's."""
    words = [t for t in source if is_word(t)]
    made = Counter(_word_of(t) for t in target)
    seen = Counter(words)
    return [made[t] // seen[t] if is_word(t) else 0 for t in source]


def _word_of(token: int) -> int:
    """The source word a target token translates (a synonym's or a phrase's second token's)."""
    return SRC + (token - REG[0]) % N_WORDS


def fertility_copy(src: torch.Tensor, fert: list[list[int]]) -> torch.Tensor:
    """Each source word copied as many times as its fertility, in source order."""
    rows = [
        [t for t, f in zip(s, fs, strict=False) for _ in range(f)]
        for s, fs in zip(src.tolist(), fert, strict=True)
    ]
    return pad(rows, max(1, max(len(r) for r in rows)))


class NAT(Seq2Seq):
    """Length prediction, the source copied onto the target positions, all positions in one pass.

    `inputs="uniform"`: a length is predicted and the source copied uniformly onto it;
    `inputs="fertility"`: a fertility is predicted for each source word and the word copied that
    many times (the length is their sum), as Gu et al.'s NAT does."""

    name = "nat"

    def __init__(self, cfg: Config = DEFAULT, inputs: str = "uniform") -> None:
        super().__init__(cfg)
        if inputs not in ("uniform", "fertility"):
            raise ValueError(f"unknown NAT inputs {inputs!r}: uniform or fertility")
        self.inputs = inputs
        self.length = LengthHead(cfg.d)
        self.fertility = nn.Linear(cfg.d, MAX_FERTILITY + 1)

    def copied(self, src: torch.Tensor, lengths: list[int] | list[list[int]]) -> torch.Tensor:
        """The decoder's input tokens: `lengths` are target lengths (uniform copy) or, per
        sentence, each source position's fertility."""
        if self.inputs == "fertility":
            return fertility_copy(src, lengths)  # type: ignore[arg-type]
        return uniform_copy(src, lengths)  # type: ignore[arg-type]

    def logits(self, src: torch.Tensor, lengths: list[int] | list[list[int]]) -> torch.Tensor:
        memory, mmask = self.encode(src)
        copied = self.copied(src, lengths)
        return self.decode(self.embed(copied), memory, mmask, copied == PAD)

    def loss(self, src: torch.Tensor, tgt: list[tuple[int, ...]]) -> torch.Tensor:
        memory, mmask = self.encode(src)
        lengths = [len(t) for t in tgt]
        fert = [fertilities(tuple(s), t) for s, t in zip(self._rows(src), tgt, strict=True)]
        copied = self.copied(src, fert if self.inputs == "fertility" else lengths)
        logits = self.decode(self.embed(copied), memory, mmask, copied == PAD)
        out = pad(list(tgt), copied.shape[1])
        token = nn.functional.cross_entropy(logits.transpose(1, 2), out, ignore_index=PAD)
        if self.inputs == "fertility":
            gold = pad(fert, src.shape[1]).masked_fill(src == PAD, -100)
            aux = nn.functional.cross_entropy(self.fertility(memory).transpose(1, 2), gold)
        else:
            aux = nn.functional.cross_entropy(self.length(memory, mmask), torch.tensor(lengths))
        return token + 0.1 * aux

    @torch.no_grad()
    def choose(
        self, src: torch.Tensor, candidates: list[tuple[tuple[int, ...], ...]]
    ) -> list[tuple[int, ...]]:
        """Reference selection (Shao et al. 2022): of each source's candidate targets (the
        teacher's several translations), the one whose tokens this model already finds likeliest
        (their log-probabilities summed at the candidate's length; the length's own is left
        out), so that it learns one choice per source — its own, which it can predict. Uniform
        copy only: a teacher's output need not have the fertilities a source's words allow."""
        if self.inputs != "uniform":
            raise ValueError("reference selection scores uniform-copy NATs only")
        was = self.training
        self.eval()
        chosen: list[tuple[int, ...]] = [c[0] for c in candidates]
        best = [-math.inf] * len(candidates)
        # one pass per source and candidate length (uniform copy: the same input for every
        # candidate of a length; fertilities: one per candidate)
        jobs = sorted(
            {
                (i, len(t) if self.inputs == "uniform" else j)
                for i, cands in enumerate(candidates)
                for j, t in enumerate(cands)
            }
        )
        rows = [i for i, _ in jobs]
        sub = src[rows]
        if self.inputs == "uniform":
            logits = self.logits(sub, [n for _, n in jobs])
        else:
            fert = [
                fertilities(tuple(s), candidates[i][j])
                for s, (i, j) in zip(self._rows(sub), jobs, strict=True)
            ]
            logits = self.logits(sub, fert)
        logp = torch.log_softmax(logits, -1)
        for row, (i, key) in enumerate(jobs):
            for j, t in enumerate(candidates[i]):
                if (len(t) if self.inputs == "uniform" else j) != key:
                    continue
                score = float(logp[row, torch.arange(len(t)), torch.tensor(t)].sum())
                if score > best[i]:
                    best[i], chosen[i] = score, t
        self.train(was)
        return chosen

    @staticmethod
    def _rows(src: torch.Tensor) -> list[list[int]]:
        return [[t for t in r if t != PAD] for r in src.tolist()]

    @torch.no_grad()
    def predict_lengths(self, src: torch.Tensor, k: int = 1) -> list[list[int]]:
        """The `k` likeliest target lengths of each source (uniform copy)."""
        memory, mmask = self.encode(src)
        logits = self.length(memory, mmask)
        logits[:, 0] = -math.inf
        return torch.topk(logits, k, -1).indices.tolist()

    @torch.no_grad()
    def predict_fertilities(
        self, src: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> list[list[list[int]]]:
        """Per source, `k` fertility sequences: the likeliest, then samples from the fertility
        distributions (noisy parallel decoding's candidates)."""
        memory, _ = self.encode(src)
        probs = torch.softmax(self.fertility(memory), -1)
        words = torch.tensor([[is_word(t) for t in r] for r in src.tolist()])
        out = []
        for i in range(src.shape[0]):
            best = probs[i].argmax(-1)
            cands = [best] + [
                torch.multinomial(probs[i], 1, generator=generator)[:, 0] for _ in range(k - 1)
            ]
            seqs = []
            for c in cands:
                f = (c * words[i]).tolist()
                if not 0 < sum(f) <= MAX_TARGET:  # none, or more than a target holds
                    f = words[i].long().tolist()
                seqs.append(f)
            out.append(seqs)
        return out

    def _candidates(self, src: torch.Tensor, k: int) -> list[list]:
        if self.inputs == "fertility":
            gen = torch.Generator().manual_seed(0)
            return self.predict_fertilities(src, k, gen)  # type: ignore[return-value]
        return self.predict_lengths(src, k)  # type: ignore[return-value]

    @staticmethod
    def _length(choice: int | list[int]) -> int:
        return sum(choice) if isinstance(choice, list) else choice

    @torch.no_grad()
    def greedy(self, src: torch.Tensor) -> tuple[list[tuple[int, ...]], int]:
        """One pass: the argmax at every position of the predicted length (or fertilities)."""
        choice = [c[0] for c in self._candidates(src, 1)]
        best = self.logits(src, choice).argmax(-1).tolist()
        return [tuple(b[: self._length(c)]) for b, c in zip(best, choice, strict=True)], 1

    @torch.no_grad()
    def npd(self, src: torch.Tensor, teacher: AR, n: int = 4) -> tuple[list[tuple[int, ...]], int]:
        """Noisy parallel decoding: `n` candidates (the likeliest lengths, or the likeliest
        fertilities and samples), each decoded in one pass (one batch), the candidate the
        autoregressive teacher scores highest kept. Two passes: the NAT's and the teacher's."""
        outs = []
        for row, cands in zip(src, self._candidates(src, n), strict=True):
            batch = row[None].expand(len(cands), -1)
            best = self.logits(batch, cands).argmax(-1).tolist()
            options = [tuple(b[: self._length(c)]) for b, c in zip(best, cands, strict=True)]
            scores = teacher.score(batch, options)
            outs.append(options[int(scores.argmax())])
        return outs, 2


# --- CMLM and Mask-Predict -----------------------------------------------------------------------


def remask_count(length: int, t: int, iterations: int) -> int:
    """Mask-Predict's schedule: after iteration t (1-based) of T, ⌊L·(T−t)/T⌋ tokens are masked
    again (none after the last)."""
    return (length * (iterations - t)) // iterations


class CMLM(Seq2Seq):
    """A conditional masked language model: its decoder sees the target with some positions
    masked and predicts them; the length comes from the encoder, as the NAT's."""

    name = "cmlm"

    def __init__(self, cfg: Config = DEFAULT) -> None:
        super().__init__(cfg)
        self.length = LengthHead(cfg.d)

    def loss(self, src: torch.Tensor, tgt: list[tuple[int, ...]]) -> torch.Tensor:
        memory, mmask = self.encode(src)
        out = pad(list(tgt))
        inp = out.clone()
        for i, t in enumerate(tgt):  # mask a uniform number of positions, 1..L
            k = int(torch.randint(1, len(t) + 1, ()))
            inp[i, torch.randperm(len(t))[:k]] = MASK
        logits = self.decode(self.embed(inp), memory, mmask, inp == PAD)
        target = out.masked_fill(inp != MASK, PAD)  # the loss on the masked positions only
        token = nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=PAD)
        lengths = torch.tensor([len(t) for t in tgt])
        length = nn.functional.cross_entropy(self.length(memory, mmask), lengths)
        return token + 0.1 * length

    @torch.no_grad()
    def mask_predict(
        self, src: torch.Tensor, iterations: int
    ) -> tuple[list[tuple[int, ...]], int, list[list[dict]]]:
        """Mask-Predict with T = `iterations`; returns the translations, the decoder passes per
        sentence (T) and, per sentence, each iteration's tokens, confidences and re-masked
        positions (what the lab draws)."""
        memory, mmask = self.encode(src)
        logits = self.length(memory, mmask)
        logits[:, 0] = -math.inf
        lengths = logits.argmax(-1).tolist()
        n = max(lengths)
        tokens = pad([[MASK] * L for L in lengths], n)
        probs = torch.zeros(tokens.shape)
        real = tokens != PAD
        history: list[list[dict]] = [[] for _ in lengths]
        masked = tokens == MASK
        for t in range(1, iterations + 1):
            out = self.decode(self.embed(tokens), memory, mmask, ~real)
            p, best = torch.softmax(out, -1).max(-1)
            tokens = torch.where(masked, best, tokens)
            probs = torch.where(masked, p, probs)
            masked = torch.zeros_like(masked)
            for i, L in enumerate(lengths):
                k = remask_count(L, t, iterations)
                if k:
                    order = probs[i, :L].argsort()[:k]
                    masked[i, order] = True
                history[i].append(
                    {
                        "tokens": tokens[i, :L].tolist(),
                        "probs": [round(float(v), 4) for v in probs[i, :L]],
                        "remasked": sorted(masked[i, :L].nonzero().flatten().tolist()),
                    }
                )
            tokens = tokens.masked_fill(masked, MASK)
        outs = [tuple(tokens[i, :L].tolist()) for i, L in enumerate(lengths)]
        return outs, iterations, history


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sources(rows: list[tuple[int, ...]]) -> torch.Tensor:
    """A batch of encoder inputs (tagged sources)."""
    return pad(rows, MAX_WORDS + 1)
