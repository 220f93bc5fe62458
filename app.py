"""Decoding Lab web app. Thin by design: engine in decoders/, drawing in visualizer/, page in ui/.

    python app.py            # http://127.0.0.1:7860, embedded model
Environment: DECODING_LAB_MODEL (default model id), DECODING_LAB_ALLOW_ANY_MODEL=1 (accept any
hub id), DECODING_LAB_UI_MAX_NEW_TOKENS (cap, default 512), DECODING_LAB_CONCURRENCY (default 2).
"""

import os

from ui import build_demo
from ui.session import get_bundle

demo = build_demo()

if __name__ == "__main__":
    get_bundle(None)  # load before serving, so the first visitor does not wait
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
