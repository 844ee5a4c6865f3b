"""A trained Plugin as one thing to ship and serve.

- ``artifact``: ``PluginModel`` (base + reweighting model + tokenizer + decoding settings + training
  record) with ``save_pretrained`` / ``from_pretrained``, and its generation.
- ``training``: a Plugin trained on a user's (prompt, completion) file by the paper's protocol.
- ``server``: an OpenAI-compatible endpoint (FastAPI) for the adapted model.
- ``cli``: the ``plugin-repro`` command (``train``, ``generate``, ``evaluate``, ``serve``); each one's flags
  are one request, checked once (``requests``).

Sits beside ``report`` above the harness: it loads bases by name and reads profiles.
"""
from __future__ import annotations

import importlib


def __getattr__(name: str):
    """``PluginModel`` and friends on first use, so importing the package stays cheap."""
    if name in ("PluginModel", "BaseSpec", "DecodingSettings", "ArtifactError"):
        return getattr(importlib.import_module(".artifact", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
