"""Profiles, model names and the directories the package reads from and writes to.

All settings live in ``profiles.yaml`` next to this file; this module only reads them and
resolves paths from environment variables:

- ``PLUGIN_DATA_DIR``: a folder laid out like the repository's ``../shared/data``. Unset: the
  loaders use the Hugging Face Hub dataset names instead.
- ``PLUGIN_CACHE_DIR``: converted models and base-output caches (default ``~/.cache/plugin-repro``).
- ``PLUGIN_RESULTS_DIR``: where runs, tables and figures go (default ``<repo>/results``).
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILE_NAMES = ("paper", "local", "smoke")


@functools.lru_cache(maxsize=1)
def _settings() -> dict[str, Any]:
    with open(Path(__file__).with_name("profiles.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_profile(name: str, **overrides: Any) -> dict[str, Any]:
    """The settings of profile ``name`` as a fresh dict; ``overrides`` replace top-level keys."""
    profiles = _settings()["profiles"]
    if name not in profiles:
        raise ValueError(f"Unknown profile {name!r}. Choose one of: {', '.join(profiles)}.")
    profile = copy.deepcopy(profiles[name])
    unknown = set(overrides) - set(profile)
    if unknown:
        raise ValueError(f"Unknown profile field(s) {sorted(unknown)}; known: {sorted(profile)}.")
    profile.update(copy.deepcopy(overrides))
    profile["name"] = name
    return profile


def model_spec(name: str) -> dict[str, Any]:
    """Registry entry of a base model: its source, family and display name.

    A name that is not in the registry is treated as a Hub id or a local directory of a
    GPT-2 or LLaMA-family model, so users can plug in their own model. A name with a top-k
    suffix (``"smollm2-135m-instruct@top20"``, see ``plugin_lib.topk``) is that base's spec
    under the suffixed name, with the view's ``top_k`` and ``top_k_rule``.
    """
    from .topk import parse_model_name  # here, not at the top: topk imports this module

    view = parse_model_name(name)
    if view is not None:
        base, k, rule = view
        spec = model_spec(base)
        shown = f"top-{k} log-probs ({rule})" if k else "all log-probs"
        return {**spec, "name": name, "display": f"{spec['display']}, {shown}", "top_k": k, "top_k_rule": rule}
    models = _settings()["models"]
    if name in models:
        return {"name": name, **models[name]}
    if "/" in name or Path(name).exists():
        family = "gpt2-m" if "gpt2" in name.lower() else "llama"
        return {"name": name, "source": "hub", "hub_id": name, "family": family, "display": name}
    raise ValueError(
        f"Unknown base model {name!r}. Known: {', '.join(models)}; or pass a Hub id "
        "('org/name') or a local model directory."
    )


def reweighter_spec(family: str) -> dict[str, Any]:
    """Reweighting-model architecture the authors used for a base-model family."""
    specs = _settings()["reweighters"]
    if family not in specs:
        raise ValueError(f"Unknown model family {family!r}; known: {', '.join(specs)}.")
    return dict(specs[family])


def data_dir() -> Path | None:
    """The local data folder (``PLUGIN_DATA_DIR``), or None to use the Hugging Face Hub."""
    value = os.environ.get("PLUGIN_DATA_DIR")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"PLUGIN_DATA_DIR={value!r} is not a directory. Point it at a folder laid out like "
            "shared/data (e2e_cleaned/, webnlg/, commongen/, adidas/, nltk_data/), or unset it "
            "to download the datasets from the Hugging Face Hub."
        )
    return path


def cache_dir() -> Path:
    path = Path(os.environ.get("PLUGIN_CACHE_DIR", Path.home() / ".cache" / "plugin-repro"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir(profile: str | None = None) -> Path:
    root = Path(os.environ.get("PLUGIN_RESULTS_DIR", REPO_ROOT / "results"))
    path = root / profile if profile else root
    path.mkdir(parents=True, exist_ok=True)
    return path


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the Hugging Face Hub answers (and HF_HUB_OFFLINE is not set)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return False
    import urllib.request

    try:
        urllib.request.urlopen("https://huggingface.co/api/models/gpt2", timeout=timeout)
        return True
    except Exception:
        return False


def auto_profile() -> str:
    """``paper`` where a CUDA GPU and the Hub are available, otherwise ``local``."""
    import torch

    return "paper" if torch.cuda.is_available() and hub_reachable() else "local"


def device():
    """The torch device experiments run on: the GPU when there is one."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def use_local_nltk_data() -> None:
    """Let NLTK find ``<PLUGIN_DATA_DIR>/nltk_data`` (stopwords, punkt_tab) without NLTK_DATA."""
    folder = data_dir()
    if folder is not None and (folder / "nltk_data").is_dir():
        import nltk

        if str(folder / "nltk_data") not in nltk.data.path:
            nltk.data.path.append(str(folder / "nltk_data"))
