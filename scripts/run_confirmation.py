"""Run the preregistered confirmation's main-table runs in the background, resumably.

    OMP_NUM_THREADS=1 PLUGIN_RESULTS_DIR=/somewhere/outside/the/checkout \
        python scripts/run_confirmation.py e2e webnlg --methods Zeroshot ICL-1 ICL-3 Plugin NewModel WeightedComb

Every run goes through ``harness.runner`` under the ``confirm`` profile, so a finished run is
kept and an interrupted one resumes; before anything runs, each dataset's test inputs are
checked against the frozen ones (``report/preregistered_inputs.json``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time

from plugin_lib.harness import methods, runner
from plugin_lib.harness.profile import load_profile, results_dir
from plugin_lib.report import freeze

FROZEN_INPUTS = freeze.REPO_ROOT / "plugin_lib" / "report" / "preregistered_inputs.json"


def check_frozen_inputs(dataset: str, profile) -> None:
    frozen = json.loads(FROZEN_INPUTS.read_text(encoding="utf-8"))["datasets"][dataset]
    test = methods.task_splits(dataset, profile)[2]
    payload = json.dumps([[e.id, e.source, list(e.references)] for e in test], ensure_ascii=False)
    if hashlib.sha256(payload.encode()).hexdigest() != frozen["sha256"]:
        raise SystemExit(f"{dataset}: the test inputs differ from the frozen ones ({FROZEN_INPUTS}); "
                         "check the data against shared/data/SHA256SUMS.txt.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+")
    parser.add_argument("--methods", nargs="+", default=["Zeroshot", "ICL-1", "ICL-3", "Plugin", "NewModel",
                                                          "WeightedComb"])
    args = parser.parse_args()
    profile = load_profile("confirm")
    for dataset in args.datasets:
        check_frozen_inputs(dataset, profile)
    print(f"results: {results_dir(profile)}; rules frozen at {freeze.FROZEN_AT}", flush=True)
    for dataset in args.datasets:
        started = time.time()
        runner.run_table(dataset, profile, method_names=args.methods)
        print(f"{dataset}: done in {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
