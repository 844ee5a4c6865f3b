import dataclasses
import errno

import pytest
import torch

from plugin_lib.core import grid_search
from plugin_lib.core.train import TokenObjective
from plugin_lib.harness import methods
from plugin_lib.harness.running import run_keys, run_store, runner, search
from plugin_lib.utils import record_manifest
from plugin_lib.harness.profile import load_profile
from plugin_lib.utils.io import atomic_write_json


def test_finished_runs_are_not_redone_unless_settings_change(task, profile, monkeypatch):
    first = runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    path = run_store.runs_dir(profile, "e2e", "tiny-llama") / "Zeroshot-seed0.json"
    assert path.exists() and set(first["metrics"]) == {"BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR", "CIDEr", "NIST"}
    assert len(first["predictions"]) == 2

    def must_not_run(*args, **kwargs):
        raise AssertionError("a finished run was decoded again")

    monkeypatch.setattr(methods, "predict", must_not_run)
    assert runner.run_experiment(task, "Zeroshot", 0, profile) == first
    profile = profile.replace(decoding={**profile.section("decoding"), "max_new_tokens": 4})
    with pytest.raises(AssertionError, match="decoded again"):
        runner.run_experiment(task, "Zeroshot", 0, profile)



def patch_training(monkeypatch, train):
    """Stand ``train`` (``methods.train``'s signature) in for the training of one configuration
    and, one by one in their order, of several trained together (``methods.train_together``)."""
    def together(task_, specs, progress=True):
        return [train(task_, spec, progress=progress) for spec in specs]

    monkeypatch.setattr(methods, "train", train)
    monkeypatch.setattr(methods, "train_together", together)

def test_grid_search_resumes_and_keeps_the_lowest_loss(task, profile, monkeypatch):
    trained, checkpoints = [], []
    real_train = methods.train

    def counting_train(task_, spec, progress=True):
        trained.append(spec.hparams["lr"])
        checkpoints.append(spec.checkpoint)
        small = dataclasses.replace(spec, arch={**spec.arch, "hidden_size": 16, "intermediate_size": 32})
        return real_train(task_, small, progress=progress)

    patch_training(monkeypatch, counting_train)
    monkeypatch.setattr(search, "arch_for", lambda name: {"arch": "llama", "hidden_size": 16, "intermediate_size": 32})
    first = search.select_hparams(task, "Plugin", profile, progress=False)
    assert trained == [1e-3, 5e-3]
    # Each configuration's training keeps its state in a file of its own while it runs (fit resumes
    # from it after a kill), named after the configuration and the search's fingerprints.
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    assert [(c.parent, c.name.rsplit("-", 1)[0]) for c in checkpoints] == [
        (folder / ".checkpoints", f"Plugin-{tag}") for tag in first["configs"]]
    assert not any(c.exists() for c in checkpoints)  # removed when the training ended
    losses = {tag: c["val_loss"] for tag, c in first["configs"].items()}
    assert first["best"] == min(losses, key=losses.get)

    # Interrupted after the first configuration: only the second one is trained again.
    record_path = run_store.runs_dir(profile, "e2e", "tiny-llama") / "Plugin-selection.json"
    partial = dict(first, configs={k: v for k, v in first["configs"].items() if "0.001" in k}, best=None)
    partial["best"] = next(iter(partial["configs"]))
    atomic_write_json(record_path, partial)
    trained.clear()
    again = search.select_hparams(task, "Plugin", profile, progress=False)
    assert trained == [5e-3] and set(again["configs"]) == set(first["configs"])

    record = runner.run_experiment(task, "Plugin", profile.seeds[0], profile, progress=False)
    assert record["hparams"] == again["configs"][again["best"]]["hparams"]
    assert record["training"]["val_loss"] == again["configs"][again["best"]]["val_loss"]


def test_a_later_seed_killed_while_decoding_is_not_trained_again(task, profile, monkeypatch):
    """The training of a seed after the first keeps its finished state until the run's record is
    stored: a kill during decoding costs the decoding only."""
    monkeypatch.setattr(search, "arch_for", lambda name: {"arch": "llama", "hidden_size": 16, "intermediate_size": 32})
    profile = profile.replace(seeds=[0, 1])
    search.select_hparams(task, "Plugin", profile, progress=False)
    real_predict = methods.predict

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(methods, "predict", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment(task, "Plugin", 1, profile, progress=False)
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    (kept,) = (folder / ".checkpoints").glob("Plugin-seed1-lr=*.pt")
    monkeypatch.setattr(methods, "predict", real_predict)
    monkeypatch.setattr(TokenObjective, "nll", lambda *a, **k: pytest.fail("trained again"))
    record = runner.run_experiment(task, "Plugin", 1, profile, progress=False)
    assert record["training"]["epochs_run"] >= 1 and len(record["predictions"]) == len(task.test)
    assert not kept.exists()  # removed once the record is stored


def test_hparam_grid_per_method():
    prof = load_profile("local")
    assert len(run_keys.hparam_grid(prof, "Plugin")) == len(prof.grid.lr) * len(prof.grid.weight_decay)
    assert all("alpha" in h for h in run_keys.hparam_grid(prof, "WeightedComb"))
    with pytest.raises(ValueError, match="Unknown method"):
        methods.check_method("LoRA-99")


def test_missing_weights_are_retrained_from_the_recorded_choice(task, profile):
    first = runner.run_experiment(task, "Plugin", 0, profile, progress=False)
    state = run_store.runs_dir(profile, "e2e", "tiny-llama") / "Plugin-best.pt"
    state.unlink()  # as on a machine that only has the committed JSON records
    again = runner.run_experiment(task, "Plugin", 0, profile, force=True, progress=False)
    assert state.exists() and again["predictions"] == first["predictions"]


# -- equal budget: grid edges (issue 16) ---------------------------------------------------------

def test_beyond_edge_steps_past_the_edge_where_the_choice_sits():
    assert grid_search.beyond_edge([1e-3, 5e-3], 1e-3, "lr") == pytest.approx(2e-4)
    assert grid_search.beyond_edge([1e-3, 5e-3], 5e-3, "lr") == pytest.approx(2.5e-2)
    assert grid_search.beyond_edge([5e-5, 5e-4, 5e-3], 5e-4, "lr") is None  # inside the grid
    assert grid_search.beyond_edge([0.01], 0.01, "weight_decay") is None  # one value: no edge
    # alpha is a mixture weight in (0, 1): the spacing while it stays inside, then half the gap.
    assert grid_search.beyond_edge([0.25, 0.5, 0.75], 0.25, "alpha") == pytest.approx(0.125)
    assert grid_search.beyond_edge([0.25, 0.5, 0.75], 0.75, "alpha") == pytest.approx(0.875)
    assert grid_search.beyond_edge([0.3, 0.5, 0.7], 0.3, "alpha") == pytest.approx(0.1)
    assert grid_search.grid_edges({"lr": [1e-3, 5e-3], "weight_decay": [0.01]}, {"lr": 1e-3, "weight_decay": 0.01}) == ["lr"]


def _fake_training(trained, best_lr):
    """``methods.train`` stand-in: hyper-validation loss is smallest at ``best_lr`` (log scale)."""
    import math
    import torch
    from plugin_lib.core.train import FitResult

    def train(task_, spec, progress=True):
        hparams = spec.hparams
        trained.append(hparams["lr"])
        loss = 1.0 + abs(math.log(hparams["lr"] / best_lr))
        result = FitResult(best_epoch=1, best_val_loss=loss, epochs_run=1, optimizer_steps=1, seconds=0.0)
        return torch.nn.Linear(1, 1), result
    return train


@pytest.mark.parametrize("extend, expected", [
    (0, [1e-3, 5e-3]),                      # as listed: the choice stays at the edge
    (1, [1e-3, 5e-3, 2e-4]),
    (2, [1e-3, 5e-3, 2e-4, 4e-5]),          # at most two steps, even if the edge is still chosen
])
def test_a_choice_at_the_edge_extends_the_grid(task, profile, monkeypatch, extend, expected):
    trained = []
    patch_training(monkeypatch, _fake_training(trained, best_lr=1e-5))
    profile = profile.replace(grid={**profile.section("grid"), "extend_edges": extend})
    record = search.select_hparams(task, "Plugin", profile, progress=False)
    assert trained == pytest.approx(expected)
    assert record["grid"]["lr"] == pytest.approx(expected)
    assert record["configs"][record["best"]]["hparams"]["lr"] == pytest.approx(expected[-1] if extend else 1e-3)
    trained.clear()
    search.select_hparams(task, "Plugin", profile, progress=False)  # resumes: nothing trained again
    assert trained == []


def test_an_interior_choice_extends_nothing(task, profile, monkeypatch):
    trained = []
    patch_training(monkeypatch, _fake_training(trained, best_lr=1e-3))
    profile = profile.replace(grid={**profile.section("grid"), "lr": [2e-4, 1e-3, 5e-3], "extend_edges": 2})
    search.select_hparams(task, "Plugin", profile, progress=False)
    assert trained == pytest.approx([2e-4, 1e-3, 5e-3])


def test_extend_edges_zero_keeps_the_settings_hash_of_runs_made_before_the_option(task, profile):
    pushed = profile.replace(grid={**profile.section("grid"), "extend_edges": 2})
    assert run_keys.settings_fingerprint(task, profile) != run_keys.settings_fingerprint(task, pushed)


# -- coordinate search (issue 25) -----------------------------------------------------------------

def _fake_two_key_training(trained, best):
    """``methods.train`` stand-in whose hyper-validation loss is smallest at ``best`` (log scale)."""
    import math
    import torch
    from plugin_lib.core.train import FitResult

    def train(task_, spec, progress=True):
        hparams = spec.hparams
        trained.append((hparams["lr"], hparams["weight_decay"]))
        loss = 1.0 + sum(abs(math.log(hparams[k] / v)) for k, v in best.items())
        return torch.nn.Linear(1, 1), FitResult(best_epoch=1, best_val_loss=loss, epochs_run=1, optimizer_steps=1,
                                                seconds=0.0)
    return train


def test_coordinate_search_walks_one_hyperparameter_at_a_time_from_the_middle(task, profile, monkeypatch):
    trained = []
    patch_training(monkeypatch, _fake_two_key_training(trained, {"lr": 1e-2, "weight_decay": 0.1}))
    profile = profile.replace(grid={"lr": [1e-4, 1e-3, 1e-2], "weight_decay": [0.01, 0.1, 1.0], "alpha": [0.5],
                                    "extend_edges": 1, "search": "coordinate"})
    record = search.select_hparams(task, "Plugin", profile, progress=False)
    # lr from the middle with weight decay at its middle (0.1): 1e-2 wins at the edge, so lr is
    # pushed once (1e-1); then weight decay at lr 1e-2 (0.1 already known): nothing to push.
    assert [lr for lr, _ in trained] == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1, 1e-2, 1e-2])
    assert [wd for _, wd in trained] == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.01, 1.0])
    assert record["configs"][record["best"]]["hparams"] == pytest.approx({"lr": 1e-2, "weight_decay": 0.1})
    assert record["grid"]["lr"] == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
    trained.clear()
    search.select_hparams(task, "Plugin", profile, progress=False)  # resumes: nothing trained again
    assert trained == []


def test_the_search_and_tempnet_options_change_the_settings_hash_only_when_set(task, profile):
    coordinate = profile.replace(grid={**profile.section("grid"), "search": "coordinate"})
    assert run_keys.settings_fingerprint(task, profile) != run_keys.settings_fingerprint(task, coordinate)
    tempnet = dataclasses.replace(task, tempnet=profile.tempnet)
    per_token = dataclasses.replace(task, tempnet=dataclasses.replace(profile.tempnet, per="token"))
    assert (run_keys.settings_fingerprint(tempnet, profile, method="TempNet")
            != run_keys.settings_fingerprint(per_token, profile, method="TempNet"))


def test_a_pretrained_reweighter_in_the_cache_is_keyed_without_this_machines_path(toy_task, tiny_profile,
                                                                                   monkeypatch, tmp_path):
    """A fresh clone on another machine (another HOME or PLUGIN_CACHE_DIR) finds the
    Plugin-pretrained runs current: the key names the model's place in the cache, not the path."""
    keys = []
    for home in ("one", "two"):
        monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / home))
        arch = {"arch": "pretrained", "pretrained": str(tmp_path / home / "models" / "smollm2-first4layers")}
        keys.append(run_keys.settings_fingerprint(toy_task, tiny_profile, arch, "Plugin"))
    assert keys[0] == keys[1]
    elsewhere = {"arch": "pretrained", "pretrained": str(tmp_path / "mine" / "smollm2-first4layers")}
    assert run_keys.settings_fingerprint(toy_task, tiny_profile, elsewhere, "Plugin") != keys[0]


def test_a_new_run_record_names_its_code_libraries_and_device(task, profile):
    import torch

    from plugin_lib.utils import provenance

    record = runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    made = record["provenance"]
    assert made["code"] == provenance.code_version()  # what the notebook stamps hash
    assert made["libraries"]["torch"] == torch.__version__.split("+")[0] or made["libraries"]["torch"] == torch.__version__
    assert made["device"] and made["device"] == provenance.device_name("cpu")
    assert made["modules"]["plugin_lib/core/train.py"] == provenance.module_versions()["plugin_lib/core/train.py"]
    assert "plugin_lib/harness/baselines/tempnet.py" in made["modules"] and "plugin_lib/commands/document.py" not in made["modules"]
    git = made["git"]
    if git is not None:  # a git checkout: the commit, and a hash of any uncommitted change
        assert len(git["commit"]) == 40 and isinstance(git["dirty"], bool)
        assert ("diff_sha256" in git) == git["dirty"]
    selection = search.select_hparams(task, "NewModel", profile.replace(
        grid={**profile.section("grid"), "lr": [1e-3]}), progress=False)
    assert all(config["provenance"]["code"] == made["code"] for config in selection["configs"].values())


def test_every_method_module_named_for_provenance_exists():
    """A renamed or split method module must be renamed here too, or its changes go unrecorded."""
    from plugin_lib.utils import provenance

    missing = [m for m in provenance.METHOD_MODULES if not (provenance.REPO_ROOT / m).exists()]
    assert not missing, missing
    harness = {f"plugin_lib/harness/{p.name}" for p in (provenance.REPO_ROOT / "plugin_lib/harness").glob("bdpl*.py")}
    assert harness <= set(provenance.METHOD_MODULES)


def test_a_unit_that_fails_on_a_full_disk_leaves_no_checkpoint_behind(task, profile, monkeypatch):
    """Issue 46: on a full disk the finished training's checkpoint stayed (100 MiB on smoke),
    holding space the next attempt needs. Now it goes, and the error says so; any other failure
    keeps it, so the unit resumes from it."""
    monkeypatch.setattr(search, "arch_for", lambda name: {"arch": "llama", "hidden_size": 16, "intermediate_size": 32})
    profile = profile.replace(seeds=[0, 1])
    search.select_hparams(task, "Plugin", profile, progress=False)
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    real_write = record_manifest.atomic_write_json

    def record_fails(error):
        def write(path, obj):
            if path.name == "Plugin-seed1.json":
                raise error
            return real_write(path, obj)
        return write

    monkeypatch.setattr(record_manifest, "atomic_write_json", record_fails(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError, match="No space left on device. Its training checkpoint Plugin-seed1-lr=.* was "
                                      "removed") as info:
        runner.run_experiment(task, "Plugin", 1, profile, progress=False)
    assert info.value.errno == errno.ENOSPC
    assert not list((folder / ".checkpoints").glob("*.pt")) and not (folder / "Plugin-seed1.json").exists()

    monkeypatch.setattr(record_manifest, "atomic_write_json", record_fails(RuntimeError("not about the disk")))
    with pytest.raises(RuntimeError, match="not about the disk"):
        runner.run_experiment(task, "Plugin", 1, profile, progress=False)
    assert len(list((folder / ".checkpoints").glob("Plugin-seed1-lr=*.pt"))) == 1  # kept: a rerun resumes


def test_a_search_whose_weights_do_not_fit_the_disk_leaves_no_checkpoint(task, profile, monkeypatch):
    monkeypatch.setattr(search, "arch_for", lambda name: {"arch": "llama", "hidden_size": 16, "intermediate_size": 32})
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    real_save = torch.save

    def full_for_weights(obj, f, *args, **kwargs):  # the checkpoint fits; the chosen weights do not
        if "finished" not in obj:  # a state dict of weights, not fit's training state
            f.write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_for_weights)
    hparams = run_keys.hparam_grid(profile, "Plugin")[0]
    with pytest.raises(OSError, match="checkpoint Plugin-lr=.* was removed"):
        search.train_config(task, "Plugin", profile, hparams)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == []  # nothing of the unit stays


@pytest.mark.parametrize("arrival", ["grid order", "reversed"])
def test_equal_losses_choose_the_grids_first_whatever_order_the_units_finish_in(task, profile, monkeypatch, arrival):
    """Configurations trained at once in other processes (issue 72) finish in any order; the
    choice among equal losses is the grid's first either way, as one process makes it."""
    import torch
    from plugin_lib.core.train import FitResult

    def equal(task_, spec, progress=True):
        return torch.nn.Linear(1, 1), FitResult(best_epoch=1, best_val_loss=1.5, epochs_run=1, optimizer_steps=1,
                                                seconds=0.0)

    patch_training(monkeypatch, equal)
    profile = profile.replace(grid={**profile.section("grid"), "lr": [1e-3, 5e-3], "extend_edges": 0})
    configs = list(run_keys.hparam_grid(profile, "Plugin"))
    for hparams in configs if arrival == "grid order" else configs[::-1]:
        search.train_config(task, "Plugin", profile, hparams)
    record = search.select_hparams(task, "Plugin", profile, progress=False)
    assert record["best"] == run_keys.config_tag(configs[0])


def test_a_training_spec_is_checked_when_it_is_made(profile):
    with pytest.raises(ValueError, match="Zeroshot has nothing to train"):
        methods.TrainingSpec("Zeroshot", {}, {"lr": 1e-3, "weight_decay": 0.01}, 0, profile.training)
    with pytest.raises(ValueError, match="WeightedComb's training needs hyperparameters"):
        methods.TrainingSpec("WeightedComb", {}, {"lr": 1e-3, "weight_decay": 0.01}, 0, profile.training)
    with pytest.raises(TypeError, match="seed must be an integer, got '0'"):
        methods.TrainingSpec("Plugin", {}, {"lr": 1e-3, "weight_decay": 0.01}, "0", profile.training)
    spec = methods.TrainingSpec("Plugin", {}, {"lr": 1e-3, "weight_decay": 0.01}, 0, profile.training)
    assert spec.checkpoint is None and dataclasses.replace(spec, seed=1).seed == 1


def test_a_methods_files_are_keyed_as_its_records(task, profile):
    """A run's files carry the fingerprints its records store: the family's architecture enters
    the settings' key only under a label of its own (an ablation's, a pretrained arm's)."""
    arch = {"arch": "llama", "hidden_size": 16, "intermediate_size": 32}
    plain = run_store.method_files(task, profile, "Plugin", arch=arch)
    assert plain.settings == run_keys.settings_fingerprint(task, profile, None, "Plugin")
    assert plain.inputs == run_keys.inputs_fingerprint(task)
    labelled = run_store.method_files(task, profile, "Plugin", "Plugin-small", arch)
    assert labelled.settings == run_keys.settings_fingerprint(task, profile, arch, "Plugin") != plain.settings
    assert plain.folder == labelled.folder == run_store.runs_dir(profile, task.dataset, task.base.name)
