"""Ablations: the fine-tuning pool, the reweighting-model variants, and the claim checks."""
import math
import os

import pandas as pd
import pytest
import torch

from plugin_lib import data
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.experiments import ablations
from plugin_lib.harness import finetune, methods, models, runner
from plugin_lib.harness.models import load_causal_lm
from plugin_lib.harness.profile import load_profile
from plugin_lib.metrics import METRIC_NAMES
from plugin_lib.report import tables
from plugin_lib.utils.io import read_json


@pytest.fixture
def data_dir():
    if not os.environ.get("PLUGIN_DATA_DIR"):
        pytest.skip("PLUGIN_DATA_DIR is unset: the pool is checked on the real offline data.")


# ---------------------------------------------------------------- fine-tuning pool


@pytest.mark.parametrize("dataset, origin", [("e2e", "val-outside120"), ("webnlg", "train"),
                                             ("commongen", "train"), ("adidas", "val-outside120")])
def test_finetune_pool_is_disjoint_from_plugin_data_and_test(data_dir, smollm2, dataset, origin):
    profile = load_profile("local")
    pool = finetune.finetune_pool(dataset, profile, max_pairs=300)
    task = methods.make_task(smollm2, dataset, profile)
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
    path = ablations.truncated_pretrained("smollm2-135m-instruct", 2)
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
    assert ablations.truncated_pretrained("smollm2-135m-instruct", 2) == path


def test_complexity_variants(monkeypatch):
    monkeypatch.setattr(ablations, "truncated_pretrained", lambda model, k: f"/cache/{model}-first{k}layers")
    variants = ablations.complexity_variants("smollm2-135m-instruct", [1, 2, 12], 4)
    assert [v.label for v in variants] == ["Plugin", "Plugin-2L", "Plugin-12L", "Plugin-pretrained"]
    assert variants[0].arch is None  # the main tables' Plugin run, shared
    assert variants[1].arch == {**runner.arch_for("smollm2-135m-instruct"), "n_layer": 2}
    assert variants[3].arch == {"arch": "pretrained", "pretrained": "/cache/smollm2-135m-instruct-first4layers"}
    gpt2 = ablations.complexity_variants("gpt2-medium", [1], None)
    assert gpt2[-1].arch == {"arch": "pretrained", "pretrained": "gpt2"}  # the paper's GPT2-Small
    with pytest.raises(ValueError, match="pretrained_layers"):
        ablations.complexity_variants("smollm2-135m-instruct", [1], None)


@pytest.fixture
def tiny_task(tiny_base, monkeypatch, tmp_path):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    real_spec = models.model_spec
    monkeypatch.setattr(models, "model_spec", lambda name: {"name": name, "source": "test", "family": "llama"}
                        if name == "tiny-llama" else real_spec(name))

    def example(i, split):
        return data.Example(f"toy-{split}-{i}", f"name[Item {i}], food[Thai]", (f"Item {i} serves Thai food.",),
                            {"dataset": "e2e", "split": split})

    return methods.Task(tiny_base, "e2e", "llama", train=[example(i, "validation") for i in range(4)],
                        hyper=[example(i, "validation") for i in range(4, 6)],
                        test=[example(i, "test") for i in range(2)])


def test_architecture_variants_are_distinct_runs(tiny_task):
    profile = load_profile("smoke", decoding={"max_new_tokens": 3, "repetition_penalty": 1.1, "batch_size": 4})
    variants = ablations.architecture_variants("tiny-llama")
    records = ablations.variant_runs(tiny_task, profile, variants, seeds=[0])
    assert [r["method"] for r in records] == ["Zeroshot", "Plugin", "Plugin-MLP", "Plugin-linear"]
    folder = runner.runs_dir(profile, "e2e", "tiny-llama")
    weights = {v.label: set(torch.load(folder / f"{v.label}-best.pt")) for v in variants}
    assert any(k.startswith("model.layers.0.") for k in weights["Plugin"])
    assert any(k.startswith("trunk_layers.") for k in weights["Plugin-MLP"])
    assert not any(k.startswith("trunk_layers.") for k in weights["Plugin-linear"])
    losses = [r["training"]["val_loss"] for r in records[1:]]
    assert len(set(losses)) == 3
    assert all((folder / f"{r['method']}-seed0.json").exists() for r in records)

    sizes = ablations.variant_frame(tiny_task, variants)
    assert list(sizes.label) == ["Plugin", "Plugin-MLP", "Plugin-linear"] and sizes.parameters.is_unique
    # Random initialisations are nearly uniform: alone about log(vocabulary size) nats.
    assert ((sizes["loss alone at init"] - math.log(tiny_task.base.vocab_size)).abs() < 1.0).all()
    # ... so each Plugin starts at about the base's own loss.
    assert sizes["Plugin loss at init"].max() - sizes["Plugin loss at init"].min() < 0.5


def test_deeper_models_can_reuse_the_one_layer_choice(tiny_task):
    profile = load_profile("smoke", decoding={"max_new_tokens": 2, "repetition_penalty": 1.1, "batch_size": 4},
                           grid={"lr": [1e-3, 5e-3], "weight_decay": [0.01], "alpha": [0.5]})
    small = {"arch": "llama", "hidden_size": 16, "intermediate_size": 32}
    variants = [ablations.Variant("Plugin", None, "1 layer"),
                ablations.Variant("Plugin-2L", {**small, "n_layer": 2}, "2 layers")]
    records = ablations.variant_runs(tiny_task, profile, variants, seeds=[0], hparams="one-layer")
    folder = runner.runs_dir(profile, "e2e", "tiny-llama")
    one_layer = read_json(folder / "Plugin-selection.json")
    deeper = read_json(folder / "Plugin-2L-selection.json")
    assert len(one_layer["configs"]) == 2 and list(deeper["configs"]) == [one_layer["best"]]
    assert records[1]["hparams"] == records[2]["hparams"]
    with pytest.raises(ValueError, match="hparams"):
        ablations.variant_runs(tiny_task, profile, variants, seeds=[0], hparams="best")


def test_settings_per_profile():
    smoke, local = load_profile("smoke"), load_profile("local")
    assert list(ablations.settings(smoke).layers) == [1, 2]
    assert list(ablations.settings(local, layers=None).layers) == [1, 2, 4, 8, 12]
    assert ablations.settings(local).complexity_hparams == "one-layer"
    assert list(ablations.settings(local, layers=[1, 4]).layers) == [1, 4]
    with pytest.raises(ValueError, match="Unknown ablation setting"):
        ablations.settings(local, depth=3)
    assert ablations.seeds_for(ablations.settings(local), "architecture", local) == [0, 1, 2]


# ---------------------------------------------------------------- claim checks on hand-made numbers


def _summary(scores: dict[tuple[str, str], list[float]], metrics=METRIC_NAMES) -> pd.DataFrame:
    """``tables.summarize`` of runs whose every metric equals the given value per seed."""
    rows = [{"model": model, "method": method, "seed": seed, **dict.fromkeys(metrics, value)}
            for (model, method), values in scores.items() for seed, value in enumerate(values)]
    return tables.summarize(pd.DataFrame(rows))


ORDER = ["0FT", "1FT", "2FT", "5FT"]


def test_base_quality_claims():
    rising = _summary({**{(b, "Zeroshot"): [0.1 + 0.1 * i] for i, b in enumerate(ORDER)},
                       **{(b, "Plugin"): [0.2 + 0.1 * i] for i, b in enumerate(ORDER)}})
    assert ablations.check_base_quality(rising, ORDER).startswith("Supported")
    assert "7/7 metrics" in ablations.check_base_quality(rising, ORDER)
    assert ablations.check_plugin_beats_base(rising, ORDER).startswith("Supported")

    falling = _summary({**{(b, "Zeroshot"): [0.1 + 0.1 * i] for i, b in enumerate(ORDER)},
                        **{(b, "Plugin"): [0.5 - 0.05 * i] for i, b in enumerate(ORDER)}})
    assert ablations.check_base_quality(falling, ORDER).startswith("Not supported")
    # The Plugin (0.35) falls below the 5FT base (0.4): not an improvement on every base.
    assert ablations.check_plugin_beats_base(falling, ORDER).startswith("Not supported")


def test_base_quality_allows_one_neighbour_swap():
    # Local E2E ROUGE-L: the base dips at 2FT, the Plugin does not (rho = 0.8 exactly).
    base, plugin = [0.3201, 0.4153, 0.4057, 0.4592], [0.4007, 0.4078, 0.4175, 0.4293]
    one_swap = _summary({**{(b, "Zeroshot"): [v] for b, v in zip(ORDER, base)},
                         **{(b, "Plugin"): [v] for b, v in zip(ORDER, plugin)}})
    verdict = ablations.check_base_quality(one_swap, ORDER)
    assert verdict.startswith("Supported") and "7/7 metrics" in verdict and "BLEU 0.80" in verdict


def test_complexity_claims():
    paper_like = _summary({("m", "Zeroshot"): [0.2], ("m", "Plugin"): [0.4], ("m", "Plugin-2L"): [0.39],
                           ("m", "Plugin-4L"): [0.37], ("m", "Plugin-pretrained"): [0.45]})
    assert ablations.check_single_layer_gain(paper_like).startswith("Supported")
    assert ablations.check_more_layers(paper_like).startswith("Supported")
    assert ablations.check_pretrained(paper_like).startswith("Supported")

    deeper_wins = _summary({("m", "Zeroshot"): [0.45], ("m", "Plugin"): [0.4], ("m", "Plugin-2L"): [0.39],
                            ("m", "Plugin-4L"): [0.42], ("m", "Plugin-pretrained"): [0.3]})
    assert ablations.check_single_layer_gain(deeper_wins).startswith("Not supported")
    verdict = ablations.check_more_layers(deeper_wins)
    assert verdict.startswith("Not supported") and "best deeper Plugin-4L 0.4200" in verdict
    assert ablations.check_pretrained(deeper_wins).startswith("Not supported")
    one_layer_only = _summary({("m", "Zeroshot"): [0.2], ("m", "Plugin"): [0.4]})
    assert ablations.check_more_layers(one_layer_only).startswith("Not checkable")


def test_architecture_claims():
    transformer_best = _summary({("m", "Zeroshot"): [0.1, 0.1], ("m", "Plugin"): [0.40, 0.41],
                                 ("m", "Plugin-MLP"): [0.30, 0.36], ("m", "Plugin-linear"): [0.20, 0.28]})
    assert ablations.check_architecture(transformer_best).startswith("Supported")
    assert ablations.check_architecture_spread(transformer_best).startswith("Supported")

    frame = pd.DataFrame([{"model": "m", "method": method, "seed": 0, **dict.fromkeys(METRIC_NAMES, value)}
                          for method, value in (("Plugin", 0.4), ("Plugin-MLP", 0.3), ("Plugin-linear", 0.2))])
    frame.loc[frame.method == "Plugin-MLP", "NIST"] = 0.5
    verdict = ablations.check_architecture(tables.summarize(frame))
    assert verdict.startswith("Not supported") and "6/7 metrics" in verdict and "NIST Plugin-MLP" in verdict
    assert ablations.check_architecture_spread(tables.summarize(frame)).startswith("Not checkable")


def test_figures_have_a_panel_per_metric():
    summary = _summary({**{(b, "Zeroshot"): [0.1 + 0.1 * i] for i, b in enumerate(ORDER)},
                        **{(b, "Plugin"): [0.2 + 0.1 * i, 0.25 + 0.1 * i] for i, b in enumerate(ORDER)}})
    fig = ablations.plot_base_quality(summary, ORDER)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == list(METRIC_NAMES)

    variants = [ablations.Variant("Plugin", None, "1 layer"), ablations.Variant("Plugin-2L", {}, "2 layers")]
    one_model = _summary({("m", "Zeroshot"): [0.1], ("m", "Plugin"): [0.4], ("m", "Plugin-2L"): [0.3]})
    fig = ablations.plot_complexity(one_model, variants)
    assert [ax.get_title() for ax in fig.axes] == ["BLEU", "ROUGE-L"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1 layer", "2 layers"]
    fig = ablations.plot_architecture(one_model, variants)
    assert [len(ax.lines) for ax in fig.axes] == [2, 2]
