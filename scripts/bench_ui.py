"""What streaming through the app costs: decoder tokens/s for streamed runs vs the CLI.

    python scripts/bench_ui.py [--rounds 3] [--max-new-tokens 64] [--browser]

Starts the app on the embedded model and interleaves, on the same prompt:
- a streamed run of the page's own Run handler, consumed by gradio_client (every update the page
  would get, serialized and sent: the server-side cost of streaming);
- with --browser, the same run clicked in headless Chromium on this machine (pessimistic: the
  browser's rendering competes with the model for the 2 cores; a visitor's browser runs elsewhere);
- a CLI run (`python -m decoders`).
Reports tokens/s as the decoder measured it, the ratios, and the first-token latency in the page.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a haiku about the sea."
MODEL = "SmolLM2-135M-Instruct"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_tps(max_new: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "decoders",
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            str(max_new),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)["stats"]["tokens_per_s"]


def stream_run(client, max_new: int) -> float:
    job = client.submit(
        MODEL, PROMPT, "autoregressive", max_new, 0.0, 1.0, 0, api_name="/run_stream"
    )
    for _ in job:
        pass
    metrics_html = job.outputs()[-1][1]
    return float(re.findall(r'dl-v">([0-9.]+)<', metrics_html)[0])


def page_run(page, max_new: int) -> tuple[float, float]:
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#max-new-tokens input[type=number]").fill(str(max_new))
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    status = "document.querySelector('#status').innerText"
    clicked = time.perf_counter()
    page.locator("#run-btn").click()
    page.wait_for_function(f"!{status}.includes('Done')", timeout=60_000)  # this run has begun
    page.wait_for_function(
        f"(document.querySelectorAll('#tokens .dl-tok').length > 0 && {status}.includes('decoding'))"
        f" || {status}.includes('Done')",
        timeout=120_000,
    )
    first = time.perf_counter() - clicked
    page.wait_for_function(f"{status}.includes('Done')", timeout=300_000)
    cards = page.locator("#metrics .dl-v").all_inner_texts()
    return float(re.sub(r"[^0-9.]", "", cards[0])), first


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--browser", action="store_true", help="also click runs in headless Chromium")
    args = ap.parse_args()
    from gradio_client import Client

    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(240):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        stream_run(client, 8)  # warm-up
        streamed, cli = [], []
        for _ in range(args.rounds):
            streamed.append(stream_run(client, args.max_new_tokens))
            cli.append(cli_tps(args.max_new_tokens))
            print(f"streamed {streamed[-1]:.2f} tok/s · CLI {cli[-1]:.2f} tok/s", flush=True)
        report("streamed through the app", streamed, cli)
        if args.browser:
            page_bench(port, args.rounds, args.max_new_tokens)
    finally:
        server.terminate()
    return 0


def report(label: str, side: list[float], cli: list[float]) -> None:
    ratio = sum(side) / sum(cli)
    print(
        f"{label}: {sum(side) / len(side):.2f} tok/s vs CLI {sum(cli) / len(cli):.2f} tok/s "
        f"= {ratio:.2f}× ({(1 - ratio) * 100:.1f}% cost)"
    )


def page_bench(port: int, rounds: int, max_new: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), args=BROWSER_ARGS
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/?method=autoregressive")  # as the CLI runs
        page_run(page, 8)  # warm-up
        ui, cli, firsts = [], [], []
        for _ in range(rounds):
            tps, first = page_run(page, max_new)
            ui.append(tps)
            firsts.append(first)
            cli.append(cli_tps(max_new))
            print(
                f"page {tps:.2f} tok/s (first token {first:.2f} s) · CLI {cli[-1]:.2f} tok/s",
                flush=True,
            )
        browser.close()
    report("clicked in Chromium on this machine", ui, cli)
    print(
        f"first streamed token visible in the page: {min(firsts):.2f}–{max(firsts):.2f} s after Run"
    )


if __name__ == "__main__":
    sys.exit(main())
