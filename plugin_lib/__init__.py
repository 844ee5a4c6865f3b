"""plugin-repro: the Plugin of "Logits are All We Need to Adapt Closed Models" (ICML 2025).

The names a user of the method needs, importable from here; the subpackages are layered and
import one way only (a test checks it):

    core        the method: black box, reweighting model, combination, loss, training, decoding
    data        the paper's datasets and prompts          metrics    the seven metrics
    analysis    judges and text analyses of the studies
    harness     Profile (profiles.yaml), base models by name, methods and baselines, the runner
    report      tables, statistics, figures, claims, REPORT.md
    serving     a trained Plugin as an artifact, the plugin-repro command, an OpenAI-compatible endpoint
    experiments one module per notebook
    paper       the paper's published numbers (data files)

Attributes load on first use, so ``import plugin_lib`` stays cheap.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    # core: the method
    "BlackBoxLM": "core.blackbox",
    "TopKBlackBox": "core.blackbox",
    "ApiBlackBox": "core.api",
    "CompletionsClient": "core.api_client",
    "make_reweighter": "core.reweighter",
    "combine_log_probs": "core.combine",
    "plugin_loss": "core.loss",
    "encode_pairs": "core.pairs",
    "BaseOutputCache": "core.cache",
    "TokenObjective": "core.train",
    "TrainConfig": "core.train",
    "fit": "core.train",
    "PluginLogitsProcessor": "core.decode",
    "generate": "core.decode",
    # data and metrics
    "Example": "data.datasets",
    "load_dataset": "data.datasets",
    "split_hyper_validation": "data.datasets",
    "training_pairs": "data.datasets",
    "build_prompt": "data.prompts",
    "compute_metrics": "metrics",
    "METRIC_NAMES": "metrics",
    # harness: bases by name, profiles
    "load_base_model": "harness.models",
    "load_api_model": "harness.models",
    "Profile": "harness.profile",
    "load_profile": "harness.profile",
    # serving: a trained Plugin to ship
    "PluginModel": "serving.artifact",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'plugin_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
