"""Runs keyed on everything that determines them (settings and inputs), parameters checked
before anything is written, and files that are never half-written or orphaned: the runner's
weights, the base-output cache, the BDPL prompts, the run records."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import count_trainings

from plugin_lib import data
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.experiments import table5, table8
from plugin_lib.harness import methods, tasks
from plugin_lib.harness.running import run_keys, run_store, runner, search
from plugin_lib.harness.profile import REPO_ROOT, load_profile
from plugin_lib.utils.io import CorruptFileError, current_umask, read_json, remove_stale_temporaries

import real_data


def must_not_decode(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(methods, "predict", fail)


def with_reference(task, i: int, reference: str):
    """The task with test example ``i``'s reference replaced (as if the data file changed)."""
    test = list(task.test)
    test[i] = dataclasses.replace(test[i], references=(reference,))
    return dataclasses.replace(task, test=test)


# --- stale runs are made again, never reused -------------------------------------------------

def test_a_run_made_from_other_inputs_is_redone(task, profile, monkeypatch):
    first = runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    assert first["inputs"] == run_keys.inputs_fingerprint(task) and len(first["inputs"]) == 16
    changed = with_reference(task, 1, "A different reference.")
    # The settings hash does not see the data (committed runs keep theirs); the inputs do.
    assert run_keys.settings_fingerprint(changed, profile) == first["settings"]
    assert run_keys.inputs_fingerprint(changed) != first["inputs"]
    must_not_decode(monkeypatch)
    assert runner.run_experiment(task, "Zeroshot", 0, profile) == first  # same inputs: reused
    with pytest.raises(AssertionError, match="decoded again"):
        runner.run_experiment(changed, "Zeroshot", 0, profile)
    with pytest.raises(AssertionError, match="decoded again"):  # other test ids, same texts
        runner.run_experiment(dataclasses.replace(task, test=[dataclasses.replace(e, id=e.id + "x") for e in task.test]),
                              "Zeroshot", 0, profile)
    # The base model's spec is part of the inputs: the same name for another model is stale.
    real_spec = runner.models.model_spec
    monkeypatch.setattr(runner.models, "model_spec", lambda name: {**real_spec(name), "hub_id": "org/other"})
    assert run_keys.examples_fingerprint("tiny-llama", task.train, task.hyper, task.test) != first["inputs"]


def test_a_record_without_inputs_is_stale(task, profile, monkeypatch):
    first = runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    path = run_store.runs_dir(profile, "e2e", "tiny-llama") / "Zeroshot-seed0.json"
    old = {k: v for k, v in first.items() if k != "inputs"}
    path.write_text(json.dumps(old))
    must_not_decode(monkeypatch)
    with pytest.raises(AssertionError, match="decoded again"):
        runner.run_experiment(task, "Zeroshot", 0, profile)


def test_a_grid_search_on_other_inputs_starts_again(task, profile, monkeypatch):
    monkeypatch.setattr(search, "arch_for", lambda name: {"arch": "llama", "hidden_size": 16, "intermediate_size": 32})
    trained = []
    count_trainings(monkeypatch, lambda hparams, seed: trained.append(hparams["lr"]))
    first = search.select_hparams(task, "Plugin", profile, progress=False)
    assert first["inputs"] == run_keys.inputs_fingerprint(task) and trained == [1e-3, 5e-3]
    trained.clear()
    assert search.select_hparams(task, "Plugin", profile, progress=False) == first and trained == []
    changed = dataclasses.replace(task, train=task.train[:-1])
    again = search.select_hparams(changed, "Plugin", profile, progress=False)
    assert trained == [1e-3, 5e-3] and again["inputs"] != first["inputs"]


def test_bdpl_prompts_are_keyed_on_inputs_and_current_runs_filter_on_them(task, profile, monkeypatch):
    first = table5.learn_prompt(task, profile, seed=0, budget=4)
    assert first["inputs"] == run_keys.inputs_fingerprint(task)
    calls = []
    real = table5.bdpl.train_bdpl
    monkeypatch.setattr(table5.bdpl, "train_bdpl", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert table5.learn_prompt(task, profile, seed=0, budget=4) == first and calls == []
    changed = dataclasses.replace(task, train=[dataclasses.replace(task.train[0], source="name[Other]")] + task.train[1:])
    table5.learn_prompt(changed, profile, seed=0, budget=4)  # same train ids, other data: learned again
    assert calls == [1]
    runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    assert [r["method"] for r in table5.current_runs(task, profile)] == ["Zeroshot"]
    assert table5.current_runs(with_reference(task, 0, "Changed."), profile) == []


def test_committed_local_runs_keep_their_settings_hash():
    """The settings hash is unchanged by the prompt style, the grid-edge option and NIST: the
    committed local records stay valid. TempNet is left out on purpose: rebuilt as its authors'
    code builds it, its runs are made anew (``tests/test_tempnet.py`` checks they go stale)."""
    local = load_profile("local")
    for dataset in data.DATASETS:
        fake = SimpleNamespace(dataset=dataset, base=SimpleNamespace(name="smollm2-135m-instruct"),
                               use_chat_template=True, prompt_prefix="", prompt_style=local.prompts,
                               tempnet=local.tempnet)
        for method in set(methods.METHODS) - {"TempNet", "TempNet-greedy"}:
            record = read_json(REPO_ROOT / f"results/local/runs/{dataset}/smollm2-135m-instruct/{method}-seed0.json")
            assert run_keys.settings_fingerprint(fake, local, method=method) == record["settings"], (dataset, method)
    # The authors' prompts are other settings: their runs are made anew.
    authors = SimpleNamespace(**{**vars(fake), "prompt_style": "authors"})
    assert run_keys.settings_fingerprint(authors, local) != run_keys.settings_fingerprint(fake, local)


def test_committed_local_finetuned_bases_keep_their_keys_and_bdpl_keys_follow_the_prompts():
    """The appendix prompts of the local profile leave the fine-tuned bases' folder names (their
    runs' folders) as committed; a BDPL prompt's key changes with the prompt style. (The committed
    BDPL prompts predate the optimiser of Diao et al.'s code and are stale: notebook 05 relearns
    them.)"""
    real_data.require()  # the keys are computed from the real data
    from plugin_lib.harness.baselines import finetune

    local = load_profile("local")
    train, hyper, _ = tasks.task_splits("e2e", local)
    fake = SimpleNamespace(dataset="e2e", base=SimpleNamespace(name="smollm2-135m-instruct"), family="llama",
                           use_chat_template=True, train=train, hyper=hyper, prompt_style=local.prompts)
    authors = SimpleNamespace(**{**vars(fake), "prompt_style": "authors"})
    assert (table5._prompt_settings(fake, 0, 75, "loglik", local.wrapper.bdpl)
            != table5._prompt_settings(authors, 0, 75, "loglik", local.wrapper.bdpl))
    cfg = finetune.finetune_config(local.ablations, local.tokens)  # as notebooks 06 and 10 build it
    pools = {"e2e": finetune.finetune_pool("e2e", local, local.ablations.finetune_pool_pairs)}
    pools.update({dataset: finetune.finetune_pool(dataset, local, max_pairs=local.shift.pool_pairs)
                  for dataset in ("webnlg", "commongen")})
    for dataset, pool in pools.items():
        prefix = finetune.run_prefix(local.ablations.model, pool.examples, pool.name, cfg, local.prompts)
        assert list((REPO_ROOT / f"results/local/runs/{dataset}").glob(f"finetuned--{prefix}-*ep")), prefix
        assert prefix != finetune.run_prefix(local.ablations.model, pool.examples, pool.name, cfg, "authors")


def test_committed_local_runs_carry_the_inputs_of_the_current_data():
    real_data.require()  # the inputs are computed from the real data
    local = load_profile("local")
    splits = {}
    records = sorted((REPO_ROOT / "results/local/runs").rglob("*.json"))
    assert len(records) > 150
    for path in records:
        record = read_json(path)
        dataset = path.relative_to(REPO_ROOT / "results/local/runs").parts[0]
        if dataset not in splits:
            splits[dataset] = tasks.task_splits(dataset, local)
        model = record.get("model") or path.parent.name.replace("--", "/")  # selection records: the folder
        assert record["inputs"] == run_keys.examples_fingerprint(model, *splits[dataset]), path
        if "test_ids" in record:
            assert record["test_ids"] == [e.id for e in splits[dataset][2]], path


# --- parameters are checked before anything is written ----------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    ({"method_names": "Plugin"}, TypeError, "method_names must be a non-empty list"),
    ({"method_names": ["Plugn"]}, ValueError, r"Unknown method\(s\) \['Plugn'\]"),
    ({"method_names": []}, TypeError, "non-empty list"),
    ({"model_names": "smollm2-135m-instruct"}, TypeError, "model_names must be a non-empty list"),
    ({"model_names": [3]}, TypeError, "model_names"),
    ({"model_names": ["no-such-model"]}, ValueError, "Unknown base model"),
    ({"dataset": "e2e2"}, ValueError, "Unknown dataset 'e2e2'"),
    ({"dataset": ["e2e"]}, ValueError, "Unknown dataset"),
])
def test_run_table_refuses_bad_parameters_before_writing(profile, monkeypatch, kwargs, error, match):
    monkeypatch.setattr(runner, "load_task", lambda *a, **k: pytest.fail("a task was loaded"))
    results = run_store.machine.results_dir(profile)
    before = sorted(results.rglob("*"))
    with pytest.raises(error, match=match):
        runner.run_table(kwargs.pop("dataset", "e2e"), profile, **kwargs)
    assert sorted(results.rglob("*")) == before == []


def test_table5_and_table8_check_their_parameters_first(profile, monkeypatch):
    monkeypatch.setattr(runner, "load_task", lambda *a, **k: pytest.fail("a task was loaded"))
    with pytest.raises(TypeError, match="model_names"):
        table5.run_table5(["e2e"], profile, model_names="tiny-llama")
    with pytest.raises(TypeError, match="budget must be a positive integer"):
        table5.run_table5(["e2e"], profile, model_names=["smollm2-135m-instruct"], budget="75")
    with pytest.raises(ValueError, match="reward"):
        table5.run_table5(["e2e"], profile, model_names=["smollm2-135m-instruct"], reward="bleu")
    with pytest.raises(TypeError, match="budget"):
        table5.notebook_budget(profile, 0)
    with pytest.raises(TypeError, match="model_names"):
        table8.run_table8(["e2e"], profile, model_names="smollm2-135m-instruct")
    with pytest.raises(TypeError, match="datasets must be"):
        runner.notebook_datasets(profile, 3)
    assert not list(run_store.machine.results_dir(profile).rglob("*.json"))


# --- no half-written file, no orphan ----------------------------------------------------------

def test_weights_are_saved_under_a_unique_name_and_never_half_written(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "Plugin-best.pt"
    seen = []
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        seen.extend(os.listdir(tmp_path))
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="is full"):
        run_store.save_state(model, path)
    assert not path.exists() and list(tmp_path.iterdir()) == []  # the temporary file is gone too
    assert len(seen) == 1 and seen[0].startswith(".Plugin-best.pt.") and seen[0].endswith(".tmp")
    monkeypatch.setattr(torch, "save", real_save)
    run_store.save_state(model, path)
    run_store.save_state(model, path)
    assert [p.name for p in tmp_path.iterdir()] == ["Plugin-best.pt"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~current_umask()
    assert torch.load(path)["weight"].shape == (2, 2)


def test_a_full_disk_is_named_as_such_and_the_stored_weights_stay(tmp_path, monkeypatch):
    """torch.save reports a full disk as "unexpected pos" (a failed CI run): the error says what
    happened and what to do, and the weights stored before are untouched."""
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "Plugin-best.pt"
    run_store.save_state(model, path)
    before = path.read_bytes()

    def full(obj, f, *args, **kwargs):
        f.write(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 135534976 vs 135534864")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(run_store.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 10**9, 10))
    with pytest.raises(OSError, match="is full .*PLUGIN_RESULTS_DIR") as info:
        run_store.save_state(model, path)
    assert info.value.errno == errno.ENOSPC and "unexpected pos" in str(info.value.__cause__)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["Plugin-best.pt"]
    # With room on the disk, another failure is reported as it is.
    monkeypatch.setattr(run_store.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**12, 0, 10**12))
    with pytest.raises(RuntimeError, match="unexpected pos"):
        run_store.save_state(model, path)


def test_orphaned_temporaries_are_removed_on_the_next_run(task, profile):
    folder = run_store.runs_dir(profile, "e2e", "tiny-llama")
    folder.mkdir(parents=True)
    old, fresh = folder / ".Plugin-best.pt.x1.tmp", folder / ".Zeroshot-seed0.json.x2.tmp"
    for path in (old, fresh):
        path.write_bytes(b"orphan")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    assert not old.exists() and fresh.exists()  # a recent one may belong to a live process
    assert remove_stale_temporaries(folder / "nowhere") == []


def test_a_truncated_run_record_names_its_file(task, profile):
    runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    path = run_store.runs_dir(profile, "e2e", "tiny-llama") / "Zeroshot-seed0.json"
    path.write_text(path.read_text()[:200])
    with pytest.raises(CorruptFileError, match=rf"{path} is not valid JSON.*truncated"):
        runner.run_experiment(task, "Zeroshot", 0, profile, progress=False)
    with pytest.raises(ValueError, match="Zeroshot-seed0.json"):
        run_store.load_runs(profile, "e2e")


@pytest.fixture
def pairs(tokenizer):
    return encode_pairs(tokenizer, [f"Describe item {i}:" for i in range(6)],
                        [f"Item {i} is small." for i in range(6)])


def test_base_cache_builds_into_a_unique_file_and_leaves_nothing_on_failure(tiny_base, pairs, tmp_path, monkeypatch):
    # A stale partial of a killed build goes; a recent one (a live build elsewhere) stays.
    stale, live = tmp_path / ".base-abc.npy.1.partial", tmp_path / ".base-abc.npy.2.partial"
    for path in (stale, live):
        path.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200,) * 2)
    seen = []
    real_logits = tiny_base.logits

    def interrupted(*args, **kwargs):
        seen.extend(p.name for p in tmp_path.glob(".base-*.partial") if p != live)
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_base, "logits", interrupted)
    with pytest.raises(KeyboardInterrupt):
        BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, progress=False)
    assert not stale.exists() and live.exists()
    assert len(seen) == 1 and seen[0].startswith(".base-") and seen[0] != live.name
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]  # no partial, no final file

    # Another process finishes the same cache meanwhile: its file is used, ours removed.
    other = tmp_path / "other"
    monkeypatch.setattr(tiny_base, "logits", real_logits)
    reference = BaseOutputCache.build(tiny_base, pairs, directory=other, progress=False)
    (final,) = other.glob("base-*.npy")

    def finished_elsewhere(*args, **kwargs):
        if not (tmp_path / final.name).exists():
            (tmp_path / final.name).write_bytes(final.read_bytes())
        return real_logits(*args, **kwargs)

    monkeypatch.setattr(tiny_base, "logits", finished_elsewhere)
    built = BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, progress=False)
    np.testing.assert_array_equal(np.asarray(built.rows), np.asarray(reference.rows))
    assert sorted(p.name for p in tmp_path.glob(".base-*")) == [live.name]
    assert (tmp_path / final.name).stat().st_mode & 0o777 == 0o666 & ~current_umask()


# --- the stamp script for records made before ``inputs`` -------------------------------------

def _stamp_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("stamp_run_inputs", REPO_ROOT / "scripts/stamp_run_inputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stamp_script_checks_data_and_test_ids_before_writing(tmp_path, monkeypatch, capsys):
    real_data.require()  # the script checks the real data
    shared = Path(os.environ["PLUGIN_DATA_DIR"])
    source = REPO_ROOT / "results/local/runs/e2e/smollm2-135m-instruct"
    target = tmp_path / "results/local/runs/e2e/smollm2-135m-instruct"
    committed = {}
    for name in ("Zeroshot-seed0.json", "Plugin-seed0.json", "Plugin-selection.json", "bdpl-prompts/seed0.json"):
        record = read_json(source / name)
        committed[name] = record.pop("inputs")
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text(json.dumps(record))
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "results"))
    script = _stamp_script()

    zeroshot = json.loads((target / "Zeroshot-seed0.json").read_text())
    (target / "Zeroshot-seed0.json").write_text(json.dumps({**zeroshot, "test_ids": zeroshot["test_ids"][::-1]}))
    snapshot = {p: p.read_bytes() for p in target.rglob("*.json")}
    assert script.main(["--profile", "local"]) == 2
    assert "test ids differ" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in target.rglob("*.json")} == snapshot  # nothing written
    (target / "Zeroshot-seed0.json").write_text(json.dumps(zeroshot))

    # Data that does not match the checksums: refused too.
    damaged = tmp_path / "data"
    for relpath in ("e2e_cleaned/devel-fixed.no-ol.csv", "e2e_cleaned/test-fixed.csv"):
        (damaged / relpath).parent.mkdir(parents=True, exist_ok=True)
        (damaged / relpath).write_bytes((shared / relpath).read_bytes())
    (damaged / "e2e_cleaned/test-fixed.csv").write_bytes((shared / "e2e_cleaned/test-fixed.csv").read_bytes()[:-100])
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(damaged))
    assert script.main(["--profile", "local"]) == 2
    assert "does not match the shipped checksums" in capsys.readouterr().err

    monkeypatch.setenv("PLUGIN_DATA_DIR", str(shared))
    assert script.main(["--profile", "local"]) == 0
    for name, inputs in committed.items():
        assert read_json(target / name)["inputs"] == inputs  # the same as the committed stamp
    assert script.main(["--profile", "local"]) == 0
    assert "0 to stamp, 4 already current" in capsys.readouterr().out


def test_orphaned_model_directories_are_removed_by_the_next_save(tmp_path):
    from plugin_lib.harness.baselines import finetune

    orphan = tmp_path / ".tuned-abc123"
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"half")
    os.utime(orphan, (time.time() - 7200,) * 2)
    recent = tmp_path / ".tuned-def456"
    recent.mkdir()

    class Saveable:
        def save_pretrained(self, folder):
            (Path(folder) / "config.json").write_text("{}")

    finetune.save_model_dir(tmp_path / "tuned", Saveable(), Saveable())
    assert not orphan.exists() and recent.exists() and (tmp_path / "tuned/config.json").exists()

    class DiskFull(Saveable):
        def save_pretrained(self, folder):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        finetune.save_model_dir(tmp_path / "other", DiskFull(), Saveable())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tuned-def456", "tuned"]


def test_finetuning_reads_the_profiles_token_limits_unless_its_section_sets_them():
    from plugin_lib.harness.baselines import finetune

    confirm, local = load_profile("confirm"), load_profile("local")
    cfg = finetune.finetune_config(confirm.ablations, confirm.tokens)
    assert (cfg.max_prompt_tokens, cfg.max_target_tokens) == (192, 127)
    kept = finetune.finetune_config(local.ablations, local.tokens)  # the committed local fine-tunes' limits
    assert (kept.max_prompt_tokens, kept.max_target_tokens) == (128, 127)
    assert finetune.finetune_config(confirm.ablations).max_prompt_tokens == finetune.FinetuneConfig().max_prompt_tokens
