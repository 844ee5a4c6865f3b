"""The dataset-statistics notebook runs top to bottom under papermill (smoke profile) and is
stored commit-ready."""
from plugin_lib.harness.profile import REPO_ROOT

import real_data

NOTEBOOK = REPO_ROOT / "notebooks" / "00_dataset_statistics.ipynb"


def test_notebook_runs_in_the_smoke_profile(tmp_path, monkeypatch):
    real_data.require()
    import papermill

    # The kernel inherits os.environ, so its results go to tmp_path, not the repository.
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    papermill.execute_notebook(
        str(NOTEBOOK), str(tmp_path / "executed.ipynb"), parameters={"profile": "smoke"},
        kernel_name="python3", cwd=str(REPO_ROOT), progress_bar=False)
    for relpath in ("tables/dataset_statistics.csv", "tables/dataset_statistics.md",
                    "tables/dataset_statistics.tex", "figures/dataset_statistics.png",
                    "figures/dataset_statistics.pdf"):
        assert (tmp_path / "smoke" / relpath).stat().st_size > 0
