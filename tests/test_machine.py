"""This machine (``harness.machine``). Where results go: one rule, ``results_path``, for the
package's readers, for ``run``'s orchestrator (which exports it to the notebooks' kernels) and for
the preflight's disk check; the caches beside them on Drive. Whether the Hub answers: one rule,
huggingface_hub's own reading of HF_HUB_OFFLINE, for the models' loader and ``run``'s choice of
profile."""
import os
import socket

import pytest

from plugin_lib.commands.run import Orchestrator, parse
from plugin_lib.harness import machine, models
from plugin_lib.harness import profile as config
from plugin_lib.harness.planning import preflight


@pytest.fixture
def no_results_dir(monkeypatch):
    """PLUGIN_RESULTS_DIR and PLUGIN_CACHE_DIR unset, and put back after the test whatever the
    orchestrator exports."""
    for name in ("PLUGIN_RESULTS_DIR", "PLUGIN_CACHE_DIR"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_on_colab_with_drive_mounted_the_gpu_profiles_keep_results_on_drive(monkeypatch, tmp_path, no_results_dir):
    monkeypatch.setattr(machine, "COLAB_DRIVE", tmp_path / "absent")
    assert machine.drive_dir() is None and machine.results_path("colab") == machine.REPO_ROOT / "results" / "colab"
    monkeypatch.setattr(machine, "COLAB_DRIVE", tmp_path)  # Drive mounted
    drive = tmp_path / "plugin-repro"
    assert machine.results_dir("colab") == drive / "results" / "colab"
    assert machine.results_dir("paper") == drive / "results" / "paper" and machine.cache_dir() == drive / "cache"
    assert machine.results_path("local") == machine.REPO_ROOT / "results" / "local"  # its committed runs stay
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "chosen"))
    assert machine.results_dir("colab") == tmp_path / "chosen" / "colab"  # an explicit choice wins
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", "")  # empty is unset, as a shell's `VAR= cmd` means
    monkeypatch.setenv("PLUGIN_CACHE_DIR", "")
    assert machine.results_dir("colab") == drive / "results" / "colab" and machine.cache_dir() == drive / "cache"


@pytest.mark.parametrize("drive_mounted", [True, False])
@pytest.mark.parametrize("given", [None, "", "chosen"])
def test_run_writes_where_its_notebooks_and_stamp_check_read(monkeypatch, tmp_path, no_results_dir, drive_mounted,
                                                            given):
    monkeypatch.setattr(machine, "COLAB_DRIVE", tmp_path if drive_mounted else tmp_path / "absent")
    if given is not None:
        monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / given) if given else "")
    expected = machine.results_path("paper")
    out = Orchestrator(parse(["--profile", "paper"]))._results_folder(config.load_profile("paper"))
    assert out == expected.absolute()
    assert os.environ["PLUGIN_RESULTS_DIR"] == str(out.parent)  # what the kernels inherit
    assert machine.results_path("paper") == out  # and so read, as `stamp --check` does
    if drive_mounted and not given:
        assert out == tmp_path / "plugin-repro" / "results" / "paper"


def test_the_preflight_measures_the_disk_the_results_go_to(monkeypatch, tmp_path, no_results_dir):
    monkeypatch.setattr(machine, "COLAB_DRIVE", tmp_path)
    profile = config.load_profile("paper")
    short, sentence = preflight._disk_needed(profile, planned=2**40, stored=0, free=0)
    assert short == 2**40 and f"free under {tmp_path / 'plugin-repro' / 'results' / 'paper'} " in sentence


@pytest.fixture
def hub_asked_afresh():
    machine.hub_reachable.cache_clear()
    yield
    machine.hub_reachable.cache_clear()


@pytest.mark.parametrize(("offline", "answers"), [("1", False), ("TRUE", False), ("yes", False), ("on", False),
                                                  ("0", True), ("false", True), ("", True)])
def test_the_hub_is_asked_as_huggingface_hub_reads_its_switch(monkeypatch, hub_asked_afresh, offline, answers):
    """HF_HUB_OFFLINE as huggingface_hub reads it (``false`` is online: the copy `run` used to pick
    a profile read it as offline), and HF_ENDPOINT's host is the one asked: here a socket on this
    machine that listens, so no network is needed."""
    with socket.create_server(("127.0.0.1", 0)) as hub:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        assert machine.hub_reachable() is answers
    assert models.hub_reachable is machine.hub_reachable  # the loader asks the same question


@pytest.mark.parametrize(("endpoint", "port"), [("http://mirror.example", 80), ("https://mirror.example", 443),
                                              ("http://mirror.example:8080", 8080)])
def test_the_hub_is_asked_on_its_endpoints_port(monkeypatch, hub_asked_afresh, endpoint, port):
    asked = []
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout: asked.append(address) or socket.socket())
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert machine.hub_reachable() is True and asked == [("mirror.example", port)]


def test_a_hub_that_does_not_answer_is_unreachable(monkeypatch, hub_asked_afresh):
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there now
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert machine.hub_reachable() is False


def test_offline_a_hub_id_is_read_from_the_local_cache_at_once(monkeypatch, tmp_path, hub_asked_afresh):
    """Without a Hub, commands ask transformers for the local cache only (no 30 s of retries)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.hub_reachable() is False
    assert models.hub_kwargs("openai-community/gpt2-medium") == {"local_files_only": True}
    assert models.hub_kwargs(tmp_path) == {}  # a local directory is read as it is


@pytest.mark.parametrize(("gpu", "hub", "colab", "chosen"), [
    (True, True, False, "paper"), (True, True, True, "colab"), (True, False, True, "local"),
    (False, True, True, "local"), (False, True, False, "local")])
def test_run_chooses_the_profile_the_machine_can_run(monkeypatch, gpu, hub, colab, chosen):
    """Without --profile: a GPU with the Hub runs ``paper``, but on Colab ``colab`` (planned for
    Colab's T4 and A100; ``paper`` for one 80 GB GPU); no GPU or no Hub, ``local``."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(machine, "hub_reachable", lambda: hub)
    if colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20261201")
    else:
        monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    assert machine.on_colab() is colab  # this machine has no google.colab package
    assert machine.auto_profile() == chosen
