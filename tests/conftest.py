import os
import shutil
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the hub

from decoders import generate, load_model

# Under pytest-xdist (`make test` runs two workers on a 2-core box) each worker is one process on
# one core: a second intra-op thread per worker would only wait for its time slice (see one_thread).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"

PROMPTS = [
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "Summarize: Speculative decoding drafts several tokens and verifies them in one forward pass.",
    "What is 17 * 23? Think step by step.",
    "import numpy as np\n\ndef softmax(x):\n",
]


# Floats that two different computations produce (a prefill against a one-token step, a batched
# forward against rows one at a time, a packed linear against torch's own, a stacked weight against
# the plain one) are the same sums added in another order. In float32 they agree to about 1e-6
# relative per operation and a few 1e-6 after a few layers, but the order is the CPU's kernels'
# choice: oneDNN blocks differently on an Intel Xeon with AMX / AVX-512 than on an AMD EPYC, and
# a test that asked for the bits (or for torch.allclose's default 1e-5 relative, 1e-8 absolute)
# held on one and failed on the other (test_calm, 2026-11-27). Such floats are compared within
# KERNEL_TOL, a hundredfold above that noise and still far below what any tested difference
# moves (a propagated key differs from the true one by ~1); bits are compared only where both
# sides ran the very same computation (a copy, a round trip, the same call twice).
KERNEL_TOL = {"rtol": 1e-4, "atol": 1e-4}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same floats up to the kernels' order of summation (KERNEL_TOL)."""
    return torch.allclose(a, b, **KERNEL_TOL)


@dataclass(frozen=True)
class Greedy:
    """Autoregressive greedy's tokens for a prompt and budget, and why it stopped."""

    token_ids: list[int]
    finish_reason: str


# Per model (by identity, held weakly: tests build private models), per EOS set and prompt ids:
# the longest greedy run decoded so far in this worker, and the budget it was decoded with.
_greedy_runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def greedy(bundle, prompt, max_new_tokens: int, chat: bool | None = None) -> Greedy:
    """Autoregressive greedy on this bundle (its EOS set included), decoded once per prompt for
    the whole worker: greedy's tokens do not depend on its budget, so a run to N tokens answers
    every budget up to N, and a run that stopped at an EOS answers every budget."""
    ids = tuple(bundle.encode(prompt, chat) if isinstance(prompt, str) else prompt)
    runs = _greedy_runs.setdefault(bundle.model, {})
    key = (bundle.eos_ids, ids)
    tokens, budget = runs.get(key, ([], 0))
    stopped = bool(tokens) and tokens[-1] in bundle.eos_ids
    if budget < max_new_tokens and not stopped:
        tokens = generate(bundle, list(ids), "autoregressive", max_new_tokens, record=False)
        tokens, budget = tokens.token_ids, max_new_tokens
        runs[key] = (tokens, budget)
    kept = tokens[:max_new_tokens]
    return Greedy(kept, "eos" if kept and kept[-1] in bundle.eos_ids else "length")


@dataclass
class Run:
    """What `run_with` returns: a run's tokens, why it stopped, its stats and its events."""

    token_ids: list[int]
    finish_reason: str
    stats: dict
    events: list


def run_with(bundle, prompt, method: str, budget: int, part=None, **params) -> Run:
    """A run as `generate` makes it (checks, events, Done with stats), raw text, with `part` (a
    trained part: Medusa heads, a block head) in place of the shipped one: the method module's
    `decode_with(bundle, prompt_ids, cfg, part)` decodes."""
    import dataclasses
    import importlib

    from decoders.core.events import Commit, Done
    from decoders.engine import prepare, run_events

    prompt_ids = bundle.encode(prompt, chat=False) if isinstance(prompt, str) else prompt
    job = prepare(bundle, prompt_ids, method, budget, params=params)
    if part is not None:
        module = importlib.import_module(f"decoders.methods.{method}")

        def decode(bundle, prompt_ids, cfg):
            return module.decode_with(bundle, prompt_ids, cfg, part)

        job = dataclasses.replace(job, method=dataclasses.replace(job.method, decode=decode))
    events = list(run_events(job))
    done = events[-1]
    assert isinstance(done, Done)
    tokens = [t for e in events if isinstance(e, Commit) for t in e.tokens]
    return Run(tokens, done.finish_reason, done.stats, events)


def matches_greedy(bundle, prompt, max_new_tokens: int, method: str, chat=None, **params):
    """Run `method` and check it against greedy token for token (near-ties: assert_greedy), and
    that it stopped for the same reason."""
    res = generate(bundle, prompt, method, max_new_tokens, chat=chat, **params)
    ref = greedy(bundle, prompt, max_new_tokens, chat)
    assert_greedy(bundle, res, ref.token_ids)
    if res.token_ids == ref.token_ids:
        assert res.finish_reason == ref.finish_reason
    return res


def assert_greedy(bundle, result, reference: list[int]) -> None:
    """A lossless run's tokens against autoregressive greedy's, token for token, except where
    the first difference falls on a float near-tie (greedy's top two logits closer than the
    dtype's noise: engine.NEAR_TIE), which another CPU's kernels may break the other way: that is
    reported as a warning, not a failure. On the tiny models (peaked by construction) there are
    no near-ties, so this is strict there."""
    from decoders.engine import compare_tokens, with_near_tie

    check = compare_tokens(reference, result.token_ids, bundle.exact)
    if check.identical:
        return
    check = with_near_tie(bundle, result.prompt_ids, reference, check)
    assert check.near_tie, f"{result.method} {result.params}: {check.describe()}"
    import warnings

    warnings.warn(f"{result.method}: {check.describe()}", stacklevel=2)


# The files that drive the app server, and most of them the page: one xdist scope, so one worker
# runs them one after another against one app server (the other decodes meanwhile).
# (test_app_traces.py and test_compare_results.py drive neither: split from their files, they run
# with them.)
ON_THE_SERVER = (
    "test_browser_views.py",
    "test_browser.py",
    "test_browser_links.py",
    "test_browser_tour.py",
    "test_compare.py",
    "test_compare_page.py",
    "test_concurrency.py",
    "test_app.py",
)
# The longest first (by their time in `make test`, 2026-11-29): pytest-xdist hands out groups
# (whole files, or the group above) in the order they were collected (make test turns its
# reordering by test count off), and a long file started last runs on alone while the other
# worker idles. Files not named here take 10 s or less (in either tier).
HEAVY_FIRST = (
    *ON_THE_SERVER,
    # split from the server's files, but in process: on the other worker, started first
    "test_compare_results.py",
    "test_app_traces.py",
    "test_token_tree.py",
    "test_token_tree_lookup.py",
    "test_token_tree_sizing.py",
    "test_lossless.py",
    "test_kangaroo.py",
    "test_kangaroo_mirror.py",
    "test_kangaroo_views.py",
    "test_speculative.py",
    "test_speculative_stop.py",
    "test_tour.py",
    "test_eagle.py",
    "test_medusa.py",
    "test_medusa_views.py",
    "test_calm.py",
    "test_calm_free.py",
    "test_calm_views.py",
    "test_self_speculative.py",
    "test_space.py",
    "test_space_train.py",
    "test_train.py",
    "test_train_corpus.py",
    "test_train_options.py",
    "test_seq2seq.py",
    "test_prompt_lookup.py",
    "test_lookahead.py",
    "test_layerskip.py",
    "test_device_scripts.py",
    "test_cli.py",
    "test_autoregressive.py",
    "test_device_map.py",
    "test_verify.py",
    "test_mask_predict.py",
    "test_retrieval.py",
    "test_imports.py",
    "test_lookahead_views.py",
    "test_lookahead_views_pool.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within kept


def pytest_xdist_make_scheduler(config, log):
    """Whole files to a worker (loadfile), but the app server's files all to one. (xdist's own
    loadgroup marks do not reach its scheduler under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ServerFilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "app-server" if Path(path).name in ON_THE_SERVER else path

    return ServerFilesTogether(config, log)


@contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a busy 2-core machine a second thread turns each small op into a
    wait for its time slice (a softmax over 3 x 6 numbers took 8 ms instead of 2 µs, and one
    embedded-model run 255 s instead of 8 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def oracle_masks(monkeypatch: pytest.MonkeyPatch, module) -> list[int]:
    """Make `module.forward_masked` perfect: a mask row at absolute position P gets a one-hot on
    the reference token at P + 1. Fill the returned list with the reference sequence."""
    import dataclasses

    truth: list[int] = []
    real_forward = module.forward_masked

    def forward(bundle, adapter, cache, tokens, first, *, positions, **kw):
        out = real_forward(bundle, adapter, cache, tokens, first, positions=positions, **kw)
        out = dataclasses.replace(out, logits=out.logits.clone())
        for row, pos in enumerate(positions):
            if row >= first and pos + 1 < len(truth):
                out.logits[row] = torch.full_like(out.logits[row], -1e4)
                out.logits[row, truth[pos + 1]] = 1e4
        return out

    monkeypatch.setattr(module, "forward_masked", forward)
    return truth


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny-random")


@pytest.fixture(scope="session")
def embedded():
    return load_model()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server():
    port = free_port()
    env = {
        **os.environ,
        "DECODING_LAB_MODEL": "tiny-random",
        "GRADIO_SERVER_PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        # Enough decoding slots that test_concurrency's six /run calls truly run at once.
        "DECODING_LAB_CONCURRENCY": "8",
        # The app shares the box with the tests (and, under xdist, with a second worker).
        "OMP_NUM_THREADS": "1",
    }
    # The app's output goes to a file: a pipe nobody reads fills up (64 KB of logs and warnings
    # over a long session) and then blocks the app's next write, which hangs every later run.
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited: {log_path.read_text()[-4000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("app did not start in 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


# --- headless Chromium (Debian's, driven by Playwright) -------------------------------------------

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
DESKTOP = {"width": 1440, "height": 1000}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="session")
def browser():
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: scripts/ensure-chromium.sh installs it")
        pytest.skip(f"{CHROMIUM} not installed (run scripts/ensure-chromium.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


@pytest.fixture()
def page(browser):
    """A desktop-sized page; `phone_page` is the 390 x 844 one."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport=DESKTOP, accept_downloads=True)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture()
def phone_page(browser):
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    yield page
    context.close()
