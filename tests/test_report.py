import pytest

from plugin_lib.report import claims, document


def test_claims_and_sections_end_up_in_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    claims.record_claim("local", "x", "A claim", "81%", "70%", claims.majority_verdict(4, 7))
    with pytest.raises(ValueError, match="verdict"):
        claims.record_claim("local", "y", "B", "1", "2", "maybe")
    (tmp_path / "local" / "tables").mkdir(parents=True)
    (tmp_path / "local" / "tables" / "main_e2e.md").write_text("| a |\n| - |\n| 1 |\n")
    text = document.write_report("local").read_text()
    assert "| A claim | 81% | 70% | **reproduced** |" in text
    assert "In all: 1 reproduced, 0 not reproduced, 0 not measurable at this scale." in text
    assert "| a |" in text and "No results yet" in text  # a section with and one without results


def test_smoke_verdicts_are_never_claims(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    entry = claims.record_claim("smoke", "x", "A claim", "81%", "90%", "reproduced")
    assert entry["verdict"] == "not measurable at this scale"


def test_majority_verdict():
    assert claims.majority_verdict(4, 7) == "reproduced"
    assert claims.majority_verdict(3, 7) == "not reproduced"


def test_ablation_checks_become_claims(tmp_path, monkeypatch):
    from plugin_lib.experiments import ablations

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    entries = ablations.record_claims("local", {"one layer helps": "Supported: +0.1 BLEU",
                                                "more layers hurt": "Not supported: x"},
                                      "complexity", "e2e", "Figure 3")
    assert [e["verdict"] for e in entries] == ["reproduced", "not reproduced"]
    assert len(claims.load_claims("local")) == 2


def test_readme_block_is_replaced_in_place_and_idempotent(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    claims.record_claim("local", "x", "A claim", "81%", "70%", "reproduced")
    (tmp_path / "local" / "tables").mkdir(parents=True)
    (tmp_path / "local" / "tables" / "main_e2e_vs_paper.md").write_text("| ours | paper |\n| - | - |\n| 1 | 2 |\n")
    (tmp_path / "local" / "tables" / "main_e2e_wins.md").write_text("| not | shown |\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{document.README_START}\nold text\n{document.README_END}\n\n## Next\n")
    first = document.update_readme("local", readme).read_text()
    assert first.startswith("# Title\n\n") and first.endswith(f"{document.README_END}\n\n## Next\n")
    assert "old text" not in first and "| A claim | 70% | **reproduced** |" in first
    # The README block is the verdicts and a link to REPORT.md; the tables are in REPORT.md only.
    assert "| 1 | 2 |" not in first and "| not | shown |" not in first
    assert "[`results/local/REPORT.md`](results/local/REPORT.md)" in first
    assert document.update_readme("local", readme).read_text() == first
    readme.write_text("# no block\n")
    with pytest.raises(ValueError, match="no results block"):
        document.update_readme("local", readme)


def test_wall_time_sums_the_executions(tmp_path):
    (tmp_path / "executed").mkdir()
    (tmp_path / "executed" / "01_table1_e2e.seconds").write_text("2143\n131\n")
    assert document._notebook_seconds(tmp_path, "01") == "37.9 min over 2 executions"
    assert document._notebook_seconds(tmp_path, "02") == "not recorded on this machine"
