"""``train``'s estimate, said before any work, against the time each phase then took.

    python benchmarks/bench_train_estimate.py [--pairs 200] [--profile local] [--epochs 2] [--out FILE]

The task is a practitioner's: a Python standard-library function's source, without its
docstring, to the docstring's first line (pairs made here from this interpreter's stdlib, so
no data is needed; prompts vary in length as real files do). ``serving.training.train_plugin``
runs as ``plugin-repro train`` runs it, on SmolLM2-135M-Instruct, with patience set to the epoch
cap (unless ``--patience`` is given) so that every configuration runs every epoch the estimate
counts. It prints, per phase (base outputs, grid, refit) and in all, the estimate at most, the
estimate for the epochs that ran (the cost model alone, apart from early stopping), the seconds
taken and their ratio, and whether the time taken lies in the range printed first. ``--out``
keeps the rows as JSON (results/bench/bench_train_estimate_*.json: runs on the 2-core CPU).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import random
import sys
import textwrap
import time
import warnings

from plugin_lib.harness import models
from plugin_lib.harness.profile import load_profile
from plugin_lib.serving.artifact import BaseSpec
from plugin_lib.serving.inputs import Pair
from plugin_lib.serving.recipe import TrainingRecipe
from plugin_lib.serving.training import train_plugin

MODULES = ("argparse", "ast", "calendar", "collections", "csv", "difflib", "email.utils", "fractions", "ftplib",
           "functools", "gettext", "glob", "gzip", "heapq", "html", "imaplib", "inspect", "ipaddress", "json",
           "locale", "logging", "mailbox", "mimetypes", "ntpath", "os", "pathlib", "pickle", "platform",
           "plistlib", "posixpath", "pprint", "pydoc", "quopri", "random", "shlex", "shutil", "smtplib",
           "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "tokenize",
           "traceback", "typing", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "zipfile",
           "asyncio.tasks", "base64", "codecs", "compileall", "configparser", "contextlib", "copy", "dataclasses",
           "dis", "doctest", "enum", "filecmp", "fileinput", "fnmatch", "getopt", "hmac", "http.client",
           "http.cookiejar", "importlib.util", "linecache", "operator", "optparse", "pdb", "pkgutil", "py_compile",
           "re", "reprlib", "runpy", "selectors", "shelve", "site", "socket", "sysconfig", "timeit", "trace",
           "unittest.mock", "webbrowser", "xml.dom.minidom")


def stdlib_pairs(count: int, seed: int = 0) -> list[Pair]:
    """(source without the docstring, the docstring's first line) of stdlib functions."""
    pairs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:  # a module this build of Python lacks
                continue
            for _, function in sorted(inspect.getmembers(module, inspect.isfunction), key=lambda m: m[0]):
                pair = _pair(function)
                if pair is not None and function.__module__ == name:
                    pairs.append(pair)
    random.Random(seed).shuffle(pairs)
    if len(pairs) < count:
        sys.exit(f"only {len(pairs)} stdlib functions with a docstring here; ask for fewer --pairs.")
    return pairs[:count]


def _pair(function) -> Pair | None:
    doc = inspect.getdoc(function)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not doc or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
        return None
    node.body = node.body[1:] or [ast.Pass()]
    first = doc.strip().splitlines()[0].strip()
    return Pair(ast.unparse(node), first) if first else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--profile", default="local")
    parser.add_argument("--epochs", type=int, default=2, help="the epoch cap")
    parser.add_argument("--patience", type=int, help="early stopping's patience (default: the epoch cap, so that "
                                                     "every configuration runs every epoch)")
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--out", help="also write the rows to this JSON file")
    args = parser.parse_args()
    pairs = stdlib_pairs(args.pairs)
    profile = load_profile(args.profile)
    patience = args.patience or args.epochs
    recipe = TrainingRecipe.from_profile(profile).replace(max_epochs=args.epochs, patience=patience)
    spec = BaseSpec("model", args.base)
    lines: list[str] = []
    started = time.perf_counter()
    plugin = train_plugin(models.load_base_model(args.base), spec, pairs, recipe, announce=lines.append,
                          progress=False)
    wall = time.perf_counter() - started
    record = plugin.training
    plan, took = record["estimate"], record["phases"]
    ran = sum(c["epochs_run"] for c in record["configs"])
    refit_epochs = record.get("refit", {}).get("epochs", 0)
    rows = [("base outputs", plan["base_s"], plan["base_s"], took["base_outputs_s"]),
            ("grid", plan["grid_s"], plan["epoch_s"] * ran, took["grid_s"]),
            ("refit", plan["refit_epoch_s"] * plan["refit_epochs"], plan["refit_epoch_s"] * refit_epochs,
             took.get("refit_s", 0.0)),
            ("in all", plan["total_s"], plan["base_s"] + plan["epoch_s"] * ran + plan["refit_epoch_s"] * refit_epochs,
             wall)]
    print("\n".join(lines))
    print(f"\n{args.pairs} stdlib pairs, profile {args.profile}, {args.epochs} epochs (patience {patience}), "
          f"{len(record['configs'])} configurations ({ran} epochs in all), refit {refit_epochs} epoch(s)\n")
    print(f"{'phase':<14}{'at most (s)':>13}{'for epochs run (s)':>20}{'took (s)':>10}{'took / for epochs run':>23}")
    for phase, at_most, for_ran, seconds in rows:
        print(f"{phase:<14}{at_most:>13.1f}{for_ran:>20.1f}{seconds:>10.1f}{seconds / max(for_ran, 1e-9):>23.2f}")
    if "least_s" in plan:
        print(f"\nprinted first: {plan['least_s']:.0f} to {plan['total_s']:.0f} s; took {wall:.0f} s in all "
              f"({'inside' if plan['least_s'] <= wall <= plan['total_s'] else 'OUTSIDE'} the range; "
              f"{wall / plan['total_s']:.2f} of its upper end)")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "estimate_lines": lines, "rows": [dict(zip(
                ("phase", "estimate_s", "estimate_for_epochs_run_s", "took_s"), row)) for row in rows]}, f, indent=2)


if __name__ == "__main__":
    main()
