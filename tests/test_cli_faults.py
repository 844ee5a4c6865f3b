"""A practitioner's run they can trust (issue 61): the cost said first and counted right, fast
command startup, one writer per artifact, no orphans, and every fault one line that names the
cause and the fix."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from plugin_lib.utils.io import atomic_write_json, current_umask, temporary_prefix
from plugin_lib.utils.locks import StoreLock, host_name

ROOT = Path(__file__).resolve().parent.parent
PAIRS = Path(__file__).parent / "fixtures" / "pairs.jsonl"


def ended_pid() -> int:
    """The pid of a process that has ended (what a kill -9 leaves behind)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---------------------------------------------------------------- commands start fast


def test_help_and_refused_input_never_import_torch(tmp_path):
    """--help and a refused input answer before torch loads (torch alone is seconds to import)."""
    script = f"""
import sys
from typer.testing import CliRunner
from plugin_lib.__main__ import app
runner = CliRunner()
assert runner.invoke(app, ["--help"]).exit_code == 0
assert runner.invoke(app, ["train", "--help"]).exit_code == 0
bad = runner.invoke(app, ["train", "--base", "smollm2-135m-instruct", "--data", {str(tmp_path / 'none.jsonl')!r},
                          "--out", {str(tmp_path / 'out')!r}])
assert bad.exit_code == 2 and "no such file" in bad.output, bad.output
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_data_check_refuses_an_unknown_profile():
    from plugin_lib.__main__ import app

    done = CliRunner().invoke(app, ["data", "check", "--profile", "nosuch"])
    assert done.exit_code == 2 and "invalid choice: 'nosuch'" in done.output and "local" in done.output


def test_generate_names_the_file_and_line_of_a_malformed_jsonl(tmp_path):
    from plugin_lib.serving import cli

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b"\n')
    done = CliRunner().invoke(cli.app, ["generate", "--plugin", str(tmp_path), "--file", str(prompts)])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert f"{prompts}:2: not a JSON object" in done.output


# ---------------------------------------------------------------- one writer, interrupts


def test_a_second_train_into_one_out_is_refused_at_once_before_torch_loads(tmp_path):
    """Issue 76: the lock is taken before torch and the base load, and its conflict is status 3, as run's."""
    script = f"""
import sys
from typer.testing import CliRunner
from plugin_lib.serving import cli
done = CliRunner().invoke(cli.app, ["train", "--base", "smollm2-135m-instruct", "--data", {str(PAIRS)!r},
                                    "--out", {str(tmp_path / 'mine')!r}, "--profile", "smoke"])
print(done.exit_code, sorted(m for m in ("torch", "transformers") if m in sys.modules))
print(done.output)
"""
    with StoreLock(tmp_path / ".mine.lock"):  # a live train holds it
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    status, output = done.stdout.split("\n", 1)
    assert status == "3 []", done.stdout + done.stderr
    assert "another plugin-repro train" in output and "choose another --out" in output
    assert not (tmp_path / "mine").exists()


def _stand_in_training(monkeypatch, fault):
    """``train`` with its base and its training replaced: the training writes resume state, then
    ``fault`` happens."""
    from plugin_lib.serving import artifact, training

    monkeypatch.setattr(artifact.BaseSpec, "load", lambda self, tokenizer=None: object())

    def train_plugin(*args, resume_dir, **kwargs):
        resume_dir.mkdir(parents=True, exist_ok=True)
        (resume_dir / "config-0.pt").write_bytes(b"x" * 4096)
        fault()

    monkeypatch.setattr(training, "train_plugin", train_plugin)


def test_a_full_disk_in_train_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """Issue 76: a 20 MiB file system gave 73 lines and two tracebacks, and left a resume folder."""
    from plugin_lib.serving import cli

    def full():  # what torch.save says on a full disk
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    _stand_in_training(monkeypatch, full)
    train = ["train", "--base", "smollm2-135m-instruct", "--data", str(PAIRS), "--out", str(tmp_path / "mine"),
             "--profile", "smoke"]
    done = CliRunner().invoke(cli.app, train)  # with room on the disk, torch's words are reported as they are
    assert done.exit_code == 1 and "file write failed" in str(done.exception), done.output
    shutil.rmtree(next(tmp_path.glob(".mine.resume-*")))
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(2**30, 2**30 - 2**20, 2**20))
    done = CliRunner().invoke(cli.app, train)
    assert done.exit_code == 1, done.output
    last = done.output.strip().splitlines()[-1]
    assert last.startswith(f"plugin-repro: error: the disk under {tmp_path} is full") and "was removed" in last
    assert "Traceback" not in done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no resume folder, no lock, no artifact


def test_a_resume_state_of_other_data_is_removed_and_named(tmp_path, monkeypatch):
    """Issue 76: a killed train's 105 MB state outlived a later train on other data, unmentioned."""
    from plugin_lib.serving import cli

    stale = tmp_path / ".mine.resume-0123456789ab"
    stale.mkdir()
    (stale / "config-0.pt").write_bytes(b"x" * 2**20)

    def interrupted():
        raise KeyboardInterrupt

    _stand_in_training(monkeypatch, interrupted)
    done = CliRunner().invoke(cli.app, ["train", "--base", "smollm2-135m-instruct", "--data", str(PAIRS),
                                        "--out", str(tmp_path / "mine"), "--profile", "smoke"])
    assert done.exit_code == 130
    assert f"removed {stale} (1 MiB): the state of an interrupted train of {tmp_path / 'mine'} on other data" in done.output
    assert not stale.exists()
    (kept,) = tmp_path.glob(".mine.resume-*")  # this data's own state stays, for the same command to resume
    assert kept != stale


@pytest.mark.parametrize("stop, status, word", [
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt()), 130, "interrupted"),
    (lambda: os.kill(os.getpid(), signal.SIGTERM), 143, "terminated"),
])
def test_an_interrupt_says_the_same_command_resumes(tmp_path, capsys, stop, status, word):
    from plugin_lib.serving import cli

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(typer.Exit) as ended:
        with cli._interrupts_resume(tmp_path / "mine", tmp_path / ".mine.resume-x"):
            stop()
    assert ended.value.exit_code == status
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"plugin-repro: {word};") and "The same command resumes" in said and len(said.splitlines()) == 1
    assert signal.getsignal(signal.SIGTERM) == before


# ---------------------------------------------------------------- no orphans, one mode


def test_a_killed_writers_temporary_is_removed_by_the_next_write_of_the_file(tmp_path):
    target = tmp_path / "table.json"
    dead = tmp_path / f".table.json.{host_name()}~{ended_pid()}.abc123.tmp"
    live = tmp_path / f"{temporary_prefix(target)}def456.tmp"  # this process: still writing
    other = tmp_path / f".other.json.{host_name()}~{ended_pid()}.abc123.tmp"
    for path in (dead, live, other):
        path.write_bytes(b"x" * 100)
    atomic_write_json(target, {"a": 1})
    assert not dead.exists() and live.exists() and other.exists()


def test_a_killed_checkpoint_writers_temporary_is_removed(tmp_path):
    from plugin_lib.core.checkpoint import save_atomically

    dead = tmp_path / f".config-1.pt.{host_name()}~{ended_pid()}.abc.tmp"
    dead.write_bytes(b"x")
    save_atomically(tmp_path / "config-1.pt", {"a": 1})
    assert not dead.exists() and (tmp_path / "config-1.pt").exists()


def test_an_artifact_save_reaps_a_killed_save_and_writes_one_mode(smollm2, tmp_path):
    from plugin_lib.core.reweighter import make_reweighter
    from plugin_lib.serving.artifact import BaseSpec, PluginModel

    dead = tmp_path / f".mine.{host_name()}~{ended_pid()}.partial.tmp"
    (dead / "reweighter").mkdir(parents=True)
    (dead / "reweighter" / "model.safetensors").write_bytes(b"x" * 1000)
    reweighter = make_reweighter("mlp", smollm2.vocab_size, hidden_size=8, intermediate_size=16, seed=0)
    PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct")).save_pretrained(
        tmp_path / "mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    modes = {path.relative_to(tmp_path).as_posix(): path.stat().st_mode & 0o777
             for path in (tmp_path / "mine").rglob("*") if path.is_file()}
    assert "mine/reweighter.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~current_umask()}, modes


# ---------------------------------------------------------------- faults in one line


def test_an_unusable_cache_folder_names_plugin_cache_dir(tmp_path, monkeypatch):
    from plugin_lib.harness import machine

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "a-file" / "home"))  # unwritable, even for root
    monkeypatch.delenv("PLUGIN_CACHE_DIR", raising=False)
    monkeypatch.setattr(machine, "drive_dir", lambda: None)
    with pytest.raises(machine.CacheDirError, match="cannot be created .*set PLUGIN_CACHE_DIR to a writable folder"):
        machine.cache_dir()


def test_an_unreachable_hub_puts_the_hub_client_offline_at_once(monkeypatch):
    """transformers' adapter lookup ignores local_files_only: unanswered, huggingface_hub itself is
    put offline, so a Hub id fails in seconds instead of 30 s of retries."""
    import huggingface_hub.constants

    from plugin_lib.harness import models

    monkeypatch.setattr(models, "hub_reachable", lambda: False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert models.hub_kwargs("openai-community/gpt2") == {"local_files_only": True}
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True


def test_a_java_that_starts_but_cannot_tokenize_is_named(tmp_path, monkeypatch):
    pytest.importorskip("pycocoevalcap")
    from plugin_lib.metrics.coco import ptb_failure

    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text('#!/bin/sh\n[ "$1" = -version ] && exit 0\necho "Error: could not reserve the heap" >&2\nexit 1\n')
    java.chmod(0o755)
    monkeypatch.setenv("PATH", f"{java.parent}{os.pathsep}{os.environ['PATH']}")
    said = ptb_failure()
    assert f"the Java at {java} starts but cannot run it (Error: could not reserve the heap)" in said
    assert "PLUGIN_JAVA" in said


# ---------------------------------------------------------------- the estimate


def test_padded_tokens_count_each_batch_at_its_longest():
    from plugin_lib.core.pairs import EncodedPair
    from plugin_lib.core.train_estimate import padded_tokens

    pairs = [EncodedPair(tuple(range(n)), 1) for n in (3, 5, 2, 9, 4)]
    assert padded_tokens(pairs, [0, 1, 2, 3, 4], 2) == 2 * 5 + 2 * 9 + 1 * 4
    assert padded_tokens(pairs, [3, 0, 1, 2, 4], 5) == 5 * 9


def test_the_estimate_comes_before_any_work_and_a_resume_counts_what_is_left(smollm2, tmp_path, monkeypatch):
    from plugin_lib.core.cache import BaseOutputCache
    from plugin_lib.harness.profile import load_profile
    from plugin_lib.serving.artifact import BaseSpec
    from plugin_lib.serving.inputs import read_pairs
    from plugin_lib.serving.recipe import TrainingRecipe
    from plugin_lib.serving.training import train_plugin

    events: list[str] = []
    build = BaseOutputCache.build.__func__

    def recorded(cls, base, pairs, **kwargs):
        if kwargs.get("directory") is not None:
            events.append(f"base outputs of {len(pairs)} pairs")
        return build(cls, base, pairs, **kwargs)

    monkeypatch.setattr(BaseOutputCache, "build", classmethod(recorded))
    pairs, spec = read_pairs(PAIRS), BaseSpec("model", "smollm2-135m-instruct")
    arch = {"arch": "llama", "n_layer": 1, "hidden_size": 32, "num_attention_heads": 1, "intermediate_size": 64}
    kept = dict(cache_dir=tmp_path / "outputs", resume_dir=tmp_path / "resume", progress=False, announce=events.append)
    recipe = TrainingRecipe.from_profile(load_profile("smoke")).replace(arch=arch)
    first = train_plugin(smollm2, spec, pairs, recipe, **kept)
    assert events[0].startswith("estimated ") and "base outputs" in events[0] and "refit on every pair" in events[0]
    # One pass of the base over every pair: the grid's two parts and the refit read it.
    assert events[1:] == [f"base outputs of {len(pairs)} pairs"]
    record = first.training
    assert set(record["phases"]) == {"base_outputs_s", "grid_s", "refit_s"}
    assert record["estimate"]["grid_configs"] == len(record["configs"]) and record["estimate"]["total_s"] > 0
    events.clear()
    train_plugin(smollm2, spec, pairs, recipe, **kept)  # as after an interrupt: all finished
    assert "base outputs found stored; grid done" in events[0], events[0]


def test_the_training_record_is_json(tmp_path):
    """What train writes next to the estimate stays plain JSON (numbers, no dataclasses)."""
    from plugin_lib.core.train_estimate import Plan

    plan = Plan(base_s=1.0, grid_s=2.0, grid_configs=1, epochs_left=2, least_epochs_left=1, epoch_s=1.0,
                edges_s=0.0, edge_configs=0, refit_epoch_s=0.5, refit_epochs=2)
    record = json.loads(json.dumps(plan.as_record()))
    assert record["total_s"] == 4.0 and record["least_s"] == 2.5
    assert plan.describe().startswith("estimated 2 s to 4 s, timed here")
    assert "grid 1 configuration(s), 1-2 epoch(s) left" in plan.describe()
