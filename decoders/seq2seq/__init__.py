"""A translation lab for non-autoregressive decoding: small encoder-decoder models trained here on
synthetic translation tasks with several right answers (`tasks.py`), where the multimodality
that non-autoregressive translation struggles with can be seen and measured (`metrics.py`)."""
