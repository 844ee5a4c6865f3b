"""The paper grid as units of work, planned and run on this process, Ray or Slurm.

``plugin-repro grid plan|run --profile P [--only NB ...] [--executor local|ray|slurm]``
(``commands.grid``). The units (``units``) are records of the run store made by the notebooks' own
job lists; the plan (``plan``) gives their state, GPU memory and time, and the wall time on many
GPUs; the executors (``executors``) compute the pending ones. The notebooks then find every
record current and only aggregate. docs/scale.md.

Names load from their modules on first use: the modules import torch and the base models, and a
command's parser (``--executor`` offers ``EXECUTORS``) or ``python -m`` of this package must not wait
for them.
"""
from __future__ import annotations

import importlib

EXECUTORS = ("local", "ray", "slurm")

_EXPORTS = {
    **dict.fromkeys(("MissingEngine", "SlurmOptions", "failures", "run_local", "run_ray", "run_slurm"), "executors"),
    **dict.fromkeys(("Plan", "make_plan", "refresh", "topological", "with_needs"), "plan"),
    **dict.fromkeys(("BasePool", "TaskRef", "Unit", "execute", "finetune_unit", "finetuned_ref", "folder_key",
                     "is_done", "merge", "planning_task", "table_units", "task_units", "worker_task"), "units"),
}

__all__ = sorted(["EXECUTORS", *_EXPORTS])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
