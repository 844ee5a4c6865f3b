"""Speculative greedy decoding over the API against one request per token; every ratio comes
from this run.

    python benchmarks/bench_api_decoding.py [--prompts 10] [--speculate 4 8 16] [--plugin trained]

Notebook 14's setup: llama-cpp-python's server on the offline SmolLM2 GGUF (one thread), the
model ``smollm2-135m-instruct-api`` at the ``local`` profile's api k, E2E test prompts as the
task builds them, decoded one at a time (``api.decode_batch_size``) with the profile's
``max_new_tokens`` and repetition penalty, with the Plugin: ``trained`` trains it again on
notebook 14's training pairs with its chosen hyperparameters (base outputs from the stored
cache, requests for those it lacks; about two minutes in all), ``seeded`` takes the freshly
initialised reweighter of seed 0.

Prints, per positions-per-request n (1 = one request per token): requests per generated
token, wall seconds per generated token, the agreement rate (generated tokens that were the
server's own choice, so that the next step needed no request / generated tokens), the
distributions received per generated token, and whether the outputs equal those of n = 1;
then the ratios to n = 1.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from plugin_lib.core.decode import generate
from plugin_lib.experiments.api import api_scale, view_names
from plugin_lib.harness import api_server, methods, models, tasks
from plugin_lib.harness.running import runner
from plugin_lib.harness.profile import load_profile


def plugin_model(task: tasks.Task, scale, which: str):
    """Notebook 14's Plugin: retrained from the cache with its chosen hyperparameters, or seeded."""
    arch = runner.arch_for(task.base.name)
    seed = scale.seeds[0]
    if which == "seeded":
        return methods.build_model(task, "Plugin", arch, seed).eval(), "seeded (initialised, not trained)"
    selection = runner.runs_dir(scale, task.dataset, task.base.name) / "Plugin-selection.json"
    record = json.loads(selection.read_text())
    hparams = record["configs"][record["best"]]["hparams"]
    before = task.base.usage.snapshot()
    model, result = methods.train(task, methods.TrainingSpec("Plugin", arch, hparams, seed, scale.training),
                                  progress=False)
    asked = task.base.usage.minus(before).phases["teacher_forcing"].requests
    return model.eval(), (f"trained with {hparams} ({result.epochs_run} epochs, {result.seconds:.0f} s; "
                          f"{asked} teacher-forcing requests for base outputs the stored cache lacked)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="local")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--speculate", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--plugin", choices=["trained", "seeded"], default="trained")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    scale = api_scale(profile)
    missing = api_server.llama_cpp_missing()
    if missing:
        raise SystemExit(missing)
    server = profile.api.server
    # Notebook 14's server, its log in a temporary file (not the notebook's log under results/).
    with api_server.LlamaCppServer(n_threads=server.n_threads, n_ctx=server.n_ctx) as running:
        note = (f"llama-cpp-python's server ({running.model_path.name}, {server.n_threads} thread(s), "
                f"n_ctx {server.n_ctx})")
        box = models.load_api_model(view_names(profile)[0], base_url=running.base_url)
        task = runner.load_task(box, "e2e", scale)
        reweighter, how = plugin_model(task, scale, args.plugin)
        prompts = [task.prompt(ex) for ex in task.test[: args.prompts]]
        settings = dict(batch_size=scale.decoding.batch_size, max_new_tokens=scale.decoding.max_new_tokens,
                        repetition_penalty=scale.decoding.repetition_penalty,
                        max_prompt_tokens=task.max_prompt_tokens, progress=False)
        print(f"{note}\n{box!r}\nPlugin: {how}\n{len(prompts)} E2E test prompts, one at a time, max_new_tokens "
              f"{settings['max_new_tokens']}, repetition penalty {settings['repetition_penalty']}, "
              f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}\n")
        rows, reference = {}, None
        for n in [1, *args.speculate]:
            before, started = box.usage.snapshot(), time.perf_counter()
            outputs = generate(box, prompts, reweighter, speculate=n, **settings)
            seconds = time.perf_counter() - started
            spent = box.usage.minus(before).phases["decoding"]
            reference = outputs if n == 1 else reference
            rows[n] = dict(tokens=spent.items, requests=spent.requests / spent.items, seconds=seconds / spent.items,
                           agreement=spent.accepted / spent.items, positions=spent.positions / spent.items,
                           identical=outputs == reference)
        print(f"{'n':>3} {'tokens':>7} {'requests/token':>15} {'s/token':>8} {'agreement':>10} "
              f"{'positions/token':>16} {'same outputs as n=1':>20}")
        for n, row in rows.items():
            print(f"{n:>3} {row['tokens']:>7} {row['requests']:>15.3f} {row['seconds']:>8.3f} "
                  f"{row['agreement']:>10.1%} {row['positions']:>16.2f} {str(row['identical']):>20}")
        print("\nagainst one request per token:")
        for n in args.speculate:
            print(f"  n={n:<3} requests per token x{rows[n]['requests'] / rows[1]['requests']:.3f}, "
                  f"wall time per token x{rows[n]['seconds'] / rows[1]['seconds']:.3f} "
                  f"({rows[1]['seconds'] / rows[n]['seconds']:.2f} times less)")
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
