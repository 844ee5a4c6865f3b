"""One process of the shared-store tests (tests/test_store_concurrency.py): the grid search of
the Plugin on the tiny base and toy task, in the run store that PLUGIN_RESULTS_DIR names.

    python tests/store_worker.py CACHE_DIR LOG [SLEEP_S]

Each configuration's training appends ``start``, ``trained`` and ``end <tag> <pid>`` to LOG
(O_APPEND: whole lines from many processes; the configurations a search trains together, each
in turn) and, with SLEEP_S, waits that long before it ends, so that a test can kill the process
in the middle of a unit. Prints the selection record.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import SMALL_ARCH, _toy_example, make_tiny_base  # noqa: E402

from plugin_lib.harness import methods, models, tasks
from plugin_lib.harness.running import search  # noqa: E402
from plugin_lib.harness.profile import load_profile  # noqa: E402

GRID = {"lr": [1e-3, 2e-3, 5e-3], "weight_decay": [0.01], "alpha": [0.5], "extend_edges": 0}


def main(cache_dir: str, log: str, sleep_s: float = 0.0) -> None:
    real_spec, real_one, real_many = models.model_spec, methods.train, methods.train_together
    models.model_spec = lambda name: ({"name": name, "source": "test", "family": "llama", "display": "tiny"}
                                      if name == "tiny-llama" else real_spec(name))
    search.arch_for = lambda name: dict(SMALL_ARCH)

    def note(line: str) -> None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, f"{line} {os.getpid()}\n".encode())
        os.close(fd)

    def logged(configs, train):
        for hparams in configs:
            note(f"start lr={hparams['lr']:g}")
        out = train()
        for hparams in configs:
            note(f"trained lr={hparams['lr']:g}")
        time.sleep(sleep_s)
        for hparams in configs:
            note(f"end lr={hparams['lr']:g}")
        return out

    methods.train = lambda task, spec, **kwargs: logged(
        [spec.hparams], lambda: real_one(task, spec, **kwargs))
    methods.train_together = lambda task, specs, **kwargs: logged(
        [spec.hparams for spec in specs], lambda: real_many(task, specs, **kwargs))
    profile = load_profile("smoke", seeds=[0], grid=GRID,
                           training={"max_epochs": 1, "patience": 1, "batch_size": 4, "warmup_ratio": 0.1})
    base = make_tiny_base(models.load_tokenizer("smollm2-135m-instruct"))
    task = tasks.Task(base, "e2e", "llama", train=[_toy_example(i, "validation") for i in range(4)],
                        hyper=[_toy_example(i, "validation") for i in range(4, 6)],
                        test=[_toy_example(i, "test") for i in range(2)], cache_dir=Path(cache_dir))
    record = search.select_hparams(task, "Plugin", profile, progress=False)
    print(json.dumps({"best": record["best"], "configs": sorted(record["configs"])}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
