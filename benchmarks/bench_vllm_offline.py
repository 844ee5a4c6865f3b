"""vLLM's offline engine (``generate``/``evaluate --engine vllm``) with its engine core and worker
in processes of their own (vLLM's default) against all of it in one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, what ``serving.vllm_engine.generate_ids`` sets on a CPU);
every ratio comes from this run.

    python benchmarks/bench_vllm_offline.py [--sizes 2x32 64x64] [--repeats 2]

SmolLM2-135M-Instruct with a seeded 1-layer reweighting model, greedy, real E2E prompts; each size
is PROMPTSxNEW_TOKENS. Each call is a whole ``generate_ids`` (start, decode, stop), as a user's
command pays it; the two arms alternate (one process, several, several, one). Prints the seconds
of each arm, their ratio and whether the tokens are the same; keeps the run in
``results/bench/bench_vllm_offline.json`` with the machine, the date and the commit. Needs vLLM's
environment (scripts/bootstrap_vllm.sh); nothing else should run on the machine meanwhile.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from plugin_lib import data
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.data import prompts as prompt_text
from plugin_lib.harness.models import load_base_model
from plugin_lib.serving import vllm_engine
from plugin_lib.serving.artifact import BaseSpec, DecodingSettings, PluginModel
from plugin_lib.utils.io import atomic_write_json
from plugin_lib.utils.provenance import REPO_ROOT, device_name, git_state

SAVED = REPO_ROOT / "results" / "bench" / "bench_vllm_offline.json"
ARMS = {"one process": "0", "engine core and worker apart": "1"}


def timed(artifact: Path, ids: list[list[int]], new_tokens: int, multiprocessing: str) -> tuple[float, list]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing  # generate_ids keeps a value already set
    started = time.perf_counter()
    found = vllm_engine.generate_ids(artifact, ids, {"plugin": {}}, max_new_tokens=new_tokens)
    return time.perf_counter() - started, found["plugin"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["2x32", "64x64"])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm per size (alternated)")
    parser.add_argument("--save", type=Path, default=SAVED)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes]
    base = load_base_model("smollm2-135m-instruct")
    plugin = PluginModel(base, make_reweighter("llama", base.vocab_size, seed=0).eval(),
                         base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                         decoding=DecodingSettings(prompt_format="plain", repetition_penalty=None))
    artifact = plugin.save_pretrained(Path(tempfile.mkdtemp(prefix="bench-vllm-offline-")) / "art")
    most = max(n for n, _ in sizes)
    texts = [prompt_text.build_prompt("e2e", "llama", ex.source) for ex in data.load_dataset("e2e", "test", rows=most)]
    print(f"SmolLM2-135M + 1-layer reweighting model, greedy, vLLM's offline engine on "
          f"{'a GPU' if vllm_engine.on_gpu() else 'the CPU'}; {os.cpu_count()} cores")
    rows = []
    for prompts, new_tokens in sizes:
        ids, _ = vllm_engine.prompt_ids(artifact, texts[:prompts])
        seconds, tokens = {arm: [] for arm in ARMS}, {}
        order = list(ARMS) + list(ARMS)[::-1]
        for arm in (order * args.repeats)[: 2 * args.repeats]:
            took, tokens[arm] = timed(artifact, ids, new_tokens, ARMS[arm])
            seconds[arm].append(round(took, 1))
        one, apart = (statistics.median(seconds[arm]) for arm in ARMS)
        row = {"prompts": prompts, "new_tokens": new_tokens, "seconds": seconds,
               "apart_over_one_process": round(apart / one, 2), "same_tokens": len(set(map(str, tokens.values()))) == 1}
        rows.append(row)
        print(f"  {prompts} prompts x {new_tokens} tokens: one process {seconds['one process']} s, apart "
              f"{seconds['engine core and worker apart']} s: x{row['apart_over_one_process']:.2f}, "
              f"same tokens: {row['same_tokens']}")
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if not args.no_save:
        atomic_write_json(args.save, {"machine": f"{device_name()}, {os.cpu_count()} cores",
                                      "date": time.strftime("%Y-%m-%d"), "git": git_state(), "rows": rows})
        print(f"kept in {args.save}")


if __name__ == "__main__":
    main()
