"""The Plugin inside vLLM against the base alone inside vLLM, and the package's own engine beside
it, at 1, 8 and 32 concurrent requests; every ratio comes from this run.

    python benchmarks/bench_vllm.py [--concurrency 1 8 32] [--requests-per-slot 2] [--new-tokens 64]

SmolLM2-135M-Instruct with a 1-layer reweighting model (seeded, untrained: decoding costs the
same), greedy, each request exactly ``--new-tokens`` long (``min_tokens``), real E2E prompts:

- vLLM: ``plugin-repro serve --engine vllm`` (vLLM's OpenAI server, compiled, the Plugin's logits
  processor), ``concurrency`` clients at once through the official ``openai`` client; the base
  alone is the same engine with ``vllm_xargs: {plugin: 0}``, so both arms share one server. Every
  prompt is sent once before (vLLM's prefix cache then serves both arms alike), and the arms
  alternate Plugin, base, base, Plugin (each arm's rate over its two runs);
- the package's own engine: its server (``plugin-repro serve``) with the same clients, and its
  in-process batched decoding (``core.decode.generate``) of ``concurrency`` prompts with and
  without the reweighting model (it serves no base-alone endpoint).

vLLM runs twice: with the reweighting model's output layer in float32 (exact, the default) and in
bfloat16 (``--head-dtype bfloat16``: an approximation, opt-in). Prints tokens/s per arm and the
Plugin/base ratio of each engine; keeps the run in
``results/bench/bench_vllm.json`` with the machine, the date and the commit (docs/serving.md
quotes that file). Needs vLLM's environment (scripts/bootstrap_vllm.sh). Nothing else should run
on the machine meanwhile: both engines use every core.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import torch
import uvicorn

from plugin_lib import data
from plugin_lib.core.decode import generate
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.data import prompts as prompt_text
from plugin_lib.harness.api_server import free_port
from plugin_lib.harness.models import load_base_model
from plugin_lib.serving import vllm_engine
from plugin_lib.serving.artifact import BaseSpec, DecodingSettings, PluginModel
from plugin_lib.serving.server import Limits, create_app
from plugin_lib.utils.io import atomic_write_json
from plugin_lib.utils.provenance import REPO_ROOT, device_name, git_state

SAVED = REPO_ROOT / "results" / "bench" / "bench_vllm.json"


def load(url: str, texts: list[str], clients: int, per_client: int, new_tokens: int, extra: dict) -> float:
    """Generated tokens/s of ``clients`` concurrent clients, ``per_client`` requests each."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
    tokens, lock = [0], threading.Lock()

    def one(c: int) -> None:
        for r in range(per_client):
            done = client.completions.create(model="bench", prompt=texts[(c * per_client + r) % len(texts)],
                                             max_tokens=new_tokens, temperature=0,
                                             extra_body={"min_tokens": new_tokens, **extra})
            with lock:
                tokens[0] += done.usage.completion_tokens

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tokens[0] / (time.perf_counter() - started)


def wait_for(url: str, process: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"vLLM's server exited ({process.returncode})")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("vLLM's server did not answer /health in time")


def vllm_rates(artifact: Path, texts: list[str], args, head_dtype: str, folder: Path) -> dict[int, dict[str, float]]:
    """Per concurrency, the Plugin's and the base alone's tokens/s in one vLLM server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(folder / f"vllm-{head_dtype}.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "plugin_lib", "serve", "--plugin", str(artifact), "--engine", "vllm",
                               "--port", str(port), "--name", "bench", "--max-concurrency", str(max(args.concurrency)),
                               "--head-dtype", head_dtype], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    found = {}
    try:
        wait_for(url, server)
        # every prompt once first: vLLM's prefix cache then holds all of them for both arms alike
        load(url, texts, max(args.concurrency), args.requests_per_slot, 1, {})
        arms = {"plugin": {}, "base": {"vllm_xargs": {"plugin": 0}}}
        for c in args.concurrency:
            seconds = dict.fromkeys(arms, 0.0)
            for arm in ("plugin", "base", "base", "plugin"):  # ABBA: a drift over the run falls on both arms
                seconds[arm] += 1 / load(url, texts, c, args.requests_per_slot, args.new_tokens, arms[arm])
            found[c] = {arm: round(2 / seconds[arm], 1) for arm in arms}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(120)
        log.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--save", default=str(SAVED), help="where the run is kept (JSON)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    vllm_engine.python()  # one line if vLLM's environment is missing
    torch.manual_seed(0)
    base = load_base_model("smollm2-135m-instruct")
    reweighter = make_reweighter("llama", base.vocab_size, seed=0).eval()
    adapted = PluginModel(base, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                          decoding=DecodingSettings(max_new_tokens=args.new_tokens, prompt_format="plain",
                                                    repetition_penalty=None))
    most = max(args.concurrency) * args.requests_per_slot
    texts = [prompt_text.build_prompt("e2e", "llama", ex.source) for ex in data.load_dataset("e2e", "test", rows=most)]
    folder = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    artifact = adapted.save_pretrained(folder / "art")
    print(f"SmolLM2-135M + 1-layer reweighting model, greedy, {args.new_tokens} new tokens a request, "
          f"{args.requests_per_slot} requests per concurrent slot; {os.cpu_count()} cores")

    rows = {c: {"concurrency": c} for c in args.concurrency}
    for head in ("float32", "bfloat16"):
        suffix = "" if head == "float32" else "_bf16_head"
        for c, rates in vllm_rates(artifact, texts, args, head, folder).items():
            rows[c].update({f"vllm_{arm}{suffix}_tokens_per_s": rate for arm, rate in rates.items()})
            print(f"  vLLM, {head} head, {c:>2} at once: Plugin {rates['plugin']:6.1f}, base alone "
                  f"{rates['base']:6.1f} tokens/s")

    port = free_port()
    limits = Limits(max_concurrency=max(args.concurrency), max_queue=4 * most, max_tokens=args.new_tokens)
    own = uvicorn.Server(uvicorn.Config(create_app(adapted, model_id="bench", limits=limits), host="127.0.0.1",
                                        port=port, log_level="warning"))
    threading.Thread(target=own.run, daemon=True).start()
    while not own.started:
        time.sleep(0.05)
    for c in args.concurrency:
        rows[c]["package_server_plugin_tokens_per_s"] = round(
            load(f"http://127.0.0.1:{port}", texts, c, args.requests_per_slot, args.new_tokens, {}), 1)
        for arm, model in (("plugin", reweighter), ("base", None)):
            batch = [adapted.format_prompt(t) for t in texts[:c]]
            started = time.perf_counter()
            generate(base, batch, model, batch_size=c, progress=False, max_new_tokens=args.new_tokens,
                     min_new_tokens=args.new_tokens)
            rows[c][f"package_{arm}_tokens_per_s"] = round(c * args.new_tokens / (time.perf_counter() - started), 1)
        print(f"  package, {c:>2} at once: server (Plugin) {rows[c]['package_server_plugin_tokens_per_s']:6.1f}; "
              f"in process: Plugin {rows[c]['package_plugin_tokens_per_s']:6.1f}, base alone "
              f"{rows[c]['package_base_tokens_per_s']:6.1f} tokens/s")
    own.should_exit = True
    for row in rows.values():
        row["vllm_plugin_over_base_time"] = round(row["vllm_base_tokens_per_s"] / row["vllm_plugin_tokens_per_s"], 3)
        row["vllm_bf16_head_plugin_over_base_time"] = round(row["vllm_base_bf16_head_tokens_per_s"]
                                                            / row["vllm_plugin_bf16_head_tokens_per_s"], 3)
        row["package_plugin_over_base_time"] = round(row["package_base_tokens_per_s"] / row["package_plugin_tokens_per_s"], 3)
        row["vllm_over_package_server_plugin"] = round(row["vllm_plugin_tokens_per_s"]
                                                       / row["package_server_plugin_tokens_per_s"], 2)
        print(f"  {row['concurrency']:>2} at once: Plugin/base time in vLLM x{row['vllm_plugin_over_base_time']:.3f} "
              f"(bfloat16 head x{row['vllm_bf16_head_plugin_over_base_time']:.3f}), in the package "
              f"x{row['package_plugin_over_base_time']:.3f}; vLLM's Plugin over the package server's "
              f"x{row['vllm_over_package_server_plugin']:.2f}")
    if not args.no_save:
        versions = subprocess.run([str(vllm_engine.python()), "-c", "import vllm, torch, transformers; print(vllm.__version__,"
                                   " torch.__version__, transformers.__version__)"], capture_output=True, text=True)
        atomic_write_json(args.save, {
            "machine": f"{device_name()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "git": git_state(),
            "vllm_env": versions.stdout.strip().split("\n")[-1], "torch": torch.__version__,
            "new_tokens": args.new_tokens, "requests_per_slot": args.requests_per_slot, "rows": list(rows.values())})
        print(f"kept in {args.save}")


if __name__ == "__main__":
    main()
