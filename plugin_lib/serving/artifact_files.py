"""An artifact's files read and written with torch, transformers and safetensors alone: its
config and the reweighting model. ``serving.artifact`` builds ``PluginModel`` on them; the vLLM
logits processor (``serving.vllm_processor``) loads the reweighting model with them inside vLLM's
own environment, where the package's other dependencies are not installed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..core.reweighter import ContextFreeReweighter
from ..utils.io import current_umask
from .inputs import CONFIG_FILE

FORMAT = 1


class ArtifactError(ValueError):
    """A directory that is not a loadable Plugin artifact."""


def read_json(path: Path) -> dict:
    """A JSON file of the artifact, or one line naming it and what is wrong."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path} is damaged ({err}): write the artifact again (plugin-repro train, or "
                            "save_pretrained), or restore the file.") from None
    if not isinstance(found, dict):
        raise ArtifactError(f"{path} holds a {type(found).__name__}, not an object: the artifact is damaged.")
    return found


def read_config(directory: str | os.PathLike) -> dict:
    """``plugin_config.json`` of an artifact, its format checked, with a clear error for anything else."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ArtifactError(f"{directory} is not a Plugin artifact (no {CONFIG_FILE}): make one with "
                            "`plugin-repro train` or PluginModel.save_pretrained.")
    config = read_json(path)
    if config.get("format") != FORMAT:
        raise ArtifactError(f"{path} has artifact format {config.get('format')!r}; this package reads format "
                            f"{FORMAT}: install the plugin-repro version that wrote it ({config.get('package_version')}).")
    for part in ("tokenizer",):
        if not (directory / part).is_dir():
            raise ArtifactError(f"{directory} is incomplete: {part}/ is missing. Save the artifact again.")
    return config


def usual_modes(folder: Path) -> None:
    """Every file of ``folder`` with the user's normal permissions (0666 less the umask), as
    ``open`` gives: safetensors writes its file 0600, the rest 0644."""
    mode = 0o666 & ~current_umask()
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(mode)


def save_reweighter(reweighter: torch.nn.Module, directory: Path) -> dict:
    """Write the reweighting model into the artifact folder ``directory``; its config entry."""
    if isinstance(reweighter, PreTrainedModel):
        reweighter.save_pretrained(directory / "reweighter")
        return {"kind": "transformers"}
    if isinstance(reweighter, ContextFreeReweighter):
        save_model(reweighter, str(directory / "reweighter.safetensors"))
        hidden = reweighter.trunk_layers[0].out_features if isinstance(reweighter.trunk_layers, torch.nn.Sequential) else None
        return {"kind": "context-free", "vocab_size": reweighter.vocab_size,
                "embed_dim": reweighter.embed.embedding_dim, "hidden_size": hidden}
    raise ArtifactError(f"Cannot save a reweighting model of type {type(reweighter).__name__}: use a transformers "
                        "causal LM or one of plugin_lib.make_reweighter's architectures.")


def load_reweighter(directory: Path, spec: dict) -> torch.nn.Module:
    """The saved reweighting model (float32, eval), or one line naming the damaged file (a
    truncated weights file, an edited config)."""
    kind = spec.get("kind")
    where = directory / ("reweighter" if kind == "transformers" else "reweighter.safetensors")
    try:
        if kind == "transformers":
            return AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).eval()
        if kind == "context-free":
            model = ContextFreeReweighter(spec["vocab_size"], spec["embed_dim"], spec["hidden_size"])
            load_model(model, str(where))
            return model.eval()
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ArtifactError(f"{where}: the reweighting model cannot be loaded ({first[:300]}); the artifact is "
                            "damaged: write it again (plugin-repro train) or restore it.") from None
    raise ArtifactError(f"{directory}: unknown reweighter kind {kind!r}.")
