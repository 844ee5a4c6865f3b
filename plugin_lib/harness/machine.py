"""This machine: where results and caches go, whether the Hugging Face Hub answers, the torch
device, and the profile that fits. Paths come from environment variables (an empty one counts as
unset):

- ``PLUGIN_CACHE_DIR``: base outputs, converted and fine-tuned models (default ``~/.cache/plugin-repro``).
- ``PLUGIN_RESULTS_DIR``: where runs, tables and figures go (default ``<repo>/results``).
- ``PLUGIN_DATA_DIR``: the data folder (default ``<repo>/data``; ``hub``: the Hugging Face Hub; ``plugin_lib.data``).

On Colab with Google Drive mounted (``/content/drive/MyDrive``), the GPU profiles' results
(``paper``, ``colab``) default to ``MyDrive/plugin-repro/results``, and the cache to
``.../cache``: a disconnected session loses nothing, and running the cell again continues from
the stored runs.

Light on purpose: every command's parser imports it (torch only inside the functions that ask it).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from .profile import REPO_ROOT, Profile

COLAB_DRIVE = Path("/content/drive/MyDrive")
DRIVE_PROFILES = ("paper", "colab")  # on Colab with Drive mounted, their results go to Drive


def drive_dir() -> Path | None:
    """``MyDrive/plugin-repro`` where Colab has Google Drive mounted, else None."""
    return COLAB_DRIVE / "plugin-repro" if COLAB_DRIVE.is_dir() else None


class CacheDirError(OSError):
    """The cache folder cannot be made or written: the message says which and what to set."""


def cache_dir() -> Path:
    """Where base outputs, converted models and fine-tuned weights are kept between runs:
    ``PLUGIN_CACHE_DIR``, else Drive's on Colab, else ``~/.cache/plugin-repro``."""
    drive = drive_dir()
    default = drive / "cache" if drive is not None else Path.home() / ".cache" / "plugin-repro"
    path = Path(os.environ.get("PLUGIN_CACHE_DIR") or default)  # empty is unset, not the working folder
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CacheDirError(f"the cache folder {path} cannot be created ({err.strerror}): set PLUGIN_CACHE_DIR to a "
                            "writable folder with room for the base outputs.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheDirError(f"the cache folder {path} is not writable: set PLUGIN_CACHE_DIR to a writable folder "
                            "with room for the base outputs.")
    return path


def results_root() -> Path:
    """Where every profile's results go (not created here); an empty PLUGIN_RESULTS_DIR is unset."""
    return Path(os.environ.get("PLUGIN_RESULTS_DIR") or REPO_ROOT / "results")


def results_path(profile: Profile | str) -> Path:
    """Where ``profile``'s results go, not created: under ``PLUGIN_RESULTS_DIR`` where it is set,
    else Drive's for the GPU profiles on Colab (it survives a disconnect), else results/."""
    name = profile.name if isinstance(profile, Profile) else profile
    if not os.environ.get("PLUGIN_RESULTS_DIR") and name in DRIVE_PROFILES and drive_dir() is not None:
        return drive_dir() / "results" / name
    return results_root() / name


def results_dir(profile: Profile | str | None = None) -> Path:
    """``results_path(profile)`` (``results_root()`` without one), created."""
    path = results_path(profile) if profile else results_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers: one TCP connection to it (``HF_ENDPOINT``'s host), a
    few seconds at most; False at once where ``HF_HUB_OFFLINE`` is true, read as huggingface_hub
    reads it. Without a network, transformers retries a Hub id for about 30 s before it looks in its
    local cache; asked first, a command decides in seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        port = url.port or (80 if url.scheme == "http" else 443)  # an http:// mirror without a port listens on 80
        socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def on_colab() -> bool:
    """A Colab runtime: its notebook's kernel, or a shell command run from it (``!plugin-repro run``)."""
    if os.environ.get("COLAB_RELEASE_TAG"):
        return True
    try:
        return importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):
        return False


def auto_profile() -> str:
    """Where a CUDA GPU and the Hub are available, ``colab`` on Colab (its T4 and A100 are what
    that profile is planned for; ``paper`` needs an 80 GB GPU) and ``paper`` elsewhere; otherwise
    ``local``."""
    import torch

    if not (torch.cuda.is_available() and hub_reachable()):
        return "local"
    return "colab" if on_colab() else "paper"


def device():
    """The torch device experiments run on: the GPU when there is one."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
