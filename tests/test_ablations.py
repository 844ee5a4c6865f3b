"""Ablations: the fine-tuning pool, the reweighting-model variants, and the claim checks."""
import json
import math

import pandas as pd
import pytest
import torch

from plugin_lib import data
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.experiments import ablations, base_quality
from plugin_lib.harness.baselines import finetune
from plugin_lib.harness import models, tasks
from plugin_lib.harness.running import run_store, search
from plugin_lib.harness.baselines import variants as reweighting_variants
from plugin_lib.harness.models import load_causal_lm
from plugin_lib.harness.baselines.variants import (Variant, architecture_variants, complexity_variants, expert_variant,
                                                   truncated_pretrained, variant_frame, variant_runs)
from plugin_lib.harness.profile import ablation_seeds, ablation_settings, load_profile
from plugin_lib.metrics import METRIC_NAMES
from plugin_lib.report import claim_checks, tables
from plugin_lib.utils.io import read_json

import real_data


@pytest.fixture
def data_dir():
    return real_data.require("e2e", "webnlg", "commongen", "adidas")


# ---------------------------------------------------------------- fine-tuning pool


@pytest.mark.parametrize("dataset, origin", [("e2e", "val-outside120"), ("webnlg", "train"),
                                             ("commongen", "train"), ("adidas", "val-outside120")])
def test_finetune_pool_is_disjoint_from_plugin_data_and_test(data_dir, smollm2, dataset, origin):
    profile = load_profile("local")
    pool = finetune.finetune_pool(dataset, profile, max_pairs=300)
    task = tasks.make_task(smollm2, dataset, profile)
    pool_inputs = {ex.source for ex in pool.examples}
    assert not pool_inputs & {ex.source for ex in task.train + task.hyper}
    assert not pool_inputs & {ex.source for ex in data.load_dataset(dataset, "test")}
    pairs = len(data.training_pairs(pool.examples))
    assert 250 < pairs <= 300 and pool.name == f"{origin}-{pairs}pairs"
    assert [ex.id for ex in finetune.finetune_pool(dataset, profile, max_pairs=300).examples] == \
        [ex.id for ex in pool.examples]  # deterministic


# ---------------------------------------------------------------- reweighting-model variants


def test_truncated_pretrained_reweighter_has_base_vocabulary_and_k_layers(smollm2, monkeypatch, tmp_path):
    converted = models.converted_smollm2_dir()  # the real converted base, not a new conversion
    monkeypatch.setattr(models, "converted_smollm2_dir", lambda: converted)
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path))
    path = truncated_pretrained("smollm2-135m-instruct", 2)
    reweighter = make_reweighter("pretrained", smollm2.vocab_size, pretrained=str(path))
    assert reweighter.get_output_embeddings().weight.shape[0] == smollm2.vocab_size
    assert len(reweighter.model.layers) == reweighter.config.num_hidden_layers == 2
    # The truncated model is built on the CPU in float32: compare with the base there too.
    original, _ = load_causal_lm("smollm2-135m-instruct", dtype=torch.float32, device="cpu")
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert torch.equal(reweighter.state_dict()[name], original.state_dict()[name])

    def must_not_load(*args, **kwargs):
        raise AssertionError("the truncated model was built again")

    monkeypatch.setattr(models, "load_causal_lm", must_not_load)
    assert truncated_pretrained("smollm2-135m-instruct", 2) == path


def test_a_twins_stand_in_is_built_at_its_depth_without_the_full_twin(monkeypatch, tmp_path):
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path))

    def must_not_load(*args, **kwargs):
        raise AssertionError("the full twin was built to be cut (LLaMA-3.1-8B's would take 32 GB)")

    monkeypatch.setattr(models, "load_causal_lm", must_not_load)
    path = truncated_pretrained("llama-3.1-8b-twin-small", 1)
    reweighter = make_reweighter("pretrained", models.model_config("llama-3.1-8b-twin-small").vocab_size,
                                 pretrained=str(path))
    assert reweighter.config.num_hidden_layers == 1
    assert json.loads((path / "truncated.json").read_text())["layers_of_source"] == \
        models.model_config("llama-3.1-8b-twin-small").num_hidden_layers
    assert truncated_pretrained("llama-3.1-8b-twin-small", 1) == path  # saved once


def test_complexity_variants(monkeypatch):
    monkeypatch.setattr(reweighting_variants, "truncated_pretrained", lambda model, k: f"/cache/{model}-first{k}layers")
    variants = complexity_variants("smollm2-135m-instruct", [1, 2, 12], 4)
    assert [v.label for v in variants] == ["Plugin", "Plugin-2L", "Plugin-12L", "Plugin-pretrained"]
    assert variants[0].arch is None  # the main tables' Plugin run, shared
    assert variants[1].arch == {**search.arch_for("smollm2-135m-instruct"), "n_layer": 2}
    assert variants[3].arch == {"arch": "pretrained", "pretrained": "/cache/smollm2-135m-instruct-first4layers"}
    gpt2 = complexity_variants("gpt2-medium", [1], None)
    assert gpt2[-1].arch == {"arch": "pretrained", "pretrained": "gpt2"}  # the paper's GPT2-Small
    # One Plugin-pretrained run per base: notebook 15's pretrained model is notebook 07's.
    for model, layers in (("gpt2-medium", None), ("llama-3.1-8b", None), ("smollm2-135m-instruct", 4)):
        assert complexity_variants(model, [1], layers)[-1].arch == expert_variant(model, layers).arch
    assert expert_variant("llama-3.1-8b", None).arch["pretrained"] == "meta-llama/Llama-3.2-1B"
    with pytest.raises(ValueError, match="pretrained_layers"):
        complexity_variants("smollm2-135m-instruct", [1], None)


@pytest.fixture
def tiny_task(tiny_base, monkeypatch, tmp_path):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    real_spec = models.model_spec
    monkeypatch.setattr(models, "model_spec", lambda name: {"name": name, "source": "test", "family": "llama"}
                        if name == "tiny-llama" else real_spec(name))

    def example(i, split):
        return data.Example(f"toy-{split}-{i}", f"name[Item {i}], food[Thai]", (f"Item {i} serves Thai food.",),
                            {"dataset": "e2e", "split": split})

    return tasks.Task(tiny_base, "e2e", "llama", train=[example(i, "validation") for i in range(4)],
                        hyper=[example(i, "validation") for i in range(4, 6)],
                        test=[example(i, "test") for i in range(2)])


def test_architecture_variants_are_distinct_runs(tiny_task):
    profile = load_profile("smoke", decoding={"max_new_tokens": 3, "repetition_penalty": 1.1, "batch_size": 4})
    variants = architecture_variants("tiny-llama")
    records = variant_runs(tiny_task, profile, variants, seeds=[0])
    assert [r["method"] for r in records] == ["Zeroshot", "Plugin", "Plugin-MLP", "Plugin-linear"]
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    weights = {v.label: set(torch.load(folder / f"{v.label}-best.pt")) for v in variants}
    assert any(k.startswith("model.layers.0.") for k in weights["Plugin"])
    assert any(k.startswith("trunk_layers.") for k in weights["Plugin-MLP"])
    assert not any(k.startswith("trunk_layers.") for k in weights["Plugin-linear"])
    losses = [r["training"]["val_loss"] for r in records[1:]]
    assert len(set(losses)) == 3
    assert all((folder / f"{r['method']}-seed0.json").exists() for r in records)

    sizes = variant_frame(tiny_task, variants)
    assert list(sizes.label) == ["Plugin", "Plugin-MLP", "Plugin-linear"] and sizes.parameters.is_unique
    # Random initialisations are nearly uniform: alone about log(vocabulary size) nats.
    assert ((sizes["loss alone at init"] - math.log(tiny_task.base.vocab_size)).abs() < 1.0).all()
    # ... so each Plugin starts at about the base's own loss.
    assert sizes["Plugin loss at init"].max() - sizes["Plugin loss at init"].min() < 0.5


def test_deeper_models_can_reuse_the_one_layer_choice(tiny_task):
    profile = load_profile("smoke", decoding={"max_new_tokens": 2, "repetition_penalty": 1.1, "batch_size": 4},
                           grid={"lr": [1e-3, 5e-3], "weight_decay": [0.01], "alpha": [0.5], "extend_edges": 0})
    small = {"arch": "llama", "hidden_size": 16, "intermediate_size": 32}
    variants = [Variant("Plugin", None, "1 layer"),
                Variant("Plugin-2L", {**small, "n_layer": 2}, "2 layers")]
    records = variant_runs(tiny_task, profile, variants, seeds=[0], hparams="one-layer")
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    one_layer = read_json(folder / "Plugin-selection.json")
    deeper = read_json(folder / "Plugin-2L-selection.json")
    assert len(one_layer["configs"]) == 2 and list(deeper["configs"]) == [one_layer["best"]]
    assert records[1]["hparams"] == records[2]["hparams"]
    with pytest.raises(ValueError, match="hparams"):
        variant_runs(tiny_task, profile, variants, seeds=[0], hparams="best")


def test_settings_per_profile():
    smoke, local = load_profile("smoke"), load_profile("local")
    assert list(ablation_settings(smoke).layers) == [1, 2]
    assert list(ablation_settings(local, layers=None).layers) == [1, 2, 4, 8, 12]
    assert ablation_settings(local).complexity_hparams == "one-layer"
    assert list(ablation_settings(local, layers=[1, 4]).layers) == [1, 4]
    with pytest.raises(ValueError, match="Unknown ablation setting"):
        ablation_settings(local, depth=3)
    assert ablation_seeds(ablation_settings(local), "architecture", local) == [0, 1, 2]


# ---------------------------------------------------------------- claim checks on hand-made numbers


def _summary(scores: dict[tuple[str, str], list[float]], metrics=METRIC_NAMES) -> pd.DataFrame:
    """``tables.summarize`` of runs whose every metric equals the given value per seed."""
    rows = [{"model": model, "method": method, "seed": seed, **dict.fromkeys(metrics, value)}
            for (model, method), values in scores.items() for seed, value in enumerate(values)]
    return tables.summarize(pd.DataFrame(rows))


ORDER = ["0FT", "1FT", "2FT", "5FT"]


def _bases(fake_run, own: list[float], plugin: list[list[float]], good=(0, 12)) -> list[dict]:
    """base_quality_runs-like records: Zeroshot (own score) and Plugin per seed on each base."""
    records = []
    for epochs, own_score, plugin_scores in zip((0, 1, 2, 5), own, plugin):
        records.append(fake_run("Zeroshot", 0, good=good[0], score=own_score, finetune_epochs=epochs))
        records += [fake_run("Plugin", seed, good=good[1], score=score, finetune_epochs=epochs)
                    for seed, score in enumerate(plugin_scores)]
    return records


def test_base_quality_needs_seeds_for_more_than_direction(fake_run):
    # One seed: the Plugin rises with the base, but no interval exists: at most direction only.
    one_seed = _bases(fake_run, [0.1, 0.2, 0.3, 0.4], [[0.30], [0.32], [0.34], [0.36]])
    check = base_quality.check_base_quality(one_seed, ORDER)
    assert check["verdict"] == "direction only" and check["statistic"]["n"]["seeds"] == 1
    assert check["statistic"]["per metric"]["BLEU"]["best base"] == "5FT"
    assert check["rule"] == base_quality.BASE_QUALITY_RULE
    # Three seeds, every difference positive: the t-interval lies above 0.
    steady = _bases(fake_run, [0.1, 0.2, 0.3, 0.4], [[0.30, 0.31, 0.29], [0.3] * 3, [0.3] * 3, [0.36, 0.38, 0.35]])
    assert base_quality.check_base_quality(steady, ORDER)["verdict"] == "reproduced"
    # The issue's case: a gain inside the seeds' noise (0.2325 -> 0.2377, std 0.013).
    noisy = _bases(fake_run, [0.1, 0.2, 0.3, 0.4], [[0.2325, 0.245, 0.220], [0.2] * 3, [0.2] * 3, [0.2377, 0.235, 0.240]])
    assert base_quality.check_base_quality(noisy, ORDER)["verdict"] == "direction only"
    falling = _bases(fake_run, [0.1, 0.2, 0.3, 0.4], [[0.4] * 3, [0.38] * 3, [0.36] * 3, [0.35, 0.36, 0.34]])
    assert base_quality.check_base_quality(falling, ORDER)["verdict"] == "not reproduced"
    # Fine-tuning did not improve the base: the premise fails.
    worse = _bases(fake_run, [0.4, 0.3, 0.2, 0.1], [[0.3] * 3, [0.3] * 3, [0.3] * 3, [0.4] * 3])
    assert base_quality.check_base_quality(worse, ORDER)["verdict"] == "not measurable at this scale"


def test_base_quality_reports_spearman_exactly(fake_run):
    # Local E2E ROUGE-L: the base dips at 2FT, the Plugin does not: rho = 4/5, reported, not thresholded.
    records = _bases(fake_run, [0.3201, 0.4153, 0.4057, 0.4592], [[0.4007], [0.4078], [0.4175], [0.4293]])
    check = base_quality.check_base_quality(records, ORDER)
    assert check["statistic"]["per metric"]["ROUGE-L"]["spearman rho (exact)"] == "4/5 (0.800)"
    assert "ROUGE-L 4/5 (0.800)" in check["ours"]


def test_plugin_beats_base_on_every_base(fake_run):
    records = _bases(fake_run, [0.1, 0.2, 0.3, 0.4], [[0.3, 0.31], [0.4, 0.41], [0.5, 0.51], [0.6, 0.61]])
    check = base_quality.check_plugin_beats_base(records, ORDER, n_resamples=20)
    assert check["verdict"] == "reproduced" and set(check["statistic"]["per base"]) == set(ORDER)
    # On the strongest base the Plugin's outputs are no better and its mean is lower.
    records = [r for r in records if r["finetune_epochs"] != 5]
    records += [fake_run("Zeroshot", 0, score=0.7, finetune_epochs=5)]
    records += [fake_run("Plugin", seed, score=0.6, finetune_epochs=5) for seed in (0, 1)]
    check = base_quality.check_plugin_beats_base(records, ORDER, n_resamples=20)
    assert check["verdict"] == "not reproduced" and "on 3/4 bases" in check["statistic"]["summary"]


def test_complexity_checks(fake_run):
    records = [fake_run("Zeroshot", good=0, score=0.2), fake_run("Plugin", good=12, score=0.4),
               fake_run("Plugin-2L", good=12, score=0.41), fake_run("Plugin-pretrained", good=12, score=0.45)]
    single, more, pretrained = ablations.complexity_checks(records, 20, "one-layer")
    assert single["verdict"] == "reproduced"
    # 2 layers: a higher mean but the same outputs, so no test passes: the null claim holds.
    assert more["verdict"] == "reproduced" and "0/1 deeper" in more["statistic"]["summary"]
    # Reusing the 1-layer hyperparameters is no fair test of the pretrained initialisation.
    assert pretrained["verdict"] == "not measurable at this scale"
    assert "own learning-rate selection" in pretrained["ours"]
    assert ablations.check_pretrained(records, 20, "own")["verdict"] == "direction only"  # same outputs

    records[1] = fake_run("Plugin", good=6, score=0.4)
    records.append(fake_run("Plugin-4L", good=12, score=0.42))
    more = ablations.check_more_layers(records, 20)
    assert more["verdict"] == "not reproduced" and "significantly better: Plugin-2L, Plugin-4L" in more["ours"]
    assert ablations.check_pretrained(records, 20, "own")["verdict"] == "reproduced"
    assert ablations.check_single_layer_gain([fake_run("Zeroshot", good=6, score=0.45), records[1]], 20)["verdict"] \
        == "not reproduced"
    none_deeper = ablations.check_more_layers(records[:2], 20)
    assert none_deeper["verdict"] == "not measurable at this scale"


def test_architecture_checks(fake_run):
    def runs(label, good, scores):
        return [fake_run(label, seed, good=good, score=s) for seed, s in enumerate(scores)]

    records = ([fake_run("Zeroshot", good=0, score=0.1)] + runs("Plugin", 12, [0.40, 0.41, 0.40])
               + runs("Plugin-MLP", 0, [0.30, 0.36, 0.33]) + runs("Plugin-linear", 0, [0.20, 0.28, 0.25]))
    means, spread = ablations.architecture_checks(records, 20)
    assert means["verdict"] == "reproduced" and means["statistic"]["best other per bootstrap metric"]["BLEU"] == "Plugin-MLP"
    # Narrowest bands: no test with a few seeds, so at most direction only.
    assert spread["verdict"] == "direction only" and spread["rule"] == ablations.SPREAD_RULE

    for record in records:
        if record["method"] == "Plugin-MLP":
            record["metrics"]["NIST"] = 0.5
    means = ablations.check_architecture(records, 20)
    assert means["verdict"] == "not reproduced" and "6/7 metrics" in means["ours"] and "NIST Plugin-MLP" in means["ours"]
    one_seed = [r for r in records if r["seed"] == 0]
    assert ablations.check_architecture_spread(one_seed)["verdict"] == "not measurable at this scale"


def test_ablation_checks_become_claims(fake_run, tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    records = [fake_run("Zeroshot", good=0, score=0.2), fake_run("Plugin", good=12, score=0.4)]
    checks = ablations.complexity_checks(records, 10, "own")[:2]
    entries = claim_checks.record("local", checks, "complexity", "e2e", "Figure 3")
    assert [e["key"] for e in entries] == ["complexity_e2e_0", "complexity_e2e_1"]
    assert [e["verdict"] for e in entries] == ["direction only", "not measurable at this scale"]  # 1/11 > 0.05
    assert entries[0]["rule"] == ablations.SINGLE_LAYER_RULE and entries[0]["claim"] == "e2e: one layer improves on the base"
    assert list(claim_checks.frame(checks).columns) == ["claim", "verdict", "ours", "statistic"]


def test_figures_have_a_panel_per_metric():
    summary = _summary({**{(b, "Zeroshot"): [0.1 + 0.1 * i] for i, b in enumerate(ORDER)},
                        **{(b, "Plugin"): [0.2 + 0.1 * i, 0.25 + 0.1 * i] for i, b in enumerate(ORDER)}})
    fig = base_quality.plot_base_quality(summary, ORDER)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == list(METRIC_NAMES)

    variants = [Variant("Plugin", None, "1 layer"), Variant("Plugin-2L", {}, "2 layers")]
    one_model = _summary({("m", "Zeroshot"): [0.1], ("m", "Plugin"): [0.4], ("m", "Plugin-2L"): [0.3]})
    fig = ablations.plot_complexity(one_model, variants)
    assert [ax.get_title() for ax in fig.axes] == ["BLEU", "ROUGE-L"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1 layer", "2 layers"]
    fig = ablations.plot_architecture(one_model, variants)
    assert [len(ax.lines) for ax in fig.axes] == [2, 2]
