"""Speculative decoding (decoders/methods/speculative.py): lossless under greedy, exact under sampling.
Its draft stops (the confidence stop, schedule=cost): test_speculative_stop.py.

Greedy runs are compared token for token with autoregressive greedy, and each step's draft length
is checked against the gamma schedule and the budget. Sampling runs are checked against the
target's exact next-token distribution with a randomised probability integral transform (see
`pit`), and against autoregressive sampling over the same seeds.
"""

import dataclasses
from collections import defaultdict
from functools import partial

import pytest
import torch
from test_prompt_lookup import humaneval

from conftest import PROMPTS, matches_greedy, one_thread
from decoders import METHODS, DecodingLabError, InvalidParameter, generate, load_model, stream
from decoders.core.events import Commit, Done, Draft, Forward, Verify
from decoders.core.tree import chain
from decoders.methods.speculative import MAX_GAMMA
from decoders.trained.drafters import auto_draft
from decoders.trained.eagle import head_path

CHI2_9DOF_1E3 = 27.877  # the chi-square test on 10 bins, false alarm 1e-3
CHI2_CRIT_1E3 = {1: 10.828, 2: 13.816, 3: 16.266}  # by degrees of freedom
BINS = 10


@pytest.fixture(autouse=True)
def one_torch_thread():
    with one_thread():
        yield


def by_step(res) -> dict[int, dict]:
    """Each decode step's Draft, Verify, Commit and Forward events."""
    steps: dict[int, dict] = defaultdict(lambda: {"forwards": []})
    for e in res.events:
        if isinstance(e, Forward):
            steps[e.step]["forwards"].append(e)
        elif isinstance(e, Draft | Verify | Commit):
            key = type(e).__name__.lower()
            assert key not in steps[e.step], f"two {key} events in step {e.step}"
            steps[e.step][key] = e
    return dict(sorted(steps.items()))


def check_steps(res, gamma, schedule, budget, self_layers=None, n_layers=4):
    """Every step drafts exactly min(gamma, remaining - 1) tokens (gamma following the schedule),
    commits its accepted prefix plus one target token, and never runs past the budget."""
    g, done = gamma, 0
    for step, ev in by_step(res).items():
        commit = ev["commit"]
        if step == 0:
            assert "draft" not in ev and commit.origins == ("target",)
            done += len(commit.tokens)
            continue
        n = min(g, budget - done - 1)
        assert n >= 0, "a step ran after the budget was spent"
        draft = ev.get("draft")
        verify_fw = [f for f in ev["forwards"] if f.kind in ("verify", "target")]
        assert len(verify_fw) == 1 and verify_fw[0].layers == n_layers
        assert verify_fw[0].n_input_tokens == n + 1  # the last token and the draft, in one forward
        if n == 0:
            assert draft is None and "verify" not in ev
            assert commit.origins == ("target",) and len(commit.tokens) == 1
            done += 1
            continue
        assert draft is not None and len(draft.tokens) == n, (step, g, budget, done, draft)
        assert draft.parents == chain(n)
        assert all(0.0 <= q <= 1.0 for q in draft.probs)
        if self_layers is not None:  # self:k: one k-layer forward per drafted token
            drafts = [f for f in ev["forwards"] if f.kind == "draft"]
            assert [(f.layers, f.n_input_tokens) for f in drafts] == [(self_layers, 1)] * n
        verify = ev["verify"]
        k = len(verify.accepted)
        assert verify.accepted == tuple(range(k))
        assert len(verify.target_probs) == n
        assert commit.tokens[:k] == draft.tokens[: len(commit.tokens[:k])]
        full = ("draft",) * k + ("bonus" if k == n else "correction",)
        assert commit.origins == full[: len(commit.tokens)]
        if len(commit.tokens) < k + 1:  # cut short: only by an EOS
            assert commit.tokens[-1] in res_eos(res)
        else:
            assert commit.tokens[k] == verify.correction
        done += len(commit.tokens)
        if schedule == "adaptive":
            g = min(MAX_GAMMA, g + 2) if k == n else max(1, g - 1)
    assert done == len(res.token_ids) <= budget


same_as_greedy = partial(matches_greedy, method="speculative")


def res_eos(res):
    return {res.token_ids[-1]} if res.finish_reason == "eos" else set()


# --- greedy: lossless -------------------------------------------------------------------------------

DRAFTS = ("self:1", "self:2", "self:4", "tiny-random", "tiny-random-2")
COMBOS = [
    (draft, gamma, schedule)
    for draft in DRAFTS
    for gamma in (1, 3, 8)
    for schedule in ("fixed", "adaptive")
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "draft", "gamma", "schedule"),
    [(i, *c) for i, c in enumerate(COMBOS)],
    ids=[f"{d}-g{g}-{s}" for d, g, s in COMBOS],
)
def test_lossless_on_tiny(tiny, case, draft, gamma, schedule):
    # 30 settings x 6 prompts would be 180 runs: each setting gets one prompt, shifted per draft
    # so that every prompt meets every draft and every (gamma, schedule) pair.
    prompt = PROMPTS[(case + case // 6) % len(PROMPTS)]
    budget = 24 if draft == "tiny-random-2" else 32  # the disagreeing draft is the slow one
    res = same_as_greedy(tiny, prompt, budget, draft=draft, gamma=gamma, schedule=schedule)
    k = int(draft.split(":")[1]) if draft.startswith("self:") else None
    check_steps(res, gamma, schedule, budget, self_layers=k)
    verifies = [e for e in res.events if isinstance(e, Verify)]
    drafts = [e for e in res.events if isinstance(e, Draft)]
    assert verifies and all(v.rule == "greedy-chain" for v in verifies)
    if draft in ("tiny-random", "self:4"):  # the target drafting for itself: everything is kept
        assert all(len(v.accepted) == len(d.tokens) for v, d in zip(verifies, drafts, strict=True))
        if schedule == "fixed":
            lengths = [1 + len(v.accepted) for v in verifies[:-1]]  # the last may be cut short
            assert sum(lengths) / len(lengths) == gamma + 1
        assert res.stats["draft_acceptance_rate"] == 1.0
    if draft == "tiny-random-2":  # an unrelated model: (almost) nothing is kept
        assert res.stats["draft_acceptance_rate"] <= 0.1
        assert res.stats["mean_acceptance_length"] <= 1.2
    if draft == "self:1" and gamma == 1:
        assert drafts[0].source.startswith("self:1 ")


def test_self_draft_is_a_quarter_of_the_layers(tiny):
    res = same_as_greedy(tiny, PROMPTS[0], 8, draft="self")
    assert all(f.layers == 1 for f in res.events if isinstance(f, Forward) and f.kind == "draft")
    assert next(e for e in res.events if isinstance(e, Draft)).source.startswith("self:1 ")


@pytest.mark.parametrize(
    ("model_id", "label"),
    [
        ("tiny-random", "eagle (auto: 1 trained layer"),  # assets/eagle/ ships its head
        ("tiny-random-2", "self:1 (auto: first 1 of 4 layers)"),  # no head: a quarter of the layers
    ],
)
def test_the_default_draft_is_the_shipped_head_else_self(model_id, label):
    bundle = load_model(model_id)
    assert METHODS["speculative"].preset("defaults")["draft"] == "auto"
    assert auto_draft(bundle) == ("eagle" if head_path(model_id).is_file() else "self")
    assert head_path(model_id).is_file() == (model_id == "tiny-random")
    res = same_as_greedy(bundle, PROMPTS[1], 24)  # no draft given: auto
    drafts = [e for e in res.events if isinstance(e, Draft)]
    assert drafts and all(d.source.startswith(label) for d in drafts)
    assert res.stats["verify_steps"] > 0


def test_adaptive_gamma_grows_to_the_cap_when_everything_is_accepted(tiny):
    res = same_as_greedy(tiny, PROMPTS[2], 120, draft="tiny-random", gamma=1, schedule="adaptive")
    lengths = [len(e.tokens) for e in res.events if isinstance(e, Draft)]
    # gamma: 1, 3, 5, ... capped at 16; the last step is cut to what is left of the budget.
    assert lengths == [1, 3, 5, 7, 9, 11, 13, 15, 16, 16, 12]
    check_steps(res, 1, "adaptive", 120)


def test_adaptive_gamma_shrinks_to_one_when_nothing_is_accepted(tiny):
    res = same_as_greedy(tiny, PROMPTS[3], 16, draft="tiny-random-2", gamma=8, schedule="adaptive")
    lengths = [len(e.tokens) for e in res.events if isinstance(e, Draft)]
    assert lengths[:8] == [8, 7, 6, 5, 4, 3, 2, 1]
    check_steps(res, 8, "adaptive", 16)


# --- budget and EOS -----------------------------------------------------------------------------------


@pytest.mark.parametrize("draft", ["tiny-random", "self:2"])
@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_drafts_never_run_past_the_budget(tiny, draft, budget):
    for gamma, schedule in ((8, "fixed"), (16, "adaptive")):
        res = same_as_greedy(tiny, PROMPTS[4], budget, draft=draft, gamma=gamma, schedule=schedule)
        assert len(res.token_ids) == budget and res.finish_reason == "length"
        check_steps(res, gamma, schedule, budget)
        if budget == 1:  # the prefill alone decides the only token
            assert res.stats["target_forwards"] == 1
            assert not any(isinstance(e, Draft | Verify) for e in res.events)
        if draft == "tiny-random" and budget > 1:
            # Everything is accepted: one verify step fills the rest of the budget.
            assert res.stats["target_forwards"] == 2


def first_stop_inside(res, origin: str) -> tuple[int, int]:
    """A committed token (and its position) that first occurs at a position with `origin`, not the
    last token of its step's commit when origin is "draft": a stop there cuts a commit short."""
    pos = 0
    seen: set[int] = set()
    for e in res.events:
        if not isinstance(e, Commit):
            continue
        for j, (t, o) in enumerate(zip(e.tokens, e.origins, strict=True)):
            inside = o == origin and (origin != "draft" or j < len(e.tokens) - 1)
            if inside and t not in seen and e.step >= 2:
                return t, pos + j
            seen.add(t)
        pos += len(e.tokens)
    raise AssertionError(f"no {origin} token to stop at")


@pytest.mark.parametrize("origin", ["draft", "bonus", "correction"])
def test_eos_inside_a_step_stops_like_autoregressive(tiny, origin):
    # Find a token that the target committed as `origin`, then make it the EOS.
    source = {"draft": "tiny-random", "bonus": "tiny-random", "correction": "self:2"}[origin]
    free = same_as_greedy(tiny, PROMPTS[0], 40, draft=source, gamma=4, schedule="fixed")
    eos, position = first_stop_inside(free, origin)
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    for draft in ("tiny-random", "self:2", "tiny-random-2"):
        res = same_as_greedy(bundle, PROMPTS[0], 40, draft=draft, gamma=4, schedule="fixed")
        assert res.finish_reason == "eos"
        assert res.token_ids == free.token_ids[: position + 1]
        check_steps(res, 4, "fixed", 40)
        last = [e for e in res.events if isinstance(e, Commit)][-1]
        assert last.tokens[-1] == eos
        if draft == source:
            # The stop lands exactly where it did: on a token of that origin.
            assert last.origins[-1] == origin
            if origin == "draft":  # the verifier kept more than the output could take
                verify = [e for e in res.events if isinstance(e, Verify)][-1]
                assert len(verify.accepted) >= len(last.tokens)


# --- parameters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"draft": "self:0"}, r"self:0.*1\.\.4"),
        ({"draft": "self:5"}, r"self:5.*1\.\.4"),
        ({"draft": "self:99"}, r"self:99.*1\.\.4"),
        ({"gamma": 0}, r"gamma.*\[1, 16\]"),
        ({"gamma": 17}, r"gamma.*\[1, 16\]"),
        ({"gamma": "many"}, "gamma"),
        ({"schedule": "sometimes"}, "fixed, adaptive"),
        ({"gama": 3}, "unknown parameter 'gama'"),
    ],
)
def test_invalid_parameters_are_clear_errors(tiny, params, message):
    with pytest.raises(InvalidParameter, match=message):
        generate(tiny, PROMPTS[0], "speculative", 8, **params)


def test_a_malformed_self_draft_is_a_project_error(tiny):
    # Not self:<digits>, so it is taken for a model id; offline, that fails as a load error.
    with pytest.raises(DecodingLabError, match="self:x"):
        generate(tiny, PROMPTS[0], "speculative", 8, draft="self:x")


def test_stream_rejects_a_bad_self_draft_at_call_time(tiny):
    with pytest.raises(InvalidParameter, match=r"1\.\.4"):
        stream(tiny, PROMPTS[0], "speculative", 8, draft="self:0")


# --- sampling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft", ["self:2", "tiny-random-2"])
def test_sampling_is_reproducible_per_seed(tiny, draft):
    kw = dict(draft=draft, temperature=1.0, seed=5, gamma=3)
    a = generate(tiny, PROMPTS[1], "speculative", 16, **kw)
    b = generate(tiny, PROMPTS[1], "speculative", 16, **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16
    untimed = [[e for e in r.events if not isinstance(e, Forward | Done)] for r in (a, b)]
    assert untimed[0] == untimed[1]  # the same drafts, verdicts and commits (timings differ)
    c = generate(tiny, PROMPTS[1], "speculative", 16, **{**kw, "seed": 6})
    assert c.token_ids != a.token_ids
    assert all(v.rule == "speculative-sampling" for v in a.events if isinstance(v, Verify))


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_with_the_target_as_draft_accepts_everything(tiny, temperature, top_p):
    """q == p (up to float noise between batch shapes): a draft is kept with probability
    min(1, p / q) = 1. Catches a q row that is misaligned, untempered or untruncated."""
    res = generate(
        tiny,
        PROMPTS[5],
        "speculative",
        40,
        draft="tiny-random",
        gamma=4,
        schedule="fixed",
        temperature=temperature,
        top_p=top_p,
        seed=1,
    )
    assert res.stats["draft_acceptance_rate"] >= 0.95, res.stats
    check_steps(res, 4, "fixed", 40)


def next_token_probs(bundle, contexts, temperature) -> torch.Tensor:
    """The model's exact next-token distribution after each context (equal lengths), batched."""
    ids = torch.tensor(contexts, dtype=torch.long, device=bundle.device)
    with torch.inference_mode():
        logits = bundle.model(input_ids=ids, logits_to_keep=1).logits[:, -1].double().cpu()
    return torch.softmax(logits / temperature, dim=-1)


def pit(tokens, probs, key, seed=0) -> torch.Tensor:
    """Randomised probability integral transform: with the vocabulary ranked by `key` (highest
    first), U = P(Y ranks before y) + V * P(Y = y), V ~ U(0, 1). If y ~ probs, U ~ U(0, 1) exactly,
    whatever the ranking; ranking by the draft's preference makes a bias towards drafted tokens
    show up as an excess of small U."""
    y = torch.as_tensor(tokens)
    rows = torch.arange(len(y))
    order = torch.argsort(key, dim=-1, descending=True, stable=True)
    ranked = torch.gather(probs, 1, order)
    rank = (order == y[:, None]).to(torch.int8).argmax(dim=1)
    before = ranked.cumsum(dim=1)[rows, rank] - ranked[rows, rank]
    v = torch.rand(len(y), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (before + v * probs[rows, y]).clamp(0.0, 1.0 - 1e-12)


def bin_counts(u: torch.Tensor) -> torch.Tensor:
    return torch.bincount((u * BINS).long(), minlength=BINS).double()


def uniformity_chi2(u: torch.Tensor) -> float:
    counts = bin_counts(u)
    expected = len(u) / BINS
    return float(((counts - expected) ** 2 / expected).sum())


def sampled_second_tokens(bundle, prompt_ids, method, seeds, temperature, **params):
    """(first, second) generated tokens and the run of each seed, 3 tokens per run: the first
    comes from the prefill, the second from the first draft-and-verify step."""
    firsts, seconds, runs = [], [], []
    for seed in seeds:
        res = generate(bundle, prompt_ids, method, 3, temperature=temperature, seed=seed, **params)
        assert len(res.token_ids) == 3, res.token_ids  # an EOS at T = 1 is a ~1e-4 event
        firsts.append(res.token_ids[0])
        seconds.append(res.token_ids[1])
        runs.append(res)
    return firsts, seconds, runs


@pytest.mark.slow
def test_sampling_follows_the_target_distribution(tiny):
    """Temperature 1, draft tiny-random-2 (about 40% of its samples are kept). The first token is
    the prefill's own draw, so the second one (the first verified step) is tested: against the
    target's exact distribution given the first, and against autoregressive sampling."""
    draft = load_model("tiny-random-2")
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    seeds = range(240)
    firsts, seconds, runs = sampled_second_tokens(
        tiny, prompt_ids, "speculative", seeds, 1.0, draft="tiny-random-2", gamma=1
    )
    contexts = [[*prompt_ids, t] for t in firsts]
    p = next_token_probs(tiny, contexts, 1.0)
    q = next_token_probs(draft, contexts, 1.0)

    drafted, kept = [], 0
    for i, res in enumerate(runs):
        d = next(e for e in res.events if isinstance(e, Draft))
        v = next(e for e in res.events if isinstance(e, Verify))
        assert d.step == 1 and len(d.tokens) == 1
        # The draft and the verifier scored the right position (decoding's one-row forwards
        # against a batched one here: probabilities up to the kernels' rounding, KERNEL_TOL's
        # 1e-4 relative on p <= 0.1, and the events' 6 decimals)
        assert d.probs[0] == pytest.approx(float(q[i, d.tokens[0]]), abs=1e-5)
        assert v.target_probs[0] == pytest.approx(float(p[i, d.tokens[0]]), abs=1e-5)
        drafted.append(d.tokens[0])
        kept += bool(v.accepted)
    # Acceptance rate ~ sum(min(p, q)) (≈ 0.4 here): the rule is active in both directions.
    overlap = float(torch.minimum(p, q).sum(dim=1).mean())
    assert 0.25 < overlap < 0.6
    assert abs(kept / len(runs) - overlap) < 4 * (overlap * (1 - overlap) / len(runs)) ** 0.5

    draft_first = (q / p.clamp_min(1e-300)).log()  # the draft's preference over the target's
    u_spec = pit(seconds, p, draft_first, seed=1)
    assert uniformity_chi2(u_spec) < CHI2_9DOF_1E3, bin_counts(u_spec)
    assert uniformity_chi2(pit(seconds, p, p, seed=2)) < CHI2_9DOF_1E3
    # The check has power: the drafted tokens themselves (~ q, not p) fail it by far.
    assert uniformity_chi2(pit(drafted, p, draft_first, seed=3)) > 5 * CHI2_9DOF_1E3

    # (Autoregressive sampling's own draws are tested once, where they live: test_autoregressive.)


# --- the embedded model ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("task", "draft"), [(0, "self:8")])  # a deeper self-draft: the same code
def test_lossless_on_the_embedded_model(embedded, task, draft):
    res = same_as_greedy(embedded, humaneval(task), 48, draft=draft, gamma=4, schedule="adaptive")
    check_steps(res, 4, "adaptive", 48, self_layers=int(draft[5:]), n_layers=embedded.n_layers)
    assert res.stats["verify_steps"] > 0
    if draft == "self:20":  # two thirds of the model agree with it on code often enough
        assert res.stats["accepted_drafts"] > 0
