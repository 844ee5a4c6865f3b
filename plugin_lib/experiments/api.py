"""Notebook 14, beyond the paper: a Plugin trained and decoded through an HTTP API.

The base is the offline SmolLM2-135M-Instruct as its GGUF file (Q4_1 weights), served by
llama-cpp-python's OpenAI-compatible server (``harness.api_server``) and reached only through
``POST /v1/completions`` (``core.api.ApiBlackBox``) at notebook 12's k. Beside it runs the
in-process top-k view of the same weights de-quantised to float32
(``core.blackbox.TopKBlackBox``), with the same data, prompts, settings and seeds, so every
difference comes from the server's arithmetic on Q4 weights (and its top-k keys), not from
the method.

Both run at the profile's ``api`` scale (``api_scale``) and store their runs under
``results/<profile>/api/runs``: the in-process view at this scale must not replace notebook 12's
runs of the same name. Each API run records what it cost (``api_usage``: requests, tokens,
seconds per phase).

Where no endpoint can be had (``api.server.start`` and llama-cpp-python's server not installed,
or no address for one's own endpoint), ``run_study`` says why and runs nothing: the notebook
still runs top to bottom.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..core.api import ApiBlackBox
from ..core.cache import BaseOutputCache
from ..harness import api_server, models
from ..harness.running import runner
from ..harness.machine import results_dir
from ..harness.profile import Profile
from ..metrics import METRIC_NAMES
from ..report import writer

API_LABEL, LOCAL_LABEL = "through the API", "in process"


def api_scale(profile: Profile) -> Profile:
    """The profile the study's runs are made at: the ``api`` section's rows and seeds, decoding
    ``api.decode_batch_size`` inputs at a time, stored under ``results/<profile>/api``."""
    api = profile.api
    return profile.replace(name=f"{profile.name}/api", rows=api.rows, seeds=api.seeds,
                           decoding=dataclasses.replace(profile.decoding, batch_size=api.decode_batch_size))


def view_names(profile: Profile) -> tuple[str, str]:
    """(the API model's view, the in-process view of the same weights) at the section's k."""
    api = profile.api
    suffix = f"@top{api.k}-{api.rule}"
    return api.model + suffix, api.compare + suffix


@contextmanager
def endpoint(profile: Profile, base_url: str | None = None) -> Iterator[tuple[str | None, str]]:
    """(address, note) of the endpoint to use; the address is None, and the note says why,
    where there is none. With ``api.server.start`` a llama-cpp-python server is started on the
    offline GGUF (its log under ``results/<profile>/logs``) and stopped on exit."""
    server = profile.api.server
    if base_url is not None or not server.start:
        variable = models.model_spec(profile.api.model).get("base_url_env", "PLUGIN_API_BASE_URL")
        url = base_url or os.environ.get(variable)
        yield (url, f"Endpoint {url} (given).") if url else (
            None, f"Skipped: this profile starts no server (api.server.start is false) and {variable} is not set.")
        return
    missing = api_server.llama_cpp_missing()
    if missing:
        yield None, f"Skipped: {missing}"
        return
    log = results_dir(profile) / "logs" / "llama_cpp_server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with api_server.LlamaCppServer(n_threads=server.n_threads, n_ctx=server.n_ctx, log_path=log) as running:
        yield running.base_url, (f"llama-cpp-python's server on {running.base_url} ({running.model_path.name}, "
                                 f"{server.n_threads} thread(s), n_ctx {server.n_ctx}), ready in "
                                 f"{running.started_in_s:.1f} s.")


@dataclass
class Study:
    """What notebook 14 measured. ``api_records`` is empty when no endpoint could be had
    (``note`` says why)."""

    profile: Profile
    dataset: str
    note: str
    api_records: list[dict] = field(default_factory=list)
    local_records: list[dict] = field(default_factory=list)
    closeness: pd.DataFrame | None = None
    echo: dict | None = None
    scatter: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def ran(self) -> bool:
        return bool(self.api_records)


def _run_methods(task, scale: Profile, methods: Sequence[str]) -> list[dict]:
    return [runner.run_experiment(task, method, seed, scale, progress=False)
            for method in methods for seed in (scale.seeds[:1] if method == "Zeroshot" else scale.seeds)]


def run_study(profile: Profile, dataset: str = "e2e", base_url: str | None = None) -> Study:
    """The methods of ``profile.api`` through the API and in process, the closeness of the
    two bases' distributions on the training targets, and echo against stepwise teacher
    forcing on ``api.echo_pairs`` pairs. Finished runs are read back, not redone."""
    scale = api_scale(profile)
    api_name, local_name = view_names(profile)
    with endpoint(profile, base_url) as (url, note):
        if url is None:
            return Study(profile, dataset, note)
        # Wall times depend on what else the machine runs: the load goes with them.
        note += f" Load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start."
        box = models.load_api_model(api_name, base_url=url)
        api_task = runner.load_task(box, dataset, scale)
        api_records = _run_methods(api_task, scale, profile.api.methods)
        echo = echo_against_stepwise(box, api_task.encoded("train")[: profile.api.echo_pairs], profile.api.k)
        api_cache = api_task.base_cache("train")
        note += f" Load average {os.getloadavg()[0]:.1f} when the API part ended."
    local_task = runner.load_task(local_name, dataset, scale)
    local_records = _run_methods(local_task, scale, profile.api.methods)
    pairs = api_task.encoded("train")
    closeness, scatter = compare_caches(api_cache, local_task.base_cache("train"), pairs, profile.api.k)
    if echo["closeness"]:
        closeness.loc["API, echo vs stepwise (same server)"] = pd.Series(echo["closeness"])
    return Study(profile, dataset, note, api_records, local_records, closeness, echo, scatter)


# ---------------------------------------------------------------- distributions


def _closeness(a: torch.Tensor, b: torch.Tensor, targets: torch.Tensor, k: int) -> dict[str, float]:
    """How alike two sets of completed top-k rows (N, V) are: the same best token, the share
    of top-k tokens in common, |difference| of the log-probabilities both report among their
    top k (mean and max), and of the target token's log-probability (what training sees)."""
    top_a, top_b = a.topk(k, dim=-1).indices, b.topk(k, dim=-1).indices
    shared = (top_a[:, :, None] == top_b[:, None, :]).any(-1)  # (N, k): a's top-k entry also in b's
    diff = (a.gather(1, top_a) - b.gather(1, top_a)).abs()[shared]
    target_diff = (a.gather(1, targets[:, None]) - b.gather(1, targets[:, None])).abs()
    return {
        "positions": a.shape[0],
        "same most likely token": (top_a[:, 0] == top_b[:, 0]).float().mean().item(),
        "top-k overlap": shared.float().mean().item(),
        "mean |diff| (shared top-k)": diff.mean().item(),
        "max |diff| (shared top-k)": diff.max().item(),
        "mean |diff| (target token)": target_diff.mean().item(),
    }


def _targets(pairs) -> torch.Tensor:
    return torch.tensor([t for p in pairs for t in p.input_ids[p.prompt_length:]])


def compare_caches(api: BaseOutputCache, local: BaseOutputCache, pairs, k: int
                   ) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]]:
    """The closeness table (one row: API, stepwise vs in process) and, for the figure, the
    log-probabilities of the tokens in both top k, in both (at most 20,000 points, evenly
    spaced; a token in one top k only has the other's completion value, not a log-probability)."""
    indices = range(len(pairs))
    a, b = api.get(indices).float(), local.get(indices).float()
    row = _closeness(a, b, _targets(pairs), k)
    top_a, top_b = a.topk(k, dim=-1).indices, b.topk(k, dim=-1).indices
    shared = (top_a[:, :, None] == top_b[:, None, :]).any(-1)
    x, y = b.gather(1, top_a)[shared].numpy(), a.gather(1, top_a)[shared].numpy()
    step = max(1, len(x) // 20_000)
    frame = pd.DataFrame([row], index=pd.Index(["API (stepwise) vs in process"], name="compared"))
    return frame, (x[::step], y[::step])


def echo_against_stepwise(box: ApiBlackBox, pairs, k: int) -> dict:
    """Scores ``pairs`` both ways under the same conditions, pair by pair: one echo request,
    then one request per target token. Per way: requests, prompt tokens and seconds, and how
    alike the two ways' rows are (the server's numbers depend on how many tokens it evaluates
    at once). Echo first: a request reuses the server's cache of the previous prompt, so after
    the stepwise requests an echo would return their rows again."""
    ways = {way: {"pairs": len(pairs), "requests": 0, "prompt_tokens": 0, "seconds": 0.0}
            for way in ("echo", "stepwise")}
    if not pairs:
        return {**ways, "closeness": {}}
    box.detect_echo_alignment()  # its probe requests are not the pairs' cost
    rows = {"echo": [], "stepwise": []}
    for pair in pairs:
        ids, lengths = list(pair.input_ids), list(range(pair.prompt_length, len(pair.input_ids)))
        for way in ("echo", "stepwise"):
            before, started = box.usage.snapshot(), time.perf_counter()
            if way == "echo":
                found = box.echo_log_probs(ids, lengths, phase="checks")
                found.update({n: box.next_token_log_probs(ids[:n], phase="checks")  # none for chat prompts
                              for n in lengths if n not in found})
            else:
                found = {n: box.next_token_log_probs(ids[:n], phase="checks") for n in lengths}
            spent = box.usage.minus(before).phases["checks"]
            ways[way]["seconds"] += time.perf_counter() - started
            ways[way]["requests"] += spent.requests
            ways[way]["prompt_tokens"] += spent.prompt_tokens
            rows[way] += [found[n] for n in lengths]
    closeness = _closeness(torch.stack(rows["echo"]), torch.stack(rows["stepwise"]), _targets(pairs), k)
    return {**ways, "alignment": box.echo_alignment, "closeness": closeness}


# ---------------------------------------------------------------- tables and figure


def _usage_sum(records: Sequence[dict], phase: str) -> dict[str, float]:
    total: dict[str, float] = {}
    for record in records:
        for key, value in record.get("api_usage", {}).get(phase, {}).items():
            total[key] = total.get(key, 0) + value
    return total


def cost_table(study: Study) -> pd.DataFrame:
    """Requests, prompt tokens and seconds per training pair (teacher forcing, stepwise as run
    and echo as measured) and per generated token (decoding; EOS included), from the runs'
    ``api_usage``. Every decoding request sends the whole text so far: prompt tokens per
    generated token are what a hosted API bills."""
    forcing, decoding = _usage_sum(study.api_records, "teacher_forcing"), _usage_sum(study.api_records, "decoding")
    echo = study.echo or {}
    rows = {"teacher forcing, stepwise (the runs)": ("training pair", forcing.get("items", 0),
                                                     forcing.get("requests", 0), forcing.get("prompt_tokens", 0),
                                                     forcing.get("seconds", 0.0))}
    for way in ("stepwise", "echo"):
        measured = echo.get(way, {})
        rows[f"teacher forcing, {way} (side by side)"] = (
            "training pair", measured.get("pairs", 0), measured.get("requests", 0), measured.get("prompt_tokens", 0),
            measured.get("seconds", 0.0))
    rows["decoding (the runs)"] = ("generated token", decoding.get("items", 0), decoding.get("requests", 0),
                                   decoding.get("prompt_tokens", 0), decoding.get("seconds", 0.0))
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["per", "units", "requests", "prompt tokens",
                                                                   "seconds"])
    units = table["units"].where(table["units"] > 0)
    for column in ("requests", "prompt tokens", "seconds"):
        table[f"{column} per unit"] = table[column] / units
    table.index.name = "phase"
    return table


def metrics_table(study: Study) -> pd.DataFrame:
    """Per method and seed: the seven metrics through the API and in process, and on how many
    test inputs the two give the same output."""
    local = {(r["method"], r["seed"]): r for r in study.local_records}
    rows = []
    for record in study.api_records:
        twin = local[(record["method"], record["seed"])]
        same = np.mean([a == b for a, b in zip(record["predictions"], twin["predictions"])])
        for label, run in ((API_LABEL, record), (LOCAL_LABEL, twin)):
            rows.append({"method": record["method"], "seed": record["seed"], "base": label, **run["metrics"],
                         "same output as the other": same})
    # The paper's metric order, whether the runs were computed now or read back from the store.
    return pd.DataFrame(rows, columns=["method", "seed", "base", *METRIC_NAMES, "same output as the other"])


def caption(study: Study) -> str:
    first = study.api_records[0]
    scale = first["scale"]
    api = study.profile.api
    return (f"{study.dataset}: the base through an HTTP API ({view_names(study.profile)[0]}) and in process "
            f"({view_names(study.profile)[1]}), top-{api.k} log-probabilities ({api.rule}); trained on "
            f"{scale['train_pairs']} pairs ({scale['train_inputs']} inputs), early stopping on "
            f"{scale['hyper_inputs']} inputs, tested on {scale['test_inputs']} inputs; seeds {list(api.seeds)}. "
            f"{study.note}")


def save_tables(study: Study) -> dict[str, pd.DataFrame]:
    """``api_<dataset>`` (metrics), ``api_<dataset>_cost`` and ``api_<dataset>_closeness`` under
    the notebook's profile; when the study did not run, only a record of why (the report says
    the notebook ran and skipped, not that it never ran)."""
    name = f"api_{study.dataset}"
    if not study.ran:
        writer.save_skip(name, study.profile, study.note.removeprefix("Skipped: "))
        return {}
    tables = {name: metrics_table(study), f"{name}_cost": cost_table(study),
              f"{name}_closeness": study.closeness}
    for key, table in tables.items():
        writer.save_table(table, key, study.profile, caption(study) if key == name else "")
    return tables


def plot_study(study: Study):
    """Left: the API's top-k log-probabilities against the in-process ones at the training
    targets' positions. Right: each method's metrics through the API and in process. None when
    the study did not run."""
    import matplotlib.pyplot as plt

    if not study.ran:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1, 1.6]})
    x, y = study.scatter
    left.scatter(x, y, s=2, alpha=0.25)
    low = float(min(x.min(), y.min()))
    left.plot([low, 0], [low, 0], color="black", linewidth=0.8)
    left.set_xlabel("in process (float32, de-quantised)")
    left.set_ylabel("through the API (llama.cpp, Q4_1)")
    left.set_title(f"tokens in both top-{study.profile.api.k}s at the training targets")
    table = metrics_table(study)
    metrics = [m for m in METRIC_NAMES if m not in ("NIST", "CIDEr")]  # the [0, 1] metrics share an axis
    long = table.melt(id_vars=["method", "base"], value_vars=metrics, var_name="metric")
    long["group"] = long["method"] + ", " + long["base"]
    groups = list(dict.fromkeys(long["group"]))
    width = 0.8 / len(groups)
    for j, group in enumerate(groups):
        values = long[long["group"] == group].groupby("metric", sort=False)["value"].mean().reindex(metrics)
        right.bar(np.arange(len(metrics)) + j * width, values, width, label=group)
    right.set_xticks(np.arange(len(metrics)) + 0.4 - width / 2, metrics, rotation=30, ha="right")
    right.legend(fontsize=9)
    right.set_title(f"{study.dataset}: metrics through the API and in process")
    fig.tight_layout()
    plt.close(fig)
    return fig


def summary_lines(study: Study) -> list[str]:
    """The study in a few sentences: closeness, cost, and how far the metrics moved."""
    if not study.ran:
        return [study.note]
    cost = cost_table(study)
    close = study.closeness.iloc[0]
    table = metrics_table(study)
    lines = [study.note]
    lines.append(f"Distributions at {int(close['positions'])} training positions: the same most likely token at "
                 f"{close['same most likely token']:.1%}, {close['top-k overlap']:.1%} of the top-{study.profile.api.k} "
                 f"in common, mean |diff| {close['mean |diff| (shared top-k)']:.3f} nats (max "
                 f"{close['max |diff| (shared top-k)']:.2f}) on shared entries.")
    for phase, row in cost.iterrows():
        if row["units"] > 0:
            lines.append(f"{phase}: {row['requests per unit']:.1f} requests, {row['prompt tokens per unit']:.0f} "
                         f"prompt tokens and {row['seconds per unit']:.2f} s per {row['per']}.")
    for (method, seed), block in table.groupby(["method", "seed"], sort=False):
        api_row, local_row = (block[block["base"] == label].iloc[0] for label in (API_LABEL, LOCAL_LABEL))
        gaps = ", ".join(f"{m} {api_row[m] - local_row[m]:+.4f}" for m in ("BLEU", "ROUGE-L", "METEOR"))
        lines.append(f"{method} (seed {seed}): API minus in process {gaps}; the same output on "
                     f"{api_row['same output as the other']:.0%} of the test inputs.")
    return lines
