"""What keys a stored run and a grid search (``harness.running.runner`` stores them).

- The grid: its hyperparameters per method (``grid_keys``), every configuration
  (``hparam_grid``; the step past an edge where a choice sits is ``core.grid_search.beyond_edge``),
  and a configuration's name in a selection record (``config_tag``).
- A stored run counts only if its ``settings`` (:func:`settings_fingerprint`: the profile's
  settings that shape it) and its ``inputs`` (:func:`inputs_fingerprint`: every example's id,
  source and references, and the base's spec) both match the current ones (:func:`is_current`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from ... import data
from ...core.grid_search import configurations
from .. import methods, models, tasks
from .. import machine
from ..profile import Profile


def grid_keys(method: str) -> list[str]:
    return ["lr", "weight_decay"] + (["alpha"] if method == "WeightedComb" else [])


def hparam_grid(profile: Profile, method: str, values: dict[str, list[float]] | None = None) -> list[dict]:
    """Every configuration of the profile's grid (or of ``values``, one list per key)."""
    values = values or {k: list(getattr(profile.grid, k)) for k in grid_keys(method)}
    return configurations({k: values[k] for k in grid_keys(method)})


def config_tag(hparams: dict) -> str:
    """A configuration's key in a selection record and its unit's name, e.g. "lr=0.001-weight_decay=1"."""
    return "-".join(f"{k}={v:g}" for k, v in sorted(hparams.items()))


def settings_fingerprint(task: tasks.Task, profile: Profile, arch: dict | None = None,
                         method: str | None = None) -> str:
    """The settings a stored run depends on; a run stored under other settings is redone.
    (The data it depends on: :func:`inputs_fingerprint`.) ``method`` "TempNet" adds the task's
    TempNet settings, which no other method's runs depend on."""
    relevant = {k: profile.section(k) for k in ("rows", "tokens", "training", "grid", "decoding")}
    if not relevant["grid"]["extend_edges"]:
        del relevant["grid"]["extend_edges"]  # 0 is the grid as listed: runs made before the option stay current
    if relevant["grid"]["search"] == "grid":
        del relevant["grid"]["search"]  # likewise: the full grid is how every earlier run searched
    if method == "TempNet":
        tempnet = dataclasses.asdict(tasks.tempnet_settings(task))
        # Runs made before these options existed had one temperature per input and none on top.
        if tempnet["per"] == "input" and tempnet["temperature"] == 1.0:
            del tempnet["per"], tempnet["temperature"]
        relevant["tempnet"] = tempnet
    if method in methods.PROXY_ARMS:
        # what shapes a proxy run; which arms the notebook runs (``proxy.pretrained``) does not
        relevant["proxy"] = {k: v for k, v in profile.section("proxy").items() if k in ("alphas", "top_p")}
    relevant.update(dataset=task.dataset, model=models.output_spec(task.base.name),
                    chat_template=task.use_chat_template)
    if task.prompt_prefix:
        relevant["prompt_prefix"] = task.prompt_prefix
    # Only a style other than "appendix" enters the hash: the runs made before the choice
    # existed used the appendix prompts, and those records (results/local) stay current.
    if task.prompt_style != "appendix":
        relevant["prompts"] = task.prompt_style
    if arch is not None:
        relevant["arch"] = _machine_free(arch)
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _machine_free(arch: dict) -> dict:
    """``arch`` with a pretrained reweighting model saved under the cache directory named by its
    place there, not by this machine's path (PLUGIN_CACHE_DIR, HOME): a fresh clone elsewhere
    finds the run current."""
    pretrained = arch.get("pretrained")
    if not pretrained or not Path(pretrained).is_absolute():
        return arch
    try:
        inside = Path(pretrained).resolve().relative_to(machine.cache_dir().resolve())
    except ValueError:
        return arch
    return {**arch, "pretrained": f"<cache>/{inside.as_posix()}"}


def examples_fingerprint(model: str, train: Sequence[data.Example], hyper: Sequence[data.Example],
                         test: Sequence[data.Example]) -> str:
    """A hash of the data a run of ``model`` on these splits depends on: each example's id,
    source and references, in order, and the base model's spec (:func:`models.output_spec`)."""
    payload = {"base": models.output_spec(model)}
    for name, split in (("train", train), ("hyper", hyper), ("test", test)):
        payload[name] = [[ex.id, ex.source, list(ex.references)] for ex in split]
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def inputs_fingerprint(task: tasks.Task) -> str:
    """:func:`examples_fingerprint` of the task (stored in each record as ``inputs``)."""
    if "inputs" not in task._memo:
        task._memo["inputs"] = examples_fingerprint(task.base.name, task.train, task.hyper, task.test)
    return task._memo["inputs"]


def is_current(record: dict, fingerprint: str, inputs: str) -> bool:
    """Whether a stored record was made under these settings from these inputs."""
    return record.get("settings") == fingerprint and record.get("inputs") == inputs
