"""The server under load, through the official ``openai`` client; every ratio comes from this run.

    python benchmarks/bench_serve.py [--clients 1 8] [--requests-per-client 4] [--new-tokens 64]

Serves SmolLM2-135M-Instruct with a 1-layer reweighting model (seeded, untrained: decoding
costs the same) on 127.0.0.1 with uvicorn, as ``plugin-repro serve`` does, and sends greedy
completions of real E2E prompts from each number of concurrent clients, each exactly
``--new-tokens`` long (``min_tokens``, so that every setting decodes the same tokens). Prints per setting the
aggregate generated tokens/s, p50 and p95 request latency, and the ratio to one client; then
the in-process batched ceiling (``PluginModel.generate`` of 8 prompts at once), and whether every
output equals its single-client output.

Each run is kept in ``results/bench/bench_serve.json`` (``--save`` elsewhere, ``--no-save`` not
at all), with the machine, the date and the commit: README.md and docs/serving.md quote that
file's figures, and tests/test_docs_figures.py holds them to it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import openai
import torch
import uvicorn

from plugin_lib import data
from plugin_lib.core.decode import generate
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.data import prompts as prompt_text
from plugin_lib.harness.api_server import free_port
from plugin_lib.harness.models import load_base_model
from plugin_lib.serving.artifact import BaseSpec, DecodingSettings, PluginModel
from plugin_lib.serving.server import Limits, create_app
from plugin_lib.utils.io import atomic_write_json
from plugin_lib.utils.provenance import REPO_ROOT, device_name, git_state

SAVED = REPO_ROOT / "results" / "bench" / "bench_serve.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests-per-client", type=int, default=4)  # 2 varied x3.75-x4.34 between runs
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--save", default=str(SAVED), help="where the run is kept (JSON)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    base = load_base_model("smollm2-135m-instruct")
    reweighter = make_reweighter("llama", base.vocab_size, seed=0).eval()
    adapted = PluginModel(base, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                          decoding=DecodingSettings(max_new_tokens=args.new_tokens, prompt_format="plain"))
    most = max(args.clients) * args.requests_per_client
    texts = [prompt_text.build_prompt("e2e", "llama", ex.source) for ex in data.load_dataset("e2e", "test", rows=most)]

    port = free_port()
    limits = Limits(max_concurrency=max(args.clients), max_queue=4 * most, max_tokens=args.new_tokens)
    server = uvicorn.Server(uvicorn.Config(create_app(adapted, model_id="bench", limits=limits), host="127.0.0.1",
                                           port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=3600)
    print(f"SmolLM2-135M + 1-layer reweighting model, greedy, at most {args.new_tokens} new tokens a request, "
          f"{torch.get_num_threads()} threads; {args.requests_per_client} requests per client")

    def run(clients: int) -> tuple[dict[int, str], list[float], int, float]:
        outputs, latencies, tokens, lock = {}, [], [0], threading.Lock()

        def one_client(c: int) -> None:
            for r in range(args.requests_per_client):
                i = (c * args.requests_per_client + r) % len(texts)
                started = time.perf_counter()
                done = client.completions.create(model="bench", prompt=texts[i], max_tokens=args.new_tokens,
                                                 temperature=0, extra_body={"min_tokens": args.new_tokens})
                with lock:
                    latencies.append(time.perf_counter() - started)
                    tokens[0] += done.usage.completion_tokens
                    outputs[i] = done.choices[0].text

        started = time.perf_counter()
        threads = [threading.Thread(target=one_client, args=(c,)) for c in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outputs, latencies, tokens[0], time.perf_counter() - started

    single, results, rows = {}, {}, []
    for clients in sorted(set(args.clients)):
        outputs, latencies, tokens, wall = run(clients)
        results[clients] = tokens / wall
        for i, text in outputs.items():
            single.setdefault(i, text)
        same = all(single[i] == text for i, text in outputs.items())
        p95 = statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 1 else latencies[0]
        print(f"  {clients:>2} client(s): {tokens:5d} tokens in {wall:6.1f} s = {tokens / wall:6.1f} tokens/s; "
              f"latency p50 {statistics.median(latencies):5.1f} s, p95 {p95:5.1f} s; "
              f"x{tokens / wall / results[min(results)]:.2f} one client's; outputs as alone: {'yes' if same else 'NO'}")
        rows.append({"clients": clients, "tokens_per_s": round(tokens / wall, 1),
                     "latency_p50_s": round(statistics.median(latencies), 1), "latency_p95_s": round(p95, 1),
                     "vs_one_client": round(tokens / wall / results[min(results)], 2), "outputs_as_alone": same})
    batch = texts[:max(args.clients)]
    started = time.perf_counter()
    generate(base, [adapted.format_prompt(t) for t in batch], reweighter, batch_size=len(batch), progress=False,
             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
             repetition_penalty=adapted.decoding.repetition_penalty)
    wall = time.perf_counter() - started
    print(f"  in-process batched ceiling ({len(batch)} prompts in one generate): "
          f"{len(batch) * args.new_tokens / wall:6.1f} tokens/s")
    server.should_exit = True
    if not args.no_save:
        atomic_write_json(args.save, {
            "machine": f"{device_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
            "date": time.strftime("%Y-%m-%d"), "git": git_state(),
            "torch": torch.__version__, "new_tokens": args.new_tokens,
            "requests_per_client": args.requests_per_client, "rows": rows,
            "ceiling_tokens_per_s": round(len(batch) * args.new_tokens / wall, 1)})
        print(f"kept in {args.save}")


if __name__ == "__main__":
    main()
