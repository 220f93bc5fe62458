"""What the translation models (decoders/seq2seq/models.py) share: the configuration, padding,
the encoder-decoder itself (`Seq2Seq`), the length head of the non-autoregressive ones, and the
encoder's input batches."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .tasks import MAX_TARGET, MAX_WORDS, PAD, VOCAB

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


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sources(rows: list[tuple[int, ...]]) -> torch.Tensor:
    """A batch of encoder inputs (tagged sources)."""
    return pad(rows, MAX_WORDS + 1)
