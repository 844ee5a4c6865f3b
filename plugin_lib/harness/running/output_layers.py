"""A base's output layer on its own: saved once from the loaded base, loaded without the base.

A unit of the grid that trains a reweighting model from a stored base-output cache reads only
the base's output layer (``core.blackbox.OutputLayerBox``): LLaMA-3.1-8B's is 1 GiB of its
16 GiB, so a training process holding it leaves the GPU to others
(``harness.grid.executors``). :func:`save` writes the loaded model's layer as it is in memory
(the dtype the run loads it in) under the cache directory, once; :func:`load` reads it back,
and where it is not saved yet loads the whole base once to save it, under a lock, so that many
processes starting together load the base once. The file is keyed on what determines the
layer's values: the model's output spec (a Hub id, a twin's configuration and seed), the dtype,
the device type (a twin's seeded weights are drawn there) and the torch and transformers
versions (a twin's initialisation).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from ...core.blackbox import BlackBoxLM, OutputHead, OutputLayerBox
from ...utils.locks import StoreLock
from .. import machine, models

FOLDER = "output-layers"


def _root(name: str) -> tuple[str, tuple | None]:
    """(the model whose weights ``name`` runs on, its top-k view or None)."""
    view = models.parse_model_name(name)
    return (view[0], view[1:]) if view is not None else (name, None)


def has_weights(name: str) -> bool:
    """Whether ``name`` (or the base of its view) runs in this process: a model behind an API has no layer here."""
    return models.model_spec(_root(name)[0]).get("source") != "api"


def trains_from_cache(unit) -> bool:
    """Whether a unit of the grid (``grid.units.Unit``) only trains reweighting models from the
    stored base-output caches, so that its process needs the base's output layer and not the
    base: a search's configuration or selection, of any method but LoRA (which trains through
    the base), on a base with weights here that is not a fine-tuned one."""
    return (unit.kind in ("config", "selection") and unit.method != "LoRA" and unit.task.checkpoint is None
            and has_weights(unit.model))


def path(name: str, dtype: torch.dtype, device_type: str) -> Path:
    """Where the output layer of registry model (or Hub id) ``name`` is saved for ``dtype`` on ``device_type``."""
    key = json.dumps([models.output_spec(name), str(dtype), device_type, torch.__version__, transformers.__version__],
                     sort_keys=True, default=str)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return machine.cache_dir() / FOLDER / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"


def save(base: BlackBoxLM) -> Path | None:
    """Save the output layer of ``base`` (a loaded model, or a view of one) unless it is saved;
    its path, or None for a base whose outputs are not one linear layer."""
    head = base.output_head()
    if head is None:
        return None
    target = path(base.states_name, base.dtype, base.device.type)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"weight": head.weight.detach().cpu().contiguous()}
    if head.bias is not None:
        tensors["bias"] = head.bias.detach().cpu().contiguous()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp))
        os.replace(tmp, target)  # atomic: a killed save leaves no half-written layer under the final name
    finally:
        tmp.unlink(missing_ok=True)
    return target


def load(name: str, *, dtype: str | torch.dtype | None = None, device: torch.device | str | None = None
         ) -> OutputLayerBox:
    """The output layer of base ``name`` (a top-k view's: its base's, behind the view) on
    ``device`` in the dtype ``load_base_model`` would load it in, without the rest of the base."""
    root, view = _root(name)
    if not has_weights(root):
        raise ValueError(f"{name!r} is a model behind an API: it has no output layer in this process.")
    device = torch.device(device) if device is not None else machine.device()
    torch_dtype = models.resolve_dtype(root, dtype, device)
    target = path(root, torch_dtype, device.type)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with StoreLock(target.parent / ".locks" / f"{target.stem}.lock"):
            if not target.exists():  # another process saved it while this one waited
                base = models.load_base_model(root, dtype=torch_dtype, device=device)
                save(base)
                del base
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    tensors = load_file(str(target), device=str(device))
    box = OutputLayerBox(OutputHead(tensors["weight"], tensors.get("bias")), models.load_tokenizer(root), root)
    return OutputLayerBox.top_k_view(box, view[0], view[1], name=name) if view is not None else box
