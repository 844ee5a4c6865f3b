"""A grid trained together (``core.train.fit_grid``) equals each configuration trained alone:
the same losses, chosen epoch and weights, from the full and the compact cache, with early
stops at different epochs and dropout drawing from each configuration's own generator; and a
grid killed midway resumes to the same results. Each batch is read once for all.
Twins have random weights: twin: says nothing about the paper's numbers."""
from __future__ import annotations

import contextlib

import pytest
import torch

from plugin_lib.core import train as train_module
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.train import GridRun, TokenObjective, TrainConfig, fit, fit_grid
from plugin_lib.harness import models

SOURCES = ["name[The Eagle], eatType[coffee shop]", "name[Aromi], area[city centre]", "name[Zizzi], food[Italian]",
           "name[Cotto], food[Indian]", "name[Blue Spice], area[riverside]", "name[The Mill], food[Indian]",
           "name[Loch Fyne], food[Japanese]", "name[The Punter], priceRange[cheap]", "name[Wildwood], eatType[pub]",
           "name[Alimentum], area[city centre]"]
TARGETS = ["The Eagle is a coffee shop.", "Aromi is in the centre.", "Zizzi is Italian.", "Cotto serves Indian food.",
           "Blue Spice is by the river.", "The Mill is Indian.", "Loch Fyne is Japanese.", "The Punter is cheap.",
           "Wildwood is a pub.", "Alimentum is central."]
# lr and weight decay of a grid; the largest lr overshoots, so its configuration stops first.
GRID = [(3e-3, 0.01), (3e-2, 0.01), (3e-1, 0.0), (3e-3, 1.0)]


@pytest.fixture(scope="module")
def twin():
    return models.load_base_model("llama-3.1-8b-twin-small", dtype=torch.float32, device="cpu")


def objectives(base, layout: str, tmp_path):
    pairs = encode_pairs(base.tokenizer, SOURCES, TARGETS)
    parts = (pairs[:7], pairs[7:])
    caches = [BaseOutputCache.build(base, part, layout=layout, directory=tmp_path / f"{layout}-{i}", progress=False)
              for i, part in enumerate(parts)]
    assert all(cache.layout == layout for cache in caches)
    return [TokenObjective(part, base.tokenizer.pad_token_id, cache=cache) for part, cache in zip(parts, caches)]


def reweighter(base):
    """The LLaMA family's reweighting model, small, with attention dropout: training draws from
    the global generator, so each configuration's must be its own."""
    model = make_reweighter("llama", base.vocab_size, seed=0, hidden_size=32, intermediate_size=64)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.2
    return model


def configs(max_epochs: int = 7) -> list[TrainConfig]:
    return [TrainConfig(lr=lr, weight_decay=wd, max_epochs=max_epochs, patience=2, batch_size=3, seed=4)
            for lr, wd in GRID]


def assert_same(together, alone, models_together, models_alone):
    for a, b, model_a, model_b in zip(together, alone, models_together, models_alone):
        assert (a.best_epoch, a.epochs_run, a.optimizer_steps) == (b.best_epoch, b.epochs_run, b.optimizer_steps)
        assert a.best_val_loss == pytest.approx(b.best_val_loss, rel=1e-6, abs=1e-6)
        for x, y in zip(a.history, b.history):
            assert x["epoch"] == y["epoch"]
            assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-6)
            assert x["val_loss"] == pytest.approx(y["val_loss"], rel=1e-6)
        for key, value in model_b.state_dict().items():
            torch.testing.assert_close(model_a.state_dict()[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stack", [False, True], ids=["shared-batches", "stacked"])
@pytest.mark.parametrize("layout", ["full", "compact"])
def test_a_grid_trained_together_equals_each_configuration_alone(twin, layout, stack, tmp_path):
    train, val = objectives(twin, layout, tmp_path)
    alone_models = [reweighter(twin) for _ in GRID]
    alone = [fit(model, train, val, cfg, progress=False) for model, cfg in zip(alone_models, configs())]
    assert len({r.epochs_run for r in alone}) > 1, "the grid should stop at different epochs"
    together_models = [reweighter(twin) for _ in GRID]
    reads, stacks = [], []
    real_get, real_stack = train.cache.get, train_module.ParameterStack
    train.cache.get = lambda indices: reads.append(list(indices)) or real_get(indices)
    train_module.ParameterStack = lambda models_: stacks.append(len(models_)) or real_stack(models_)
    try:
        together = fit_grid([GridRun(m, train, val, cfg) for m, cfg in zip(together_models, configs())],
                            progress=False, stack=stack)
    finally:
        del train.cache.get
        train_module.ParameterStack = real_stack
    assert_same(together, alone, together_models, alone_models)
    # Stacked: every configuration still training steps in one stack, each epoch.
    assert stacks == ([len(GRID)] + [sum(r.epochs_run >= epoch for r in together)
                                     for epoch in range(2, max(r.epochs_run for r in together) + 1)
                                     if sum(r.epochs_run >= epoch for r in together) > 1] if stack else [])
    batches = max(r.epochs_run for r in together) * 3  # 7 pairs in batches of 3, while any configuration trains
    assert len(reads) == batches  # each batch read once for the whole grid, not once per configuration


class Killed(Exception):
    """Stands for a process killed mid-grid."""


@contextlib.contextmanager
def killed_at_grid_validation(number: int):
    real, calls = train_module.mean_nlls, []

    def dying(pairs, batch_size=16):
        calls.append(1)
        if len(calls) == number:
            raise Killed
        return real(pairs, batch_size)

    train_module.mean_nlls = dying
    try:
        yield
    finally:
        train_module.mean_nlls = real


@pytest.mark.parametrize("stack", [False, True], ids=["shared-batches", "stacked"])
def test_a_grid_killed_midway_resumes_to_the_same_results(twin, stack, tmp_path):
    train, val = objectives(twin, "compact", tmp_path)
    whole_models = [reweighter(twin) for _ in GRID]
    whole = fit_grid([GridRun(m, train, val, cfg) for m, cfg in zip(whole_models, configs())], progress=False)
    paths = [tmp_path / "checkpoints" / f"config-{i}.pt" for i in range(len(GRID))]

    def runs(models_):
        return [GridRun(m, train, val, cfg, checkpoint=path) for m, cfg, path in zip(models_, configs(), paths)]

    with killed_at_grid_validation(3), pytest.raises(Killed):
        fit_grid(runs([reweighter(twin) for _ in GRID]), progress=False, checkpoint_every_s=0, stack=stack)
    assert all(path.exists() for path in paths)  # each configuration's state after epoch 2
    paths[1].unlink()  # one configuration starts over: the others resume at epoch 3, in a group of their own
    torch.manual_seed(12345)  # a new process: the global generator is elsewhere
    resumed_models = [reweighter(twin) for _ in GRID]
    resumed = fit_grid(runs(resumed_models), progress=False, checkpoint_every_s=0, stack=stack)
    assert_same(resumed, whole, resumed_models, whole_models)
    assert not any(path.exists() for path in paths)  # removed once each training ends


def test_a_configuration_trained_alone_resumes_from_a_grid_checkpoint(twin, tmp_path):
    """The checkpoint format is ``fit``'s: a grid's configuration can be finished alone."""
    train, val = objectives(twin, "full", tmp_path)
    cfg = configs()[0]
    expected_model = reweighter(twin)
    expected = fit(expected_model, train, val, cfg, progress=False)
    path = tmp_path / "config-0.pt"
    with killed_at_grid_validation(2), pytest.raises(Killed):
        fit_grid([GridRun(reweighter(twin), train, val, cfg, checkpoint=path),
                  GridRun(reweighter(twin), train, val, configs()[1])], progress=False, checkpoint_every_s=0)
    model = reweighter(twin)
    assert_same([fit(model, train, val, cfg, progress=False, checkpoint=path)], [expected], [model], [expected_model])


def test_configurations_that_do_not_share_the_data_order_are_refused(twin, tmp_path):
    train, val = objectives(twin, "full", tmp_path)
    first, second = configs()[:2]
    second.seed = 5
    with pytest.raises(ValueError, match="share the seed, batch size, autocast and training pairs"):
        fit_grid([GridRun(reweighter(twin), train, val, first), GridRun(reweighter(twin), train, val, second)],
                 progress=False)


@pytest.mark.parametrize("method,stack", [("Plugin", False), ("WeightedComb", False), ("Plugin", True)])
def test_a_search_trains_its_grid_together_and_records_what_each_alone_gives(task, profile, method, stack, tmp_path,
                                                                            monkeypatch):
    """``search.select_hparams`` trains the pending configurations of the grid in one pass (each
    record says with how many); the same grid's units trained one at a time (``train_config``,
    another store) record the same losses, epochs and choice. WeightedComb's alpha changes the
    objective, not the batches: its grid shares them too. From a full cache on a CPU, where
    reading a batch is a copy, the search trains one at a time. A task that stacks the grid
    (``Task.stacked_training``, a GPU's in a profile that says so) records the same, and says so."""
    import dataclasses

    from plugin_lib.harness import methods
    from plugin_lib.harness.running import run_keys, search

    # compact: where a grid pays on a CPU (core.train.grid_pays)
    task = dataclasses.replace(task, cache_layout="compact", stacked_training=stack)
    profile = profile.replace(grid={**profile.section("grid"), "weight_decay": [0.01, 1.0], "alpha": [0.25, 0.75]},
                              training={**profile.section("training"), "max_epochs": 3, "patience": 1})
    trained_together = []
    real = methods.train_together
    monkeypatch.setattr(methods, "train_together",
                        lambda task, specs, **k: trained_together.append(len(specs)) or real(task, specs, **k))
    together = search.select_hparams(task, method, profile, progress=False)
    size = len(run_keys.hparam_grid(profile, method))
    assert trained_together == [size] and size >= 4
    assert {c["trained_with"] for c in together["configs"].values()} == {size}
    assert {c.get("stacked_training", False) for c in together["configs"].values()} == {stack}
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "one-by-one"))
    for hparams in run_keys.hparam_grid(profile, method):
        search.train_config(task, method, profile, hparams)
    alone = search.stored_selection(task, method, profile)
    assert trained_together == [size]  # one at a time: train, never train_together
    assert alone["best"] == together["best"]
    for tag, config in alone["configs"].items():
        other = together["configs"][tag]
        assert (other["best_epoch"], other["epochs_run"]) == (config["best_epoch"], config["epochs_run"])
        assert other["val_loss"] == pytest.approx(config["val_loss"], rel=1e-6)
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "full-cache"))
    full = dataclasses.replace(task, cache_layout="full")
    search.select_hparams(full, method, profile, progress=False)
    assert trained_together == [size]  # nothing more trained together
