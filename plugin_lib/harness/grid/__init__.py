"""The paper grid as units of work, planned and run on this process, Ray or Slurm.

``plugin-repro grid plan|run --profile P [--only NB ...] [--executor local|ray|slurm]``
(``commands.grid``). The units (``units``) are records of the run store made by the notebooks' own
job lists; the plan (``plan``) gives their state, GPU memory and time, and the wall time on many
GPUs; the executors (``executors``) compute the pending ones. The notebooks then find every
record current and only aggregate. docs/scale.md.
"""
from .executors import EXECUTORS, MissingEngine, SlurmOptions, failures, run_local, run_ray, run_slurm
from .plan import Plan, make_plan, refresh, topological, with_needs
from .units import (BasePool, TaskRef, Unit, execute, finetune_unit, finetuned_ref, folder_key, is_done, merge,
                    planning_task,
                    table_units, task_units, worker_task)

__all__ = ["EXECUTORS", "BasePool", "MissingEngine", "Plan", "SlurmOptions", "TaskRef", "Unit", "execute", "failures", "is_done",
           "finetune_unit", "finetuned_ref", "folder_key", "make_plan", "merge", "planning_task", "refresh", "run_local", "run_ray",
           "run_slurm", "table_units", "task_units", "topological", "with_needs", "worker_task"]
