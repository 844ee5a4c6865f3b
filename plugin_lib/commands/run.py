"""Reproduces everything: every numbered notebook in notebooks/, in order, with papermill.

  plugin-repro run  (or: bash run_all.sh, which first builds .venv)
  --profile NAME     one of the profiles below (default: paper with a CUDA GPU and the Hub, else local)
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
  settings and the code version (scripts/run_stamp.py). Inside a notebook finished runs are
  skipped too, so an interrupted call resumes.
- Before any stamp, every stored run record is checked against the store's manifest
  (results/<profile>/RECORDS.sha256), and its metrics against its own predictions (scored again
  once per machine): a damaged, edited or unlisted record stops the call, named.
- papermill writes to a temporary file, moved into place only on success: a failed notebook
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
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..harness import profile as config
from ..harness.profile import REPO_ROOT
from ..utils import malloc
from ..utils.io import read_json, reap_tree
from ..utils.locks import StoreLock

# The name the user called it by, in every message: run_all.sh says so (PLUGIN_RUN_COMMAND).
PROG = os.environ.get("PLUGIN_RUN_COMMAND", "plugin-repro run")
EXECUTORS = ("local", "ray", "slurm")


class Stop(Exception):
    """Ends the call: ``message`` on stderr (after ``PROG: ``), ``status`` the exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


class Interrupted(Exception):
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
    """One call: arguments, data, preflight, lock, stamps, disk, units, notebooks, report."""

    def __init__(self, options: Options):
        self.options = options
        self.profile = ""  # the profile of this call, once chosen
        self.py = sys.executable
        self.child: subprocess.Popen | None = None
        self.temporary: Path | None = None

    # ------------------------------------------------------------------ the call
    def run(self) -> int:
        self._environment()
        profile = self.profile = self._profile()
        notebooks = self._notebooks()
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
            return self._under_lock(profile, notebooks)
        except Interrupted as sig:
            print(f"[run] interrupted by {sig}: the notebook that was running is not stored; the last "
                  "finished one is kept.", file=sys.stderr)
            return 128 + sig.signum
        finally:
            self._cleanup()
            lock.release()
            for s, handler in handlers.items():
                signal.signal(s, handler)

    def _under_lock(self, profile: str, notebooks: list[Path]) -> int:
        executed, logs = self.out / "executed", self.out / "logs"
        executed.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        for left in executed.glob(".*.running.*.ipynb"):  # a run killed outright (we hold the lock)
            left.unlink(missing_ok=True)
        self._reap()
        self.mode = 0o666 & ~_umask()
        wanted = self._stamps(profile, notebooks)
        to_run = [nb.stem for nb in notebooks if not self._finished(nb, wanted[nb])]
        if to_run and profile not in config.GPU_PROFILES and not _skip_preflight():
            if self._call(["-m", "plugin_lib.commands.preflight", "--profile", profile, "--disk-only", *to_run]):
                raise Stop("the preflight's disk check stopped the run (its reason is above); nothing was run. "
                           "PLUGIN_SKIP_PREFLIGHT=1 runs anyway.")
        if self.options.executor:
            self._units(profile)
        started = time.monotonic()
        for i, notebook in enumerate(notebooks, 1):
            self._notebook(notebook, wanted[notebook], f"({i}/{len(notebooks)})")
        print(f"[run] all {len(notebooks)} notebooks finished for profile '{profile}' in "
              f"{time.monotonic() - started:.0f} s", flush=True)
        self._after(profile)
        return 0

    # ------------------------------------------------------------------ before the lock
    def _environment(self) -> None:
        """Children import this checkout's plugin_lib, with glibc's allocator set for tensors."""
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        os.environ.setdefault("GLIBC_TUNABLES", malloc.tunables(os.environ.get("GLIBC_TUNABLES")))
        os.chdir(REPO_ROOT)

    def _profile(self) -> str:
        profile = self.options.profile
        if not profile:
            profile = config.auto_profile()
            print(f"[run] profile: {profile} (chosen automatically; --profile overrides)", flush=True)
        if profile not in config.profile_names():
            raise Stop(f"unknown profile {profile!r}; choose one of: {', '.join(config.profile_names())}", 2)
        config.load_profile(profile)  # a wrong field stops here, in one line, before any child reads it
        if self.options.executor and self.options.executor not in EXECUTORS:
            raise Stop(f"unknown executor '{self.options.executor}'; choose local, ray or slurm (see --help)", 2)
        return profile

    def _notebooks(self) -> list[Path]:
        every = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        if not every:
            raise Stop(f"no numbered notebook in {REPO_ROOT / 'notebooks'}")
        chosen = [nb for nb in every if nb.name.startswith(self.options.only)]
        if not chosen:
            listed = "\n".join(f"  {nb.stem}" for nb in every)
            raise Stop(f"no notebook name starts with '{self.options.only}'. The notebooks are:\n{listed}", 2)
        return chosen

    def _results_folder(self, profile: str) -> Path:
        """``PLUGIN_RESULTS_DIR`` (made absolute, for the notebooks), else Drive's for the GPU
        profiles on Colab (``profile.drive_dir``, the cache beside it), else results/."""
        given = os.environ.get("PLUGIN_RESULTS_DIR")
        drive = config.drive_dir()
        if not given and drive is not None and profile in config.DRIVE_PROFILES:
            root = drive / "results"
            os.environ.setdefault("PLUGIN_CACHE_DIR", str(drive / "cache"))
        else:
            root = Path(given) if given else REPO_ROOT / "results"
        root = root.absolute()
        os.environ["PLUGIN_RESULTS_DIR"] = str(root)
        return root / profile

    @property
    def shown(self) -> str:
        """The results folder for messages: results/<profile> inside this checkout."""
        try:
            return str(self.out.relative_to(REPO_ROOT))
        except ValueError:
            return str(self.out)

    def _refuse(self) -> None:
        raise Stop(f"another run (run_all.sh or plugin-repro run) is already running for profile '{self.profile}' (it holds "
                   f"{self.shown}/.run_all.lock). Wait for it to finish or stop it, then call again.", 3)

    def _data(self, profile: str) -> None:
        """Missing, truncated or malformed data stop the call here, before anything is written."""
        print(f"[run] checking the data of profile '{profile}'", flush=True)
        if self._call(["-m", "plugin_lib.data.check", "--profile", profile]) == 0:
            return
        if not self.options.fetch or os.environ.get("PLUGIN_DATA_DIR") == "hub":
            raise Stop(f"the data of profile '{profile}' are not ready (see above); nothing was run or written.")
        print("[run] fetching the missing data (plugin-repro data fetch; --no-fetch skips this)", flush=True)
        self._call(["-m", "plugin_lib.data.fetch"])  # says what it could not get; the check decides
        if self._call(["-m", "plugin_lib.data.check", "--profile", profile]):
            raise Stop(f"the data of profile '{profile}' are still not ready (see above); nothing was run.")

    def _preflight(self, profile: str) -> None:
        """The GPU profiles' plan before GPU-days are spent; it stops the call when memory or disk
        will not do (PLUGIN_SKIP_PREFLIGHT=1 skips it, e.g. a resumed run that saw it)."""
        if profile not in config.GPU_PROFILES or _skip_preflight():
            return
        print(f"[run] preflight of profile '{profile}' (PLUGIN_SKIP_PREFLIGHT=1 skips it)", flush=True)
        only = ["--only", self.options.only] if self.options.only else []
        if self._call(["-m", "plugin_lib.commands.preflight", "--profile", profile, *only]):
            raise Stop(f"the preflight says profile '{profile}' will not fit on this machine (see WILL NOT FIT "
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
            roots = [self.out, config.cache_dir()]
        except config.CacheDirError as err:
            raise Stop(str(err)) from None
        removed = [path for root in roots for path in reap_tree(root)]
        if removed:
            print(f"[run] removed {len(removed)} temporary file(s) that killed writers left, e.g. {removed[0]}",
                  flush=True)

    def _stamps(self, profile: str, notebooks: list[Path]) -> dict[Path, str]:
        """Each notebook's stamp; the stored run records are checked first (run_stamp.py's status
        is this call's: 4, 5, 6)."""
        found = subprocess.run([self.py, str(REPO_ROOT / "scripts" / "run_stamp.py"), "--profile", profile,
                                *(str(nb.relative_to(REPO_ROOT)) for nb in notebooks)], stdout=subprocess.PIPE,
                               text=True)
        if found.returncode:
            raise SystemExit(found.returncode)
        stamps = dict(reversed(line.split(None, 1)) for line in found.stdout.splitlines() if line.strip())
        return {nb: stamps[str(nb.relative_to(REPO_ROOT))] for nb in notebooks}

    def _finished(self, notebook: Path, wanted: str) -> bool:
        stamp, final = self.out / "executed" / f"{notebook.stem}.done", self.out / "executed" / f"{notebook.stem}.ipynb"
        return (not self.options.force and stamp.is_file() and final.is_file()
                and stamp.read_text().strip() == wanted)

    def _units(self, profile: str) -> None:
        """The units first, on the chosen executor (docs/scale.md); its lines go to the screen
        and to logs/grid.log."""
        executor, log = self.options.executor, self.out / "logs" / "grid.log"
        print(f"[run] computing the notebooks' units with the {executor} executor (log: {self.shown}/logs/grid.log)",
              flush=True)
        only = ["--only", self.options.only] if self.options.only else []
        extra = os.environ.get("PLUGIN_GRID_ARGS", "").split()
        command = [self.py, "-m", "plugin_lib", "grid", "run", "--profile", profile, "--executor", executor, *only, *extra]
        with open(log, "w", encoding="utf-8") as copy:
            self.child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in self.child.stdout:
                sys.stdout.write(line)
                copy.write(line)
            status, self.child = self.child.wait(), None
        sys.stdout.flush()
        if status == 2:  # the engine is missing (or the arguments are wrong): nothing ran
            raise Stop(f"the {executor} executor could not start (see above); nothing was computed.", 2)
        if status:
            raise Stop(f"the grid did not finish (see {self.shown}/logs/grid.log); finished units are stored, so a "
                       "rerun resumes.")
        (self.out / "logs" / "grid.done").touch()  # the notebooks should write no run record after this

    def _notebook(self, notebook: Path, wanted: str, count: str) -> None:
        """Run one notebook with papermill into a temporary file, moved into place on success."""
        name, executed = notebook.stem, self.out / "executed"
        final, failed, stamp = executed / f"{name}.ipynb", executed / f"{name}.failed.ipynb", executed / f"{name}.done"
        if self._finished(notebook, wanted):
            print(f"[run] {count} {name}: already finished, skipped (--force re-runs it)", flush=True)
            return
        log = self.out / "logs" / f"{name}.log"
        print(f"[run] {count} {name}: running (log: {self.shown}/logs/{name}.log)", flush=True)
        started, skips_before = time.monotonic(), self._skips()
        self.temporary = executed / f".{name}.running.{os.getpid()}.ipynb"
        with open(log, "w", encoding="utf-8") as out:
            self.child = subprocess.Popen(
                [self.py, "-m", "papermill", str(notebook), str(self.temporary), "-p", "profile", self.profile,
                 "--cwd", str(REPO_ROOT / "notebooks"), "--log-output", "--no-progress-bar"],
                stdout=out, stderr=subprocess.STDOUT)
            status, self.child = self.child.wait(), None
        if status == 0 and self._strip(self.temporary, log) == 0:
            if self._kept_real_execution(name, final, skips_before, count):
                return
            self.temporary.chmod(self.mode)
            os.replace(self.temporary, final)
            self.temporary = None
            failed.unlink(missing_ok=True)
            seconds = round(time.monotonic() - started)
            with open(executed / f"{name}.seconds", "a", encoding="utf-8") as f:  # one line per execution
                f.write(f"{seconds}\n")
            written = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
            written.write_text(wanted + "\n")
            written.chmod(self.mode)
            os.replace(written, stamp)
            print(f"[run] {count} {name}: done in {seconds} s", flush=True)
            return
        self._failed(name, log, final, failed)

    def _skips(self) -> dict[Path, float]:
        """The notebooks' records of what they skipped (report.writer.save_skip), with their times."""
        return {path: path.stat().st_mtime for path in (self.out / "skipped").glob("*.json")}

    def _kept_real_execution(self, name: str, final: Path, skips_before: dict[Path, float], count: str) -> bool:
        """A notebook that skipped its study for want of an optional engine (notebook 14 without
        llama-cpp-python's server) does not replace a last execution that ran it: that execution,
        its results and its stamp stay, and the new skip records go. True when so."""
        new = [path for path, when in self._skips().items() if skips_before.get(path) != when]
        if not new or not final.is_file() or any(path in skips_before for path in new):
            return False
        reasons = "; ".join(read_json(path).get("reason", "") for path in new)
        for path in new:
            path.unlink(missing_ok=True)
        self.temporary.unlink(missing_ok=True)
        self.temporary = None
        print(f"[run] {count} {name}: skipped its study ({reasons}); the last execution that ran it, "
              f"{self.shown}/executed/{name}.ipynb, and its results are kept, and its stamp stays stale", flush=True)
        return True

    def _failed(self, name: str, log: Path, final: Path, failed: Path) -> None:
        """The last executed notebook and its stamp stay; this attempt is kept as <name>.failed.ipynb."""
        if self.temporary is not None and self.temporary.exists() and self.temporary.stat().st_size:
            self._strip(self.temporary, None)
            self.temporary.chmod(self.mode)
            os.replace(self.temporary, failed)
        else:
            if self.temporary is not None:
                self.temporary.unlink(missing_ok=True)
            failed.unlink(missing_ok=True)
        self.temporary = None
        print(f"[run] FAILED: {name}. Its error:", file=sys.stderr)
        error = subprocess.run([self.py, str(REPO_ROOT / "scripts" / "notebook_error.py"), str(log)],
                               capture_output=True, text=True)
        text = error.stdout if error.returncode == 0 else "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        print("\n".join(f"    {line}" for line in text.splitlines()), file=sys.stderr)
        print(f"[run] Full log: {self.shown}/logs/{name}.log", file=sys.stderr)
        if failed.exists():
            print(f"[run] The failed notebook: {self.shown}/executed/{name}.failed.ipynb", file=sys.stderr)
        if final.exists():
            print(f"[run] {self.shown}/executed/{name}.ipynb (the last finished execution) is unchanged; nothing "
                  "else was written.", file=sys.stderr)
        raise SystemExit(1)

    def _strip(self, path: Path, log: Path | None) -> int:
        with open(log, "a", encoding="utf-8") if log else open(os.devnull, "w") as out:
            return subprocess.run([self.py, str(REPO_ROOT / "scripts" / "strip_notebook.py"), str(path)],
                                  stdout=out, stderr=subprocess.STDOUT).returncode

    def _after(self, profile: str) -> None:
        """The report once every chosen notebook finished; the README shows a complete local run
        only; a preregistered profile's claims judged by the frozen rules."""
        if self.options.executor:  # the grid computed the units: the notebooks should only have read them
            done = (self.out / "logs" / "grid.done").stat().st_mtime
            late = sum(1 for pattern in ("*-seed*.json", "*-selection.json") for p in (self.out / "runs").rglob(pattern)
                       if p.stat().st_mtime > done)
            print(f"[run] run records the notebooks wrote after the grid: {late} (0: they only aggregated)")
        readme = []
        if profile == "local" and not self.options.only and self.out.parent == REPO_ROOT / "results":
            readme = ["--readme"]
        elif profile == "local":
            print("[run] README.md not refreshed: it shows a complete 'local' run of every notebook into results/.")
        sys.stdout.flush()
        if not self.options.only and config.load_profile(profile).test_inputs is not None:
            self._call(["-m", "plugin_lib.commands.confirmation", "judge"], check=True)
        self._call(["-m", "plugin_lib.report", "--profile", profile, *readme], check=True)

    # ------------------------------------------------------------------ processes and signals
    def _call(self, args: list[str], check: bool = False) -> int:
        sys.stdout.flush()
        self.child = subprocess.Popen([self.py, *args])
        status, self.child = self.child.wait(), None
        if check and status:
            raise SystemExit(status)
        return status

    def _on_signal(self, signum, frame) -> None:
        raise Interrupted(signum)

    def _cleanup(self) -> None:
        """The running child, the temporary notebook."""
        if self.child is not None:
            self.child.terminate()
            try:
                self.child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
            self.child = None
        if self.temporary is not None:
            self.temporary.unlink(missing_ok=True)
            self.temporary = None


def _skip_preflight() -> bool:
    return os.environ.get("PLUGIN_SKIP_PREFLIGHT", "0") == "1"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


if __name__ == "__main__":
    sys.exit(main())
