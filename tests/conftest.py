import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the hub

from decoders import load_model

PROMPTS = [
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "Summarize: Speculative decoding drafts several tokens and verifies them in one forward pass.",
    "What is 17 * 23? Think step by step.",
    "import numpy as np\n\ndef softmax(x):\n",
]


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny-random")


@pytest.fixture(scope="session")
def embedded():
    return load_model()
