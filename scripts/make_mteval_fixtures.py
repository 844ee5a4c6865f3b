"""Regenerate ``tests/fixtures/mteval_official.json``: BLEU and NIST of small corpora with
unequal reference counts, as the official E2E NLG Challenge scorer (tuetschek/e2e-metrics)
computes them.

    python scripts/make_mteval_fixtures.py --e2e-metrics /path/to/e2e-metrics \
        [--commit SHA] [--e2e-test-csv data/e2e_cleaned/test-fixed.csv]

``--e2e-metrics``: a checkout (or an export; then pass ``--commit``) of
github.com/tuetschek/e2e-metrics. Needs ``perl`` with ``XML::Twig`` (Debian:
``libxml-twig-perl``; mteval loads it at start) and the ``future`` package (e2e-metrics'
own requirement, imported by its ``metrics/pymteval.py``).

Per case the fixture holds:

- ``perl``: what ``measure_scores.py`` reports (its ``run_mteval``: files written by its
  ``create_mteval_file``, references padded with ``''``; ``perl mteval/mteval-v13a-sig.pl``
  with default options; the "NIST score =" / "BLEU score =" lines, 4 decimals);
- ``perl_full``: the same system scores at full precision, from the same Perl script run with
  the same files plus its ``--metricsMATR`` option (``NIST-sys.scr``, ``BLEU-sys.scr``); the
  script checks that they round to ``perl``;
- ``pymteval``: e2e-metrics' Python port (``measure_scores.py -p``, ``run_pymteval``), whose
  NIST averages reference lengths per input.

Cases with ``drawn_from`` repeat the inputs of another case (``counts``), as a bootstrap
draw does.

Only the MTEval path of ``measure_scores.py`` is used: its COCO imports (matplotlib,
scikit-image, Java) are replaced by empty modules before it is imported.

With ``--e2e-test-csv`` it adds two cases built from the E2E test set that the tests rebuild
from the same file (texts not stored): every MR with more than one reference, its first
reference as the prediction and the others as references (``e2e_test_first_ref``), and the
same restricted to MRs with exactly three other references (``e2e_test_first_ref_3refs``).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types
from collections import OrderedDict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "mteval_official.json"

# Hand-written E2E-style corpora. What each one exercises is in its "about".
CASES = [
    {
        "name": "one_three_two_refs",
        "about": "three inputs with 1, 3 and 2 references",
        "predictions": [
            "the eagle is a coffee shop .",
            "the eagle is a cheap coffee shop near burger king .",
            "the mill is a pub serving english food .",
        ],
        "references": [
            ["the eagle is a coffee shop near burger king ."],
            ["a cheap coffee shop called the eagle .",
             "the eagle , a coffee shop , is cheap and family friendly .",
             "near burger king there is the eagle coffee shop which is low rated ."],
            ["the mill is a pub .", "the mill pub serves english food in the city centre ."],
        ],
    },
    {
        "name": "one_long_reference_beside_many_short",
        "about": "a single long reference next to six short ones: the pooled mean reference length "
                 "is short, the per-input average long",
        "predictions": [
            "The Cricketers is a cheap coffee shop near The Portland Arms.",
            "Alimentum is a pub.",
            "Zizzi is a restaurant serving Japanese food.",
        ],
        "references": [
            ["The Cricketers is a coffee shop with a high customer rating that serves Chinese food in the "
             "riverside area near The Portland Arms, and although it is not family friendly it is cheap."],
            ["Alimentum is a pub.", "Alimentum is a cheap pub.", "There is a pub called Alimentum.",
             "Alimentum serves food.", "Alimentum is near the river.", "Try Alimentum, a pub."],
            ["Zizzi is a Japanese restaurant.", "Zizzi serves Japanese food."],
        ],
    },
    {
        "name": "many_long_references_beside_one_short",
        "about": "five long references next to single short ones: the pooled mean reference length is "
                 "long, the per-input average short",
        "predictions": [
            "The Wrestlers is a family friendly Italian restaurant in the city centre near Raja Indian Cuisine.",
            "Browns Cambridge is a pub.",
            "Cotto serves Indian food.",
        ],
        "references": [
            ["The Wrestlers is a family friendly restaurant that serves Italian food in the city centre, close "
             "to Raja Indian Cuisine, with prices in the high range.",
             "Near Raja Indian Cuisine in the city centre you will find The Wrestlers, an expensive Italian "
             "restaurant that welcomes children and families.",
             "The Wrestlers, located in the city centre near Raja Indian Cuisine, is a high priced Italian "
             "restaurant which is child friendly and has average reviews.",
             "If you want Italian food in the city centre, The Wrestlers near Raja Indian Cuisine is family "
             "friendly, although its prices are on the high side.",
             "The Wrestlers is an Italian restaurant in the city centre by Raja Indian Cuisine; it is kid "
             "friendly and the prices are high, but the food is good."],
            ["Browns Cambridge pub."],
            ["Cotto: Indian food."],
        ],
    },
    {
        "name": "equal_reference_counts",
        "about": "three references for every input: both NIST definitions agree",
        "predictions": [
            "Fitzbillies is a coffee shop in the riverside area.",
            "The Vaults is an expensive French pub near the river.",
            "Clowns is a coffee shop with a rating of 5 out of 5.",
        ],
        "references": [
            ["Fitzbillies is a coffee shop by the riverside.", "In the riverside area there is a coffee "
             "shop named Fitzbillies.", "Fitzbillies, a riverside coffee shop, is cheap."],
            ["The Vaults is a French pub by the river.", "There is an expensive pub called The Vaults near "
             "the river that serves French food.", "The Vaults pub serves French food at high prices."],
            ["Clowns is a coffee shop rated 5 out of 5.", "Clowns coffee shop has a customer rating of 5 "
             "out of 5.", "Rated 5 out of 5, Clowns is a coffee shop near the river."],
        ],
    },
    {
        "name": "punctuation_numbers_and_case",
        "about": "capitals, digits, currency signs, hyphens, apostrophes and other punctuation, with "
                 "2, 1 and 4 references (13a tokenisation, lowercasing)",
        "predictions": [
            "The Golden Curry's prices are £20-25; it's rated 3 out of 5!",
            "Is Loch Fyne (a seafood place) near the U.S. embassy? Yes: 1.5 miles.",
            "Strada, a pub-style Italian restaurant, costs more than £30 per person.",
        ],
        "references": [
            ["The Golden Curry has prices of £20-25 and is rated 3 out of 5.",
             "Rated 3/5, The Golden Curry's prices are £20-25!"],
            ["Loch Fyne (a seafood restaurant) is 1.5 miles from the U.S. embassy."],
            ["Strada is an Italian pub-style restaurant; meals cost more than £30.",
             "STRADA: Italian food, more than £30 per person.",
             "Strada, an Italian restaurant, is expensive (more than £30).",
             "At Strada, a pub-style Italian place, you pay more than £30 per head."],
        ],
    },
    {
        "name": "short_and_empty_predictions",
        "about": "an empty and a one-word prediction beside a long one, with 4, 1 and 2 references",
        "predictions": [
            "",
            "pub",
            "The Phoenix is a fast food restaurant in the city centre with a low customer rating.",
        ],
        "references": [
            ["Bibimbap House is a Chinese restaurant.", "Bibimbap House serves Chinese food.",
             "There is a Chinese restaurant called Bibimbap House.", "Bibimbap House: Chinese food."],
            ["The Punter is a pub."],
            ["The Phoenix is a fast food restaurant in the city centre with a low rating.",
             "In the city centre, The Phoenix serves fast food and has a low customer rating."],
        ],
    },
]

# Bootstrap-style draws of two of them (input i repeated counts[i] times, in order): the
# scores of a resampled corpus, which the bootstrap over test inputs computes from counts.
DRAWS = [("one_long_reference_beside_many_short", [2, 0, 3]),
         ("many_long_references_beside_one_short", [1, 3, 1])]


def drawn_case(name: str, counts: list[int]) -> dict:
    base = next(c for c in CASES if c["name"] == name)
    order = [i for i, count in enumerate(counts) for _ in range(count)]
    return {"name": f"{name}_drawn_{'_'.join(map(str, counts))}", "drawn_from": name, "counts": counts,
            "about": f"{name} with input i repeated counts[i] times",
            "predictions": [base["predictions"][i] for i in order],
            "references": [base["references"][i] for i in order]}


def import_measure_scores(checkout: Path):
    """``measure_scores`` of the checkout, its unused COCO imports replaced by empty modules."""
    for name, attr in (("pycocotools.coco", "COCO"), ("pycocoevalcap.eval", "COCOEvalCap")):
        package = name.split(".")[0]
        sys.modules.setdefault(package, types.ModuleType(package))
        stub = types.ModuleType(name)
        setattr(stub, attr, None)
        sys.modules[name] = stub
    sys.path.insert(0, str(checkout))
    return importlib.import_module("measure_scores")


def perl_full_precision(ms, checkout: Path, references, predictions) -> dict[str, float]:
    """The system-level scores of ``mteval-v13a-sig.pl`` at full precision: the files and
    arguments of ``measure_scores.run_mteval`` plus ``--metricsMATR``."""
    with tempfile.TemporaryDirectory(prefix="mteval-fixture-") as tmp:
        files = {kind: os.path.join(tmp, f"mteval_{kind}.sgm") for kind in ("ref", "sys", "src")}
        ms.create_mteval_file(references, files["ref"], "ref")
        ms.create_mteval_file(predictions, files["sys"], "tst")
        ms.create_mteval_file([""] * len(predictions), files["src"], "src")
        subprocess.run(["perl", str(checkout / "mteval" / "mteval-v13a-sig.pl"), "-r", files["ref"],
                        "-s", files["src"], "-t", files["sys"], "-f", os.path.join(tmp, "log.txt"),
                        "--metricsMATR"], cwd=tmp, check=True, capture_output=True)
        scores = {}
        for metric in ("BLEU", "NIST"):
            line = Path(tmp, f"{metric}-sys.scr").read_text().split("\n")[0]
            scores[metric] = float(line.split("\t")[-1])
        return scores


def score_case(ms, checkout: Path, predictions, references) -> dict:
    with contextlib.redirect_stderr(io.StringIO()):  # measure_scores echoes mteval's whole output
        perl = ms.run_mteval(references, predictions, [""] * len(predictions))
        py = ms.run_pymteval(references, predictions)
    full = perl_full_precision(ms, checkout, references, predictions)
    for metric in ("BLEU", "NIST"):
        if f"{full[metric]:.4f}" != f"{perl[metric]:.4f}":
            raise RuntimeError(f"--metricsMATR {metric} {full[metric]} does not round to the printed {perl[metric]}")
    return {"perl": {m: perl[m] for m in ("BLEU", "NIST")},
            "perl_full": full,
            "pymteval": {m: float(py[m]) for m in ("BLEU", "NIST")}}


def e2e_first_ref_cases(test_csv: Path) -> list[dict]:
    """The two real-data cases (see the module docstring); MRs grouped in file order."""
    groups: OrderedDict[str, list[str]] = OrderedDict()
    with open(test_csv, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            groups.setdefault(row["mr"], []).append(row["ref"])
    cases = []
    for name, keep in (("e2e_test_first_ref", lambda g: len(g) > 1),
                       ("e2e_test_first_ref_3refs", lambda g: len(g) == 4)):
        kept = [g for g in groups.values() if keep(g)]
        cases.append({"name": name, "inputs": len(kept),
                      "predictions": [g[0] for g in kept], "references": [g[1:] for g in kept]})
    return cases


def commit_of(checkout: Path, given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise SystemExit(f"{checkout} is not a git checkout: pass --commit.") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--e2e-metrics", type=Path, required=True, help="checkout of tuetschek/e2e-metrics")
    parser.add_argument("--commit", help="its commit, when the checkout is not a git work tree")
    parser.add_argument("--e2e-test-csv", type=Path, help="E2E test-fixed.csv: add the two real-data cases")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    checkout = args.e2e_metrics.resolve()
    if not (checkout / "mteval" / "mteval-v13a-sig.pl").is_file():
        raise SystemExit(f"No mteval/mteval-v13a-sig.pl under {checkout}.")
    ms = import_measure_scores(checkout)
    perl_version = subprocess.run(["perl", "-e", "print $^V"], capture_output=True, text=True, check=True).stdout
    cases = []
    drawn = [drawn_case(name, counts) for name, counts in DRAWS]
    for case in CASES + drawn + (e2e_first_ref_cases(args.e2e_test_csv) if args.e2e_test_csv else []):
        scores = score_case(ms, checkout, case["predictions"], case["references"])
        stored = {k: v for k, v in case.items() if not (k in ("predictions", "references") and "inputs" in case)}
        cases.append({**stored, **scores})
        print(f"{case['name']}: {json.dumps(scores)}", file=sys.stderr)
    fixture = {
        "source": ("tuetschek/e2e-metrics measure_scores.py: run_mteval (perl mteval/mteval-v13a-sig.pl, "
                   "default options; perl_full: the same run with --metricsMATR) and run_pymteval"),
        "commit": commit_of(checkout, args.commit),
        "perl": perl_version,
        "generated_by": "scripts/make_mteval_fixtures.py",
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture, indent=1, ensure_ascii=False) + "\n"
    tmp = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
