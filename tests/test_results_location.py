"""Where results go: one rule, ``harness.profile.results_path``, for the package's readers, for
``run``'s orchestrator (which exports it to the notebooks' kernels) and for the preflight's disk
check; and the caches beside them on Drive."""
import os

import pytest

from plugin_lib.commands.run import Orchestrator, parse
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
    monkeypatch.setattr(config, "COLAB_DRIVE", tmp_path / "absent")
    assert config.drive_dir() is None and config.results_path("colab") == config.REPO_ROOT / "results" / "colab"
    monkeypatch.setattr(config, "COLAB_DRIVE", tmp_path)  # Drive mounted
    drive = tmp_path / "plugin-repro"
    assert config.results_dir("colab") == drive / "results" / "colab"
    assert config.results_dir("paper") == drive / "results" / "paper" and config.cache_dir() == drive / "cache"
    assert config.results_path("local") == config.REPO_ROOT / "results" / "local"  # its committed runs stay
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "chosen"))
    assert config.results_dir("colab") == tmp_path / "chosen" / "colab"  # an explicit choice wins
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", "")  # empty is unset, as a shell's `VAR= cmd` means
    monkeypatch.setenv("PLUGIN_CACHE_DIR", "")
    assert config.results_dir("colab") == drive / "results" / "colab" and config.cache_dir() == drive / "cache"


@pytest.mark.parametrize("drive_mounted", [True, False])
@pytest.mark.parametrize("given", [None, "", "chosen"])
def test_run_writes_where_its_notebooks_and_stamp_check_read(monkeypatch, tmp_path, no_results_dir, drive_mounted,
                                                            given):
    monkeypatch.setattr(config, "COLAB_DRIVE", tmp_path if drive_mounted else tmp_path / "absent")
    if given is not None:
        monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / given) if given else "")
    expected = config.results_path("paper")
    out = Orchestrator(parse(["--profile", "paper"]))._results_folder(config.load_profile("paper"))
    assert out == expected.absolute()
    assert os.environ["PLUGIN_RESULTS_DIR"] == str(out.parent)  # what the kernels inherit
    assert config.results_path("paper") == out  # and so read, as `stamp --check` does
    if drive_mounted and not given:
        assert out == tmp_path / "plugin-repro" / "results" / "paper"


def test_the_preflight_measures_the_disk_the_results_go_to(monkeypatch, tmp_path, no_results_dir):
    monkeypatch.setattr(config, "COLAB_DRIVE", tmp_path)
    profile = config.load_profile("paper")
    short, sentence = preflight._disk_needed(profile, planned=2**40, stored=0, free=0)
    assert short == 2**40 and f"free under {tmp_path / 'plugin-repro' / 'results' / 'paper'} " in sentence
