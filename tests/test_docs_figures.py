"""The serving figures that docs/serving.md (and README.md, where it quotes one) quote are those of
benchmarks/bench_serve.py's latest kept run (results/bench/bench_serve.json), with its machine
and date named: a new run changes the file, and this test then asks for the docs to follow."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = json.loads((ROOT / "results" / "bench" / "bench_serve.json").read_text())


def test_docs_serving_quotes_the_latest_run_with_its_machine():
    doc = (ROOT / "docs" / "serving.md").read_text()
    assert RUN["machine"] in doc and RUN["date"] in doc
    for row in RUN["rows"]:
        line = (f"| {row['clients']} | {row['tokens_per_s']:.1f} | {row['latency_p50_s']:.1f} / "
                f"{row['latency_p95_s']:.1f} s | {row['vs_one_client']:.2f} | {'yes' if row['outputs_as_alone'] else 'NO'} |")
        assert line in doc, line
    assert f"{RUN['ceiling_tokens_per_s']:.1f} tokens/s" in doc


def test_the_readme_leaves_the_ratio_to_docs_serving_or_quotes_the_latest():
    """README.md, under its size limit, may point to docs/serving.md instead of quoting the
    speed-up; a ratio it does quote is the latest run's."""
    readme = (ROOT / "README.md").read_text()
    assert "docs/serving.md" in readme
    most = max(RUN["rows"], key=lambda row: row["clients"])
    quoted = re.findall(r"(\d+) clients: ([\d.]+)x one client's tokens/s", readme)
    assert all(quote == (str(most["clients"]), f"{most['vs_one_client']:.1f}") for quote in quoted), quoted


def test_docs_serving_quotes_the_latest_vllm_run():
    """benchmarks/bench_vllm.py's kept run (results/bench/bench_vllm.json): docs/serving.md's table
    of the two engines is that file's, with its machine and date."""
    run = json.loads((ROOT / "results" / "bench" / "bench_vllm.json").read_text())
    doc = (ROOT / "docs" / "serving.md").read_text()
    assert run["machine"] in doc and run["date"] in doc
    for row in run["rows"]:
        line = (f"| {row['concurrency']} | {row['vllm_plugin_tokens_per_s']:.1f} | {row['vllm_base_tokens_per_s']:.1f} | "
                f"{row['vllm_plugin_over_base_time']:.3f} | {row['vllm_bf16_head_plugin_over_base_time']:.3f} | "
                f"{row['package_server_plugin_tokens_per_s']:.1f} | {row['package_plugin_over_base_time']:.3f} |")
        assert line in doc, line
    speedups = [row["vllm_over_package_server_plugin"] for row in run["rows"]]
    assert f"{min(speedups):.2f} to {max(speedups):.2f} times the package server's" in doc


def test_docs_serving_quotes_the_latest_offline_vllm_run():
    """benchmarks/bench_vllm_offline.py's kept run (results/bench/bench_vllm_offline.json): the
    offline engine in one process against vLLM's default, each size's medians and ratio, with the
    run's machine and date, and the same tokens in both."""
    run = json.loads((ROOT / "results" / "bench" / "bench_vllm_offline.json").read_text())
    doc = " ".join((ROOT / "docs" / "serving.md").read_text().split())
    assert run["machine"] in doc and run["date"] in doc
    for row in run["rows"]:
        one, apart = (statistics.median(row["seconds"][arm]) for arm in ("one process", "engine core and worker apart"))
        quote = (f"{row['prompts']} prompts x {row['new_tokens']} tokens {one:.0f} s against {apart:.0f} s "
                 f"(x{row['apart_over_one_process']:.2f})")
        assert row["same_tokens"] and quote in doc, quote
