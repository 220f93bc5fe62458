"""The non-autoregressive translation models (decoders/seq2seq/models.py): the NAT (Gu et al.
2018), its target positions filled from a uniform or a fertility copy of the source, and the
CMLM that Mask-Predict decodes (Ghazvininejad et al. 2019)."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch import nn

from .backbone import DEFAULT, Config, LengthHead, Seq2Seq, pad
from .tasks import MASK, MAX_TARGET, N_WORDS, PAD, REG, SRC, is_word

if TYPE_CHECKING:
    from .models import AR


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
