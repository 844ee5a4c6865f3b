"""Reproduces everything: every numbered notebook in notebooks/, in order, with papermill.

  plugin-repro run  (or: bash run_all.sh, which first builds .venv)
  --profile NAME     one of the profiles below (default with a CUDA GPU and the Hub: colab on Colab, else paper;
                     without: local)
  --force            re-run notebooks that already finished
  --only 01          only notebooks whose name starts with 01
  --no-fetch         do not download missing data; stop instead
  --executor ray     first compute the notebooks' units (local, ray or slurm: plugin-repro grid run;
                     its options, e.g. --address auto or --partition gpu, in PLUGIN_GRID_ARGS), then
                     run the notebooks, which find the records and aggregate; local and ray run
                     several trainings at once on a GPU (the profile's trainings_at_once)
Profiles (plugin_lib/harness/profiles.yaml; disk and time as measured, docs/profiles.md):
  local       the committed CPU-scale results (SmolLM2-135M); current ones are skipped in seconds
  smoke       every code path in minutes on a CPU (about 5 GiB of disk)
  paper-twin  the paper profile's code path on small random twins of its bases (CPU, ~15 GiB)
  confirm     the preregistered confirmation on fresh test inputs (docs/preregistration.md)
  paper       the paper's scale: a CUDA GPU (80 GB), the Hugging Face Hub and about 40 GiB of
              disk (the preflight prints the plan and stops on a machine that cannot run it)
  colab       the paper's GPT-2 bases scaled to one Colab T4 session per notebook (docs/colab.md)
Executed notebooks, stamps and logs go to results/<profile>/executed and .../logs
(PLUGIN_RESULTS_DIR/<profile>/... when PLUGIN_RESULTS_DIR is set; on Colab with Drive mounted,
paper and colab go to Drive).
- The data come first: missing files are downloaded (plugin-repro data fetch), then everything is
  checked (plugin-repro data check); data that cannot be fetched stop the call, saying what to do.
- A notebook is skipped when its stamp matches: the notebook, its parameters, the profile's
  settings and the code version (plugin-repro stamp). Inside a notebook finished runs are
  skipped too, so an interrupted call resumes.
- Before any stamp, every stored run record is checked against the store's manifest
  (results/<profile>/RECORDS.sha256), and its metrics against its own predictions (scored again
  once per machine): a damaged, edited or unlisted record stops the call, named.
- papermill (its Python API, here; each notebook's kernel is a process of its own) writes to a
  temporary file, moved into place only on success: a failed notebook
  leaves the last executed notebook and its stamp as they were and <name>.failed.ipynb beside
  them; the report is written only when every notebook finished, the README's results block only
  by a complete --profile local run. A notebook that skips its study for want of an optional
  engine (14 without llama-cpp-python's server) keeps the last execution that ran it.
- A paper or colab run prints its preflight plan first and stops when the GPU memory or the disk
  will not do; every other profile checks the disk the notebooks still to run may write.
- One call per profile at a time (a lock in results/<profile>): a second call refuses at once.
Exit status (as every command's, README "Exit statuses"): 0 done, 1 a notebook or the data check
failed, 2 bad arguments or profiles.yaml, 3 another call holds the profile, 4 a damaged stored run
record, 5 an edited one (or metrics its predictions do not give), 6 one the store did not write,
129/130/143 interrupted.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..harness import machine
from ..harness import profile as config
from ..harness.profile import REPO_ROOT, Profile
from ..utils import malloc
from ..utils.io import reap_tree
from ..utils.locks import StoreLock

# The name the user called it by, in every message: run_all.sh says so (PLUGIN_RUN_COMMAND).
PROG = os.environ.get("PLUGIN_RUN_COMMAND", "plugin-repro run")
EXECUTORS = ("local", "ray", "slurm")


class Stop(Exception):
    """Ends the call: ``message`` on stderr (after ``PROG: ``), ``status`` the exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


class Interrupted(BaseException):
    """A signal ended the call. Not an Exception, as KeyboardInterrupt is not: the libraries the
    call runs in (papermill, the grid's executors) catch their errors, and must not catch this."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Options:
    profile: str = ""
    only: str = ""
    executor: str = ""
    force: bool = False
    fetch: bool = True


def parse(argv: list[str]) -> Options:
    """The options; a missing value or an unknown argument stops with status 2."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, exit_on_error=False)
    for name in ("--profile", "--only", "--executor"):
        parser.add_argument(name, default="")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--no-fetch", dest="fetch", action="store_false")
    parser.add_argument("-h", "--help", action="store_true")
    example = {"--profile": "smoke", "--executor": "ray", "--only": "01"}
    try:
        args, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as err:
        option = err.argument_name.split("/")[0] if err.argument_name else "--profile"
        raise Stop(f"{option} needs a value, e.g. '{option} {example.get(option, '01')}' (see --help)", 2) from None
    if unknown:
        raise Stop(f"unknown argument '{unknown[0]}' (see --help)", 2)
    if args.help:
        print(__doc__.strip())
        raise SystemExit(0)
    for option, value in (("--profile", args.profile), ("--only", args.only), ("--executor", args.executor)):
        given = any(a == option or a.startswith(option + "=") for a in argv)
        if given and (not value or value.startswith("-")):
            raise Stop(f"{option} needs a value, e.g. '{option} {example[option]}' (see --help)", 2)
    return Options(args.profile, args.only, args.executor, args.force, args.fetch)


def main(argv: list[str] | None = None) -> int:
    try:
        return Orchestrator(parse(sys.argv[1:] if argv is None else list(argv))).run()
    except Stop as stop:
        print(f"{PROG}: {stop}", file=sys.stderr)
        return stop.status
    except config.ProfileError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2


class Orchestrator:
    """One call: arguments, data, preflight, lock, stamps, disk, units, notebooks, report; each
    step a call of the package's own, in this process."""

    def __init__(self, options: Options):
        self.options = options
        self.profile: Profile | None = None  # the profile of this call, once chosen
        self.executed = None  # its ExecutedFolder, once the lock is held

    # ------------------------------------------------------------------ the call
    def run(self) -> int:
        self._environment()
        profile = self.profile = self._profile()
        studies = self._studies()
        self.out = self._results_folder(profile)
        lock = StoreLock(self.out / ".run_all.lock")
        if self.out.is_dir() and lock.busy():  # a quick look first: creates nothing
            self._refuse()
        self._data(profile)
        self._preflight(profile)
        self._make_results_folder()
        if not lock.acquire(blocking=False):
            self._refuse()
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return self._under_lock(profile, studies)
        except Interrupted as sig:
            print(f"[run] interrupted by {sig}: the notebook that was running is not stored; the last "
                  "finished one is kept.", file=sys.stderr)
            return 128 + sig.signum
        finally:
            self._cleanup()
            lock.release()
            for s, handler in handlers.items():
                signal.signal(s, handler)

    def _under_lock(self, profile: Profile, studies: list) -> int:
        from . import stamp
        from .executed_folder import ExecutedFolder

        self.executed = ExecutedFolder(self.out, self.shown, profile.name, force=self.options.force)
        self.executed.prepare()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self._reap()
        status = stamp.check_records(profile.name)  # a bad record stops here, named (stamp's 4, 5, 6)
        if status:
            raise SystemExit(status)
        wanted = self._stamps(profile, studies)
        to_run = [s.notebook for s in studies if not self.executed.finished(s.notebook, wanted[s.notebook])]
        if to_run and profile.name not in config.GPU_PROFILES and not _skip_preflight():
            from . import preflight

            if preflight.main(["--profile", profile.name, "--disk-only", *to_run]):
                raise Stop("the preflight's disk check stopped the run (its reason is above); nothing was run. "
                           "PLUGIN_SKIP_PREFLIGHT=1 runs anyway.")
        if self.options.executor:
            self._units(profile)
        started = time.monotonic()
        for i, study in enumerate(studies, 1):
            self.executed.execute(study.notebook, wanted[study.notebook], f"({i}/{len(studies)})")
        print(f"[run] all {len(studies)} notebooks finished for profile '{profile.name}' in "
              f"{time.monotonic() - started:.0f} s", flush=True)
        self._after(profile)
        return 0

    # ------------------------------------------------------------------ before the lock
    def _environment(self) -> None:
        """The notebooks' kernels import this checkout's plugin_lib, with glibc's allocator set
        for tensors; paths are the checkout's."""
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        os.environ.setdefault("GLIBC_TUNABLES", malloc.tunables(os.environ.get("GLIBC_TUNABLES")))
        os.chdir(REPO_ROOT)

    def _profile(self) -> Profile:
        name = self.options.profile
        if not name:
            name = machine.auto_profile()
            print(f"[run] profile: {name} (chosen automatically; --profile overrides)", flush=True)
        if name not in config.profile_names():
            raise Stop(f"unknown profile {name!r}; choose one of: {', '.join(config.profile_names())}", 2)
        profile = config.load_profile(name)  # a wrong field stops here, in one line
        if self.options.executor and self.options.executor not in EXECUTORS:
            raise Stop(f"unknown executor '{self.options.executor}'; choose local, ray or slurm (see --help)", 2)
        return profile

    def _studies(self) -> list:
        """The registry's studies whose notebooks start with ``--only``, each notebook on disk."""
        from . import studies

        chosen = [s for s in studies.STUDIES if s.notebook.startswith(self.options.only)]
        if not chosen:
            listed = "\n".join(f"  {name}" for name in studies.NOTEBOOKS)
            raise Stop(f"no notebook name starts with '{self.options.only}'. The notebooks are:\n{listed}", 2)
        missing = [s.notebook for s in chosen if not s.path.is_file()]
        if missing:
            raise Stop(f"the registry's notebook(s) {', '.join(missing)} are not in {REPO_ROOT / 'notebooks'}: "
                       "restore them from git (git checkout -- notebooks)")
        return chosen

    def _results_folder(self, profile: Profile) -> Path:
        """``machine.results_path``, made absolute; its parent is exported as PLUGIN_RESULTS_DIR so
        that the notebooks' kernels, started elsewhere, write there too."""
        out = machine.results_path(profile).absolute()
        os.environ["PLUGIN_RESULTS_DIR"] = str(out.parent)
        return out

    @property
    def shown(self) -> str:
        """The results folder for messages: results/<profile> inside this checkout."""
        try:
            return str(self.out.relative_to(REPO_ROOT))
        except ValueError:
            return str(self.out)

    def _refuse(self) -> None:
        raise Stop(f"another run (run_all.sh or plugin-repro run) is already running for profile "
                   f"'{self.profile.name}' (it holds {self.shown}/.run_all.lock). Wait for it to finish or stop it, "
                   "then call again.", 3)

    def _data(self, profile: Profile) -> None:
        """Missing, truncated or malformed data stop the call here, before anything is written:
        every group with all notebooks, the chosen studies' groups with ``--only``."""
        from ..data import check, fetch, files
        from . import studies

        groups = studies.data_groups([self.options.only]) if self.options.only else []
        if self.options.only and not groups:
            print(f"[run] the notebooks starting with '{self.options.only}' read no data", flush=True)
            return
        only = [arg for group in groups for arg in ("--only", group)]
        print(f"[run] checking the data of profile '{profile.name}'", flush=True)
        check_args = ["--profile", profile.name, *only]
        if check.main(check_args, profiles=config.profile_names()) == 0:
            return
        if not self.options.fetch or files.reads_hub():  # the Hub is not downloaded into a folder
            raise Stop(f"the data of profile '{profile.name}' are not ready (see above); nothing was run or written.")
        print("[run] fetching the missing data (plugin-repro data fetch; --no-fetch skips this)", flush=True)
        fetch.main(only)  # says what it could not get; the check decides
        if check.main(check_args, profiles=config.profile_names()):
            raise Stop(f"the data of profile '{profile.name}' are still not ready (see above); nothing was run.")

    def _preflight(self, profile: Profile) -> None:
        """The GPU profiles' plan before GPU-days are spent; it stops the call when memory or disk
        will not do (PLUGIN_SKIP_PREFLIGHT=1 skips it, e.g. a resumed run that saw it)."""
        if profile.name not in config.GPU_PROFILES or _skip_preflight():
            return
        from . import preflight

        print(f"[run] preflight of profile '{profile.name}' (PLUGIN_SKIP_PREFLIGHT=1 skips it)", flush=True)
        only = ["--only", self.options.only] if self.options.only else []
        if preflight.main(["--profile", profile.name, *only]):
            raise Stop(f"the preflight says profile '{profile.name}' will not fit on this machine (see WILL NOT FIT "
                       "above); nothing was run or written.")

    def _make_results_folder(self) -> None:
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise Stop(f"cannot write the results folder {self.shown} ({err.strerror}): set PLUGIN_RESULTS_DIR to "
                       "a writable folder; nothing was run.") from None
        if not os.access(self.out, os.W_OK):
            read_only = bool(os.statvfs(self.out).f_flag & os.ST_RDONLY)
            raise Stop(f"cannot write the results folder {self.shown} ("
                       f"{'its file system is mounted read-only' if read_only else 'permission denied'}): set "
                       "PLUGIN_RESULTS_DIR to a writable folder; nothing was run.")

    # ------------------------------------------------------------------ under the lock
    def _reap(self) -> None:
        """What killed writers left (atomic writes' .tmp, caches' .partial)."""
        try:
            roots = [self.out, machine.cache_dir()]
        except machine.CacheDirError as err:
            raise Stop(str(err)) from None
        removed = [path for root in roots for path in reap_tree(root)]
        if removed:
            print(f"[run] removed {len(removed)} temporary file(s) that killed writers left, e.g. {removed[0]}",
                  flush=True)

    def _stamps(self, profile: Profile, studies: list) -> dict[str, str]:
        """Each notebook's stamp (``commands.stamp``: the notebook, its parameter, the profile,
        the code, the data)."""
        from . import stamp

        code, data = stamp.code_version(), stamp.data_state()
        return {s.notebook: stamp.stamp(s.path.relative_to(REPO_ROOT), profile.name, code=code, data=data)
                for s in studies}

    def _units(self, profile: Profile) -> None:
        """The units first, on the chosen executor (docs/scale.md), in this process; what it and
        its workers print goes to the screen and to logs/grid.log."""
        from . import grid
        from .execution import output_copied_to, release_grid_memory

        executor, log = self.options.executor, self.out / "logs" / "grid.log"
        print(f"[run] computing the notebooks' units with the {executor} executor (log: {self.shown}/logs/grid.log)",
              flush=True)
        only = ["--only", self.options.only] if self.options.only else []
        extra = os.environ.get("PLUGIN_GRID_ARGS", "").split()
        log.write_text("")
        try:
            with output_copied_to(log):
                status = grid.main(["run", "--profile", profile.name, "--executor", executor, *only, *extra])
        except SystemExit as stopped:  # the grid's own SIGTERM handling (its executors clean up first), or its usage
            code = stopped.code if isinstance(stopped.code, int) else 2
            if code > 128:
                raise Interrupted(code - 128) from None
            status = code
        if status == 2:  # the engine is missing (or the arguments are wrong): nothing ran
            raise Stop(f"the {executor} executor could not start (see above); nothing was computed.", 2)
        if status:
            raise Stop(f"the grid did not finish (see {self.shown}/logs/grid.log); finished units are stored, so a "
                       "rerun resumes.")
        release_grid_memory()
        (self.out / "logs" / "grid.done").touch()  # the notebooks should write no run record after this

    def _after(self, profile: Profile) -> None:
        """The report once every chosen notebook finished; the README shows a complete local run
        only; a preregistered profile's claims judged by the frozen rules."""
        from . import confirmation, document

        if self.options.executor:  # the grid computed the units: the notebooks should only have read them
            done = (self.out / "logs" / "grid.done").stat().st_mtime
            late = sum(1 for pattern in ("*-seed*.json", "*-selection.json") for p in (self.out / "runs").rglob(pattern)
                       if p.stat().st_mtime > done)
            print(f"[run] run records the notebooks wrote after the grid: {late} (0: they only aggregated)")
        readme = profile.name == "local" and not self.options.only and self.out.parent == REPO_ROOT / "results"
        if profile.name == "local" and not readme:
            print("[run] README.md not refreshed: it shows a complete 'local' run of every notebook into results/.")
        sys.stdout.flush()
        if not self.options.only and profile.test_inputs is not None:
            confirmation.main(["judge"])
        print(document.write_report(profile))
        if readme:
            print(document.update_readme(profile))

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum, frame) -> None:
        from .execution import stop_children

        stop_children()  # a kernel or a worker must not compute on without us
        raise Interrupted(signum)

    def _cleanup(self) -> None:
        """The children still running, the temporary notebook."""
        from .execution import stop_children

        stop_children()
        if self.executed is not None:
            self.executed.discard()


def _skip_preflight() -> bool:
    return os.environ.get("PLUGIN_SKIP_PREFLIGHT", "0") == "1"


if __name__ == "__main__":
    malloc.restart_with_tunables()  # the grid computes in this process
    sys.exit(main())
