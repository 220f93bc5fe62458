"""METHODS: every decoding method by name, with its parameter schema. New methods register here."""

from __future__ import annotations

from . import (
    autoregressive,
    blockwise,
    calm,
    drafters,
    free,
    hash_ee,
    jacobi,
    kangaroo,
    layerskip,
    lookahead,
    mask_predict,
    medusa,
    prompt_lookup,
    self_speculative,
    space,
    speculative,
    token_tree,
)
from .base import Method

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            name="autoregressive",
            title="Autoregressive (baseline)",
            decode=autoregressive.decode,
            summary="One target forward per token: the reference every other method must match.",
        ),
        Method(
            name="prompt_lookup",
            title="Prompt lookup (n-gram copy drafts)",
            decode=prompt_lookup.decode,
            params=prompt_lookup.PARAMS,
            presets={"paper": {"max_ngram": 3, "num_draft": 10, "match": "earliest"}},
            summary="Drafts by copying what followed the last matching n-gram; one forward verifies.",
            relaxable=True,
        ),
        Method(
            name="speculative",
            title="Speculative decoding (EAGLE head, a draft model, or self:k)",
            decode=speculative.decode,
            params=speculative.PARAMS,
            # Leviathan et al.: a fixed γ; the drafter stays ours (no smaller sibling model offline)
            presets={"paper": {"gamma": 4, "schedule": "fixed"}},
            check=drafters.check_draft,
            summary="A cheap drafter proposes γ tokens; the target accepts a prefix in one forward.",
            relaxable=True,
        ),
        Method(
            name="token_tree",
            title="Token tree (static Medusa-style or dynamic EAGLE-2-style)",
            decode=token_tree.decode,
            params=token_tree.PARAMS,
            # EAGLE-2 (Li et al. 2024): depth 6, top-k 10 (8 is our cap), 60 nodes, no copied branch
            presets={
                "paper": {
                    "shape": "dynamic",
                    "depth": 6,
                    "top_k": 8,
                    "nodes": 60,
                    "size": "fixed",
                    "lookup": 0,
                    "trust": 0,
                }
            },
            check=token_tree.check,
            summary="Drafts a tree of alternatives; one forward with a tree mask verifies every branch.",
            relaxable=True,
        ),
        Method(
            name="self_speculative",
            title="Draft & Verify (self-speculative, skipped layers)",
            decode=self_speculative.decode,
            params=self_speculative.PARAMS,
            # Zhang et al. 2024, the authors' evaluation: θ starts at 0.6 and adapts, 12 drafts at most
            presets={"paper": {"threshold": 0.6, "adaptive": True, "max_draft": 12}},
            check=self_speculative.check,
            summary="The model drafts for itself with searched attention/MLP sublayers skipped.",
            relaxable=True,
        ),
        Method(
            name="kangaroo",
            title="Kangaroo (self-speculative, double early exit + adapter)",
            decode=kangaroo.decode,
            params=kangaroo.PARAMS,
            # Liu et al. 2024: η = 0.6, γ = 6 (their code's threshold and steps), a chain (no
            # runners-up); ℓ from the sweep
            presets={"paper": {"eta": 0.6, "gamma": 6, "siblings": 0}},
            check=kangaroo.check,
            summary="The first ℓ layers and a small trained adapter draft; the remaining layers verify.",
            relaxable=True,
        ),
        Method(
            name="layerskip",
            title="LayerSkip (self-speculation on a model tuned for early exit)",
            decode=layerskip.decode,
            params=layerskip.PARAMS,
            # Elhoushi et al. 2024 (their repository's example: exit after 8 of Llama2's 32 layers,
            # i.e. a quarter, and 6 speculated tokens, no confidence stop, the whole LM head)
            presets={
                "paper": {
                    "exit_layer": "auto",
                    "eta": 0.0,
                    "gamma": 6,
                    "siblings": 0,
                    "vocab": "full",
                }
            },
            check=layerskip.check,
            summary="On a model tuned to be read early, its first E layers and its own LM head draft; the rest of the layers verify, reusing what drafting computed.",
            relaxable=True,
        ),
        Method(
            name="jacobi",
            title="Jacobi decoding (parallel fixed-point iteration)",
            decode=jacobi.decode,
            params=jacobi.PARAMS,
            presets={"paper": {"block": 16}},
            sampling=False,
            summary="Refines a block of guessed tokens in parallel; commits the converged prefix.",
        ),
        Method(
            name="lookahead",
            title="Lookahead decoding (Jacobi window + n-gram verification)",
            decode=lookahead.decode,
            params=lookahead.PARAMS,
            # Fu et al. 2024 on a 7B model: W = 15, N = 5, G = 15; the pool from the window only
            presets={
                "paper": {
                    "N": 5,
                    "W": 15,
                    "G": 15,
                    "pool_from_output": False,
                    "rank_by_context": False,
                }
            },
            summary="Jacobi trajectories fill an n-gram pool; matching n-grams are verified in the same forward.",
            relaxable=True,
        ),
        Method(
            name="medusa",
            title="Medusa (extra decoding heads, a static tree)",
            decode=medusa.decode,
            params=medusa.PARAMS,
            # Cai et al. 2024: the 63-node tree mc_sim_7b_63 over each head's top 10 (it fits here)
            presets={"paper": {"nodes": 63, "top_k": 10, "choices": ""}},
            check=medusa.check,
            summary="Heads on the target's last features guess the next tokens; their tree is verified in the forward that feeds them.",
            relaxable=True,
        ),
        Method(
            name="blockwise",
            title="Blockwise parallel decoding (the Medusa heads' top-1 chain)",
            decode=blockwise.decode,
            params=blockwise.PARAMS,
            # Stern et al. 2018 sweep blocks of 2-10 tokens; the shipped heads allow 4 + 1
            presets={"paper": {"k": 4}},
            check=blockwise.check,
            summary="Each head guesses one token further ahead; their top picks are verified as one chain.",
            relaxable=True,
        ),
        Method(
            name="space",
            title="SPACE (auto-correct decoding with mask guesses)",
            decode=space.decode,
            params=space.PARAMS,
            # Yi et al. 2024: k = 5 masks per group and a group after every candidate; here every
            # mask the adapter was trained with (k = 0 = all of them) and as many groups.
            # "longer": one more guess and group than the defaults: more tokens per forward (2.12
            # against 1.98 on HumanEval, 2026-11-27) for more inputs, slower on the tuning prompts
            presets={"paper": {"k": 0, "groups": 0}, "longer": {"k": 3, "groups": 3}},
            check=space.check,
            summary="Mask tokens guess the next k tokens; one forward verifies last step's guesses and makes the next ones.",
            relaxable=True,
        ),
        Method(
            name="mask_predict",
            title="Mask-Predict (lossy: parallel fill and re-mask, unverified)",
            decode=mask_predict.decode,
            params=mask_predict.PARAMS,
            # Ghazvininejad et al. 2019: T = 10 iterations over a whole target sentence with linear
            # decay; at our block size that is the full schedule, one mask fewer each iteration
            presets={"paper": {"m": 0, "T": 0}},
            lossless=False,
            sampling=False,
            check=mask_predict.check,
            summary="Fills m masked tokens at once, then re-predicts the least confident ones T times. Lossy: never verified.",
        ),
        Method(
            name="calm",
            title="CALM (lossy: confident adaptive early exit)",
            decode=calm.decode,
            params=calm.PARAMS,
            # Schuster et al. 2022: softmax response with the decaying threshold (τ = 4), exits
            # offered from the first layer on
            presets={"paper": {"tau": 4.0, "min_depth": 0.0}},
            lossless=False,
            sampling=False,
            check=calm.check,
            summary="Each token leaves at the first trained exit whose confidence passes a threshold; skipped layers get propagated states. Lossy.",
        ),
        Method(
            name="free",
            title="FREE (lossy: shallow exit + synchronized catch-up)",
            decode=free.decode,
            params=free.PARAMS,
            # Bae et al. 2023: a shallow model of about a fifth of the layers, λ from the
            # Beta-mixture estimate
            presets={"paper": {"exit_layer": "shallow", "adaptive": True}},
            lossless=False,
            sampling=False,
            check=free.check,
            summary="Confident tokens leave at one shallow exit and are held back; the next deep token takes them through the deep layers in one parallel pass. Lossy.",
        ),
        Method(
            name="hash_ee",
            title="HASH EE (lossy: hash-based early exit)",
            decode=hash_ee.decode,
            params=hash_ee.PARAMS,
            # Sun et al. 2022: every layer may be an exit; here every trained exit may be one
            presets={"paper": {"min_depth": 0.0}},
            lossless=False,
            sampling=False,
            check=hash_ee.check,
            summary="Each token id exits at a fixed layer from a frequency hash (frequent tokens early). Lossy.",
        ),
    )
}
