"""The paper grid as units of work, planned and run on this process, Ray or Slurm.

``python -m plugin_lib.harness.grid plan|run --profile P [--only NB ...] [--executor local|ray|slurm]``
(``__main__``). The units (``units``) are records of the run store made by the notebooks' own
job lists; the plan (``plan``) gives their state, GPU memory and time, and the wall time on many
GPUs; the executors (``executors``) compute the pending ones. The notebooks then find every
record current and only aggregate. docs/scale.md.
"""
from .executors import EXECUTORS, MissingEngine, SlurmOptions, run_local, run_ray, run_slurm
from .plan import Plan, make_plan, refresh, topological, with_needs
from .units import BasePool, TaskRef, Unit, execute, is_done, merge, table_units, task_units

__all__ = ["EXECUTORS", "BasePool", "MissingEngine", "Plan", "SlurmOptions", "TaskRef", "Unit", "execute", "is_done",
           "make_plan", "merge", "refresh", "run_local", "run_ray", "run_slurm", "table_units", "task_units",
           "topological", "with_needs"]
