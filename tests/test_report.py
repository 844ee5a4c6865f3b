import json
from fractions import Fraction

import numpy as np
import pytest

from plugin_lib.harness.profile import REPO_ROOT as ROOT
from plugin_lib.commands import document
from plugin_lib.report import claim_tables, claims


RULE = "A beats B on most metrics, p < 0.05 in most seeds."
STATISTIC = {"summary": "BLEU +0.10 (p 0.01/0.02/0.30); 100 inputs, 3 seeds", "n": {"inputs": 100, "seeds": 3},
             "p_per_seed": {"BLEU": [0.01, 0.02, 0.3]}}


def _claim(profile="local", key="x", verdict="reproduced", **kwargs):
    kwargs = {"rule": RULE, "statistic": STATISTIC, **kwargs}
    return claims.record_claim(profile, key, f"Claim {key}", "81%", "70%", verdict, **kwargs)


def test_claims_and_sections_end_up_in_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    _claim()
    _claim(key="y", verdict="direction only")
    _claim(key="topk_z", verdict="not reproduced", scope="beyond")
    (tmp_path / "local" / "tables").mkdir(parents=True)
    (tmp_path / "local" / "tables" / "main_e2e.md").write_text("| a |\n| - |\n| 1 |\n")
    text = document.write_report("local").read_text()
    assert f"| Claim x | 81% | 70% | {STATISTIC['summary']} | **reproduced** |" in text
    # Tallied apart: the paper's claims and the checks beyond the paper.
    assert "The paper's claims, in all (2): 1 reproduced, 1 direction only." in text  # no zero counts
    assert "Checks beyond the paper, in all (1): 1 not reproduced." in text
    # Every claim's rule, statistic (with its details) and verdict.
    assert text.count(f"- rule: {RULE}") == 3 and text.count(f"- statistic: {STATISTIC['summary']}") == 3
    assert "  - n: inputs 100, seeds 3" in text and "  - p_per_seed: BLEU [0.01, 0.02, 0.3]" in text
    assert "- verdict: **direction only**" in text
    assert "| a |" in text and "No results yet" in text  # a section with and one without results
    assert claim_tables.VERDICT_LEGEND in text


def test_a_grid_waves_report_names_its_inputs_per_dataset_and_its_notebooks_in_one_line(tmp_path, monkeypatch):
    """Wave 4's frozen inputs differ by dataset (54 left on Adidas); its notebooks never run, so
    they get one line instead of a "no results yet" section each, and TIMES.md says where its
    compute is."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    text = document.write_report("wave4").read_text()
    assert "fresh test inputs (54 on adidas, 200 on commongen, 200 on e2e, 200 on webnlg, never decoded" in text
    assert "None of the notebooks ran in this profile. Wave 4 computes only the units its claims read" in text
    assert "No results yet" not in text and "## Main results" not in text
    times = (tmp_path / "wave4" / "TIMES.md").read_text()
    assert "No notebook has run in this profile." in times and "grid plan --profile wave4 --wave 4" in times
    # One run notebook gets its section back; the others stay in the line.
    (tmp_path / "wave4" / "tables").mkdir()
    (tmp_path / "wave4" / "tables" / "main_e2e.md").write_text("| a |\n| - |\n| 1 |\n")
    text = document.write_report("wave4").read_text()
    assert "## Main results, E2E NLG (Table 1)" in text and "Notebooks 00, 02, 03," in text
    assert "fresh test inputs (200 per dataset," in document.write_report("wave3").read_text()


def test_record_claim_checks_verdict_scope_rule_and_statistic(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="verdict"):
        _claim(verdict="maybe")
    with pytest.raises(ValueError, match="scope"):
        _claim(scope="elsewhere")
    with pytest.raises(ValueError, match="rule"):
        _claim(rule=" ")
    with pytest.raises(ValueError, match="summary"):
        _claim(statistic={"n": {"inputs": 1, "seeds": 1}})
    with pytest.raises(TypeError):
        claims.record_claim("local", "x", "A claim", "81%", "70%", "reproduced")  # no rule, no statistic
    entry = _claim(statistic={**STATISTIC, "rho": Fraction(4, 5), "values": (np.float64(0.5), np.int64(3)),
                              "missing": float("nan")})
    assert entry["statistic"]["rho"] == 0.8 and entry["statistic"]["values"] == [0.5, 3]
    assert entry["statistic"]["missing"] is None
    assert claims.load_claims("local")[0] == entry  # JSON as stored


@pytest.mark.parametrize("profile", ["smoke", "paper-twin"])
def test_only_local_and_paper_profiles_give_verdicts(tmp_path, monkeypatch, profile):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    entry = _claim(profile)
    assert entry["verdict"] == "not measurable at this scale" and entry["rule_verdict"] == "reproduced"
    text = claim_tables.claims_table(claims.load_claims(profile))
    assert "- verdict: **not measurable at this scale** (the rule alone gives *reproduced*; " in "\n".join(text)
    assert _claim("paper")["verdict"] == _claim("local")["verdict"] == "reproduced"


def test_old_claim_records_still_render(tmp_path, monkeypatch):
    """Records written before rules and statistics existed (results/local/claims until rerun)."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    folder = tmp_path / "local" / "claims"
    folder.mkdir(parents=True)
    for key in ("main_e2e", "topk_e2e_residual_top-5", "theorem1"):
        (folder / f"{key}.json").write_text(json.dumps(
            {"key": key, "claim": f"old {key}", "paper": "p", "ours": "o", "verdict": "reproduced"}))
    text = document.write_report("local").read_text()
    shown = f"*{claim_tables.NOT_RECHECKED}*"
    assert f"| old main_e2e | p | o | not recorded: rerun the notebook | {shown} |" in text
    assert text.count("- rule: rule not recorded: rerun the notebook") == 3
    # Not tallied as verdicts: top-k and Theorem 1 are beyond the paper.
    assert "The paper's claims, in all (1): none; 1 not re-checked yet" in text
    assert "Checks beyond the paper, in all (2): none; 2 not re-checked yet" in text
    block = "\n".join(document.readme_block("local"))
    assert f"| old main_e2e | not recorded: rerun the notebook | {shown} |" in block
    assert "old theorem1" not in block


def test_readme_block_is_replaced_in_place_and_idempotent(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    _claim()
    _claim(key="beyond", scope="beyond", verdict="not reproduced")
    (tmp_path / "local" / "tables").mkdir(parents=True)
    (tmp_path / "local" / "tables" / "main_e2e_vs_paper.md").write_text("| ours | paper |\n| - | - |\n| 1 | 2 |\n")
    (tmp_path / "local" / "tables" / "main_e2e_wins.md").write_text("| not | shown |\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{document.README_START}\nold text\n{document.README_END}\n\n## Next\n")
    first = document.update_readme("local", readme).read_text()
    assert first.startswith("# Title\n\n") and first.endswith(f"{document.README_END}\n\n## Next\n")
    # One table of the paper's claims (short statistic, verdict); the tally of each scope.
    assert "old text" not in first and f"| Claim x | {STATISTIC['summary']} | **reproduced** |" in first
    assert "Claim beyond" not in first
    assert "The paper's claims (1): 1 reproduced." in first
    assert "Checks beyond the paper (1): 1 not reproduced." in first
    # The README block is the verdicts and a link to REPORT.md; the tables are in REPORT.md only.
    assert "| 1 | 2 |" not in first and "| not | shown |" not in first
    assert "[`results/local/REPORT.md`](results/local/REPORT.md)" in first
    assert document.update_readme("local", readme).read_text() == first
    readme.write_text("# no block\n")
    with pytest.raises(ValueError, match="no results block"):
        document.update_readme("local", readme)


def test_wall_times_are_kept_apart_from_the_results(tmp_path, monkeypatch):
    """Re-executing a notebook changes its wall time, never REPORT.md: the times go to TIMES.md."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    executed = tmp_path / "smoke" / "executed"
    executed.mkdir(parents=True)
    (executed / "01_table1_e2e.seconds").write_text("2143\n131\n")
    report = document.write_report("smoke").read_text()
    (executed / "01_table1_e2e.seconds").write_text("2143\n131\n97\n")  # executed once more
    assert document.write_report("smoke").read_text() == report
    times = (tmp_path / "smoke" / "TIMES.md").read_text()
    assert "| 01_table1_e2e | 3 | 39.5 | 97 |" in times


def test_a_claim_recorded_before_its_rule_is_shown_as_not_rechecked_and_not_tallied():
    checked = {"key": "main_e2e", "claim": "c1", "paper": "p", "ours": "o", "verdict": "reproduced",
               "rule": "a rule", "statistic": {"summary": "s", "n": {}}, "scope": "paper"}
    old = {"key": "shift_webnlg", "claim": "c2", "paper": "p", "ours": "o", "verdict": "reproduced"}
    assert claim_tables.tally([checked, old]).startswith("1 reproduced; 1 not re-checked")  # no zero counts
    assert "1 not re-checked yet" in claim_tables.tally([checked, old])
    table = "\n".join(claim_tables.claims_table([checked, old]))
    assert claim_tables.NOT_RECHECKED in table and "| **reproduced** |" in table


def test_a_long_table_shows_its_first_rows_and_links_its_csv(tmp_path, monkeypatch):
    import pandas as pd

    from plugin_lib.report import writer

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    writer.save_table(pd.DataFrame({"step": range(2252), "word": "adidas"}), "adidas_trace", "local")
    writer.save_table(pd.DataFrame({"word": ["run"]}), "adidas_style_words", "local")
    text = document.write_report("local").read_text()
    shown = [line for line in text.split("**adidas_trace**")[1].splitlines() if line.startswith("| ")]
    assert len(shown) == 1 + document.MAX_TABLE_ROWS  # the header and the first rows
    assert "The first 20 of 2,252 rows; the whole table: [tables/adidas_trace.csv](tables/adidas_trace.csv)." in text
    assert "| run" in text and "rows; the whole table" not in text.split("**adidas_trace**")[0]


def test_a_notebook_that_ran_and_skipped_is_not_reported_as_not_run(tmp_path, monkeypatch):
    import pandas as pd

    from plugin_lib.report import writer

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    writer.save_skip("api_e2e", "smoke", "llama-cpp-python is not installed")
    section = document.write_report("smoke").read_text().split("## Beyond the paper: a model behind an HTTP API")[1].split("\n## ")[0]
    assert "ran in this profile and skipped `api_e2e`: llama-cpp-python is not installed" in section
    assert "has not run" not in section
    writer.save_table(pd.DataFrame({"BLEU": [0.1]}), "api_e2e", "smoke")  # a later run that reached a server
    section = document.write_report("smoke").read_text().split("## Beyond the paper: a model behind an HTTP API")[1].split("\n## ")[0]
    assert "skipped" not in section and "0.1 |" in section


def test_counts_of_seeds_are_pluralised():
    import pandas as pd

    from plugin_lib.experiments import theorem1

    assert [claims.n_seeds(n) for n in (0, 1, 3)] == ["0 seeds", "1 seed", "3 seeds"]
    slopes = pd.DataFrame([{"metric": "excess_loss", "fit_from_tokens": 3000, "fit_to_tokens": 100000,
                            "slope": -0.98, "ci95_low": -1.01, "ci95_high": -0.94}])
    assert theorem1.rate_claim(slopes, 3000, 1)["statistic"]["summary"].endswith("; 1 seed)")


def test_confirmatory_verdicts_lead_the_readme_with_the_exploratory_ones_beside_them(tmp_path, monkeypatch):
    from plugin_lib.report import preregistered

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    _claim(key="main_e2e")
    _claim(key="complexity_e2e_1", verdict="not reproduced")
    assert "| the paper's claim | statistic | verdict |" in "\n".join(document.readme_block("local"))  # none yet
    judged = next(c for c in preregistered.CLAIMS if c.key == "main_e2e")
    claims.record_claim("confirm", "main_e2e", judged.claim, "", "BLEU +0.02", "direction only",
                        rule=preregistered.rule_text(judged), statistic=STATISTIC, preregistered=True)
    block = "\n".join(document.readme_block("local"))
    assert "| the paper's claim | confirmatory statistic | confirmatory | exploratory |" in block
    assert f"| {judged.claim} | {STATISTIC['summary']} | **direction only** | reproduced |" in block
    full = {**STATISTIC, "summary": "BLEU +0.02; 200 inputs, 3 seeds"}  # the profile's full scale: said once
    claims.record_claim("confirm", "main_e2e", judged.claim, "", "BLEU +0.02", "direction only",
                        rule=preregistered.rule_text(judged), statistic=full, preregistered=True)
    block = "\n".join(document.readme_block("local"))
    assert f"| {judged.claim} | BLEU +0.02 | **direction only** | reproduced |" in block
    assert "Each confirmatory statistic is on all 200 test inputs and 3 seeds unless it says otherwise." in block
    waiting = next(c for c in preregistered.CLAIMS if c.key == "complexity_e2e_1")
    assert f"| {waiting.claim} |  | *waiting for its runs* | not reproduced |" in block
    # Issue 60: the row of the pretrained claim names the stand-in that CPU scale tests.
    assert "| pretrained init (a truncated copy of the base, not GPT2-Small) helps |  | *waiting for its runs* |" in block
    paper = sum(c.scope == "paper" for c in preregistered.CLAIMS)
    assert (f"The paper's claims, confirmatory (1; {paper - 1} waiting): 1 direction only. "
            "Exploratory (2): 1 reproduced") in block
    beyond = sum(c.scope == "beyond" for c in preregistered.CLAIMS)  # tallied, listed in REPORT.md only
    assert f"Checks beyond the paper, confirmatory (0; {beyond} waiting): none." in block
    assert "under way, judged as its runs complete" in block and "results/confirm/REPORT.md" not in block
    report = document.write_report("confirm").read_text()
    assert claim_tables.PREREGISTERED_LEGEND in report and claim_tables.VERDICT_LEGEND not in report
    block = "\n".join(document.readme_block("local"))  # now there is a report to link
    assert "[`results/confirm/REPORT.md`](results/confirm/REPORT.md)" in block


def test_exploratory_controls_get_their_own_labelled_section(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    assert "## Exploratory controls" not in document.write_report("local").read_text()  # none run
    (tmp_path / "local" / "tables").mkdir()
    (tmp_path / "local" / "tables" / "sampled_base_e2e.md").write_text("| method | BLEU |\n| - | - |\n| x | 0.1 |\n")
    text = document.write_report("local").read_text()
    section = text[text.index("## Exploratory controls"):]
    assert "so exploratory" in section and "**sampled_base_e2e**" in section and "| x | 0.1 |" in section


def test_a_preregistered_profile_labels_the_notebooks_no_claim_reads_exploratory(tmp_path, monkeypatch):
    """In confirm, notebook 14's tables (no frozen rule reads them) are labelled exploratory and
    notebook 01's (read by the main claims) are not; local's verdicts are all exploratory already,
    and its sections get no such line."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    for profile in ("confirm", "local"):
        (tmp_path / profile / "tables").mkdir(parents=True)
        for stem in ("main_e2e", "api_e2e"):
            (tmp_path / profile / "tables" / f"{stem}.md").write_text("| a |\n| - |\n| 1 |\n")
    text = document.write_report("confirm").read_text()
    main, api = text.index("**main_e2e**"), text.index("**api_e2e**")
    assert text.count(document.UNJUDGED) == 1 and main < api
    assert text.rindex("## ", 0, api) < text.index(document.UNJUDGED) < api  # in notebook 14's section
    assert document.UNJUDGED not in document.write_report("local").read_text()


def test_a_verdict_hiding_a_significant_deficit_is_shown_as_mixed():
    """Adidas' confirmatory "direction only" (Plugin ahead on most metrics) is behind NewModel on
    BLEU and ROUGE-2: the flag says so beside the frozen verdict, which stays as it is."""
    import json

    from plugin_lib.harness.profile import REPO_ROOT
    from plugin_lib.report import mixed

    claim = json.loads((REPO_ROOT / "results" / "confirm" / "claims" / "main_adidas.json").read_text())
    assert claim["verdict"] == "direction only"
    shown = claim_tables.shown_verdict(claim)
    assert shown.startswith("**direction only** (mixed: ") and "behind NewModel on BLEU, ROUGE-2 (Holm p 0.002)" in shown
    e2e = json.loads((REPO_ROOT / "results" / "confirm" / "claims" / "main_e2e.json").read_text())
    assert mixed.flag(e2e) == "" and claim_tables.shown_verdict(e2e) == "**reproduced**"
    # B better than A by the bootstrap, the interval below zero: a deficit; a wide interval is not one.
    comparison = {"p": {"BLEU": 1.0, "NIST": 0.6}, "ci95": {"BLEU": [-0.03, -0.01], "NIST": [-0.1, 0.1]}, "versus": "vs X"}
    assert set(mixed.deficits(comparison)) == {"BLEU"}
    assert mixed.flag({"verdict": "reproduced", "statistic": {"comparisons": [comparison]}}).startswith("mixed: behind X on BLEU")
    assert mixed.flag({"verdict": "not reproduced", "statistic": {"comparisons": [comparison]}}) == ""


def test_equivalence_and_non_superiority_claims_show_what_their_verdict_hides():
    """Issue 60: the mixed flag read only superiority comparisons; the Adidas LoRA claim (an
    equivalence test, direction only) hid LoRA's significant ROUGE-1 lead. Every test type now
    keeps it, from the bootstrap draws: B ahead for equivalence, A ahead for non-superiority."""
    import numpy as np

    from plugin_lib.report import mixed
    from plugin_lib.utils.io import read_json

    adidas = read_json(ROOT / "results" / "confirm" / "claims" / "wave2_table8_lora_gap_adidas.json")
    assert adidas["verdict"] == "direction only"
    assert mixed.flag(adidas).startswith("mixed: behind LoRA on ROUGE-1 (Holm p 0.0")
    assert "behind LoRA on ROUGE-1" in claim_tables.shown_verdict(adidas)
    rng = np.random.default_rng(0)
    draws = {"BLEU": rng.normal(0.02, 0.005, 2000), "ROUGE-1": rng.normal(-0.02, 0.005, 2000),
             "ROUGE-2": rng.normal(0.0, 0.01, 2000), "NIST": rng.normal(0.0, 0.01, 2000)}
    compared = [{"draws": draws, "resamples": 2000}]
    equivalence, non_superiority = [{"verdict": "direction only", "versus": "vs B"}], [{"verdict": "reproduced"}]
    mixed.note_deficits("equivalence", equivalence, compared)
    mixed.note_deficits("non-superiority", non_superiority, compared)
    assert set(equivalence[0]["behind on"]) == {"ROUGE-1"} and set(non_superiority[0]["ahead on"]) == {"BLEU"}
    assert mixed.flag({"verdict": "direction only", "statistic": {"comparisons": equivalence}}).startswith(
        "mixed: behind B on ROUGE-1")
    non_superiority[0]["versus"] = "A-deeper vs A"
    assert mixed.flag({"verdict": "reproduced", "statistic": {"comparisons": non_superiority}}).startswith(
        "mixed: A-deeper vs A: ahead on BLEU")


def test_a_notebook_claim_with_a_significant_deficit_is_stored_and_shown_as_mixed(tmp_path, monkeypatch):
    """A notebook's own rule (one bootstrap p per seed): behind the best baseline in most seeds is
    a deficit; the stored claim carries the flag (a notebook displays it), the verdict stays."""
    from plugin_lib.report import claims, mixed

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    tests = {"BLEU": {"best baseline": "NewModel", "effect": -0.02, "p_per_seed": [1.0, 1.0, 0.97]},
             "ROUGE-1": {"best baseline": "ICL-1", "effect": 0.01, "p_per_seed": [0.001, 0.03, 0.2]},
             "NIST": {"best baseline": "ICL-1", "effect": -0.3, "p_per_seed": [1.0, 0.5, 0.6]}}  # behind in 1/3 only
    assert mixed.seed_deficits({"models": {"m": {"bootstrap": tests}}}) == [
        "behind NewModel on BLEU (p 0.030 or less in 3/3 seeds)"]
    statistic = {"summary": "s", "n": {"inputs": 200, "seeds": 3}, "models": {"m": {"bootstrap": tests}}}
    entry = claims.record_claim("local", "main_x", "x: the Plugin wins", "p", "o", "direction only", rule="r",
                                statistic=statistic)
    assert entry["verdict"] == "direction only" and entry["mixed"] == "mixed: behind NewModel on BLEU (p 0.030 or less in 3/3 seeds)"
    assert "mixed" not in claims.record_claim("local", "main_y", "y", "p", "o", "not reproduced", rule="r",
                                              statistic=statistic)


def test_the_null_claims_margin_sensitivity_is_recomputed_from_the_committed_runs():
    """At 1x the frozen margins each null claim gets its committed verdict (checked inside), and
    the committed table is what the runs give; REPORT.md shows it."""
    import json

    import real_data
    from plugin_lib.experiments import confirmation
    from plugin_lib.harness.profile import REPO_ROOT

    real_data.require("e2e")
    committed = json.loads((REPO_ROOT / "results" / "confirm" / confirmation.MARGINS_FILE).read_text())
    assert confirmation.margin_sensitivity() == committed["claims"]
    verdicts = {c["key"]: c["verdicts"] for c in committed["claims"]}
    assert verdicts["complexity_e2e_1"] == {"1x": "reproduced", "0.5x": "direction only", "0.25x": "direction only"}
    report = (REPO_ROOT / "results" / "confirm" / "REPORT.md").read_text()
    assert "### Margin sensitivity of the null claims" in report
    assert "| more layers do not help (`complexity_e2e_1`) | non-superiority |" in report


def test_wave_2_margin_sensitivity_is_recomputed_from_the_committed_runs_and_shown():
    """Wave 2's null claims get the same table, in its own section of REPORT.md."""
    import json

    import real_data
    from plugin_lib.commands import confirmation_wave2
    from plugin_lib.harness.profile import REPO_ROOT

    committed_file = REPO_ROOT / "results" / "confirm" / confirmation_wave2.MARGINS_FILE
    if not committed_file.exists():
        pytest.skip("no wave-2 null claim is judged yet")
    real_data.require("webnlg", "commongen", "adidas")
    committed = json.loads(committed_file.read_text())
    assert committed["claims"] and confirmation_wave2.margin_sensitivity() == committed["claims"]
    report = (REPO_ROOT / "results" / "confirm" / "REPORT.md").read_text()
    wave2 = report[report.index("## Wave 2: the paper's claims that had no row"):]
    assert "### Margin sensitivity of the null claims" in wave2 and "confirmation wave2 margins" in wave2
    for c in committed["claims"]:
        assert f"| {c['claim']} (`{c['key']}`) | {c['test']} |" in wave2


def test_code_versions_flag_runs_of_one_table_that_differ_in_a_method_module(tmp_path):
    """Runs with provenance: commits, code versions, and the method modules they differ in;
    older runs: only what git proves (committed in), never 'produced by'."""
    from plugin_lib.report.code_versions import code_versions_section, folder_versions

    def made(commit, train):
        return {"git": {"commit": commit * 40, "dirty": False}, "code": commit * 64,
                "modules": {"plugin_lib/core/train.py": train, "plugin_lib/core/combine.py": "c0"}}

    folder = tmp_path / "runs" / "e2e" / "base"
    folder.mkdir(parents=True)
    (folder / "Plugin-seed0.json").write_text(json.dumps({"provenance": made("a", "t1")}))
    (folder / "Plugin-selection.json").write_text(json.dumps({"configs": {"x": {"provenance": made("b", "t2")}}}))
    (folder / "Zeroshot-seed0.json").write_text(json.dumps({"outputs": []}))  # before provenance
    (entry,) = folder_versions(tmp_path / "runs", repo=tmp_path)
    assert entry["records"] == 3 and entry["commits"] == ["aaaaaaa", "bbbbbbb"]
    assert entry["differing"] == ["plugin_lib/core/train.py"]
    assert entry["committed_in"] == ["no git history"]  # tmp_path is no git checkout
    text = "\n".join(code_versions_section(tmp_path, repo=tmp_path))
    assert "**differs: core/train.py**" in text and "produced by" not in text


def test_the_confirmation_report_says_what_git_proves_of_its_runs_code():
    from plugin_lib.harness.profile import REPO_ROOT

    report = (REPO_ROOT / "results" / "confirm" / "REPORT.md").read_text()
    section = report[report.index("## Code versions"):]
    assert "committed in" in section and "| e2e/smollm2-135m-instruct | 69 |" in section
    assert "changed between: core/train.py" in section  # the method changed while the confirmation ran


def test_every_claim_of_the_paper_has_a_row_labelled_with_its_kind(tmp_path):
    """README and REPORT.md show every paper claim: exploratory rows from the confirmation's stored
    comparisons (rules written after the numbers), wave-2 rows, and paper-only rows with why."""
    import json

    from plugin_lib.harness.profile import REPO_ROOT
    from plugin_lib.report import paper_rows

    root = REPO_ROOT / "results" / "confirm"
    claims = {p.stem: json.loads(p.read_text()) for p in (root / "claims").glob("main_*.json")}
    nist = paper_rows.judge_newmodel_nist(claims)
    assert nist["verdict"] == "not reproduced" and "NIST higher on 0/4" in nist["statistic"]["summary"]
    assert paper_rows.judge_weightedcomb(claims)["verdict"] == "reproduced"
    # A dataset where NewModel's NIST is significantly higher, and the Plugin ahead on the rest: reproduced.
    flipped = json.loads(json.dumps(claims))
    comparison = next(c for c in flipped["main_e2e"]["statistic"]["result"]["comparisons"] if c["versus"] == "vs NewModel")
    comparison["effect"]["NIST"], comparison["p"]["NIST"], comparison["ci95"]["NIST"] = -0.5, 1.0, [-0.7, -0.3]
    comparison["ahead on"] = ["BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR", "CIDEr"]
    assert paper_rows.judge_newmodel_nist(flipped)["verdict"] == "reproduced"
    assert paper_rows.judge_weightedcomb({})["verdict"] == "not measurable at this scale"
    # The committed rows: every kind is labelled, and the README shows each row.
    rows = paper_rows.table_rows(root)
    fourth = [row for row in paper_rows.ROWS if row.kind == paper_rows.WAVE_4]
    waiting = not any((REPO_ROOT / "results" / "wave4" / "claims").glob("wave4_*.json"))
    shown = [row for row in paper_rows.ROWS if row.kind != paper_rows.WAVE_4 or not waiting]
    # wave 4's rows are one row while none of its claims is judged
    assert len(rows) == len(shown) + waiting
    confirmatory = [r.split(" | ")[2] for r in rows]  # the column that says what kind of row it is
    exploratory = [c for row, c in zip(shown, confirmatory) if row.kind == paper_rows.EXPLORATORY]
    assert len(exploratory) == 3 and all(c in ("*exploratory only*", "*wave 3 under way*") or c.endswith("(wave 3)")
                                         for c in exploratory)
    # Wave 3's own rows (the proxy arms); an exploratory row that wave 3 judged ends "(wave 3)" too.
    waves = [c for row, c in zip(shown, confirmatory) if row.kind != paper_rows.EXPLORATORY]
    assert sum(c == "*wave 3*" or c.endswith("** (wave 3)") for c in waves) == 2
    assert sum(c == "*wave 2*" or c.endswith("** (wave 2)") for c in confirmatory) == 3
    assert sum(c == "*wave 4*" or c.endswith("** (wave 4)") for c in confirmatory) == (1 if waiting else len(fourth))
    readme = (REPO_ROOT / "README.md").read_text()
    assert all(row.claim in readme for row in shown) and (not waiting or paper_rows.WAVE_4_WAITING in readme)
    report = (root / "REPORT.md").read_text()
    assert all(row.claim in report for row in fourth)  # REPORT.md shows each wave-4 row
    assert "## The paper's other claims" in report and paper_rows.RULES["newmodel_nist"] in report


def test_the_count_line_counts_wave_2_claims_and_rows_apart(tmp_path):
    """A row of wave 2 is complete only when all its claims are judged; the count line says both,
    so that "6 of 9 claims judged" in a row is not read as "0 judged"."""
    import shutil

    from plugin_lib.harness.profile import REPO_ROOT
    from plugin_lib.report import paper_rows

    (tmp_path / "claims").mkdir()
    for claim in ("plugin_vs_bdpl", "bdpl_plugin", "bdpl_plugin_vs_plugin"):  # WebNLG's Table 5, judged
        name = f"wave2_table5_{claim}_webnlg.json"
        shutil.copy(REPO_ROOT / "results" / "confirm" / "claims" / name, tmp_path / "claims" / name)
    line = paper_rows.count_line(tmp_path)
    assert "3 rows in wave 2 (15 claims" in line and "3 claims judged (3 not measurable at this scale)" in line
    assert "0 of 3 rows complete" in line
    assert "0 claims judged, 0 of 3 rows complete" in paper_rows.count_line(tmp_path / "none")


def test_the_wave_2_section_lists_every_claim_judged_or_not(tmp_path):
    """Every wave-2 claim has a line in REPORT.md from the first verdict on: judged in the table,
    the others in a list saying they wait for their runs."""
    import json

    from plugin_lib.harness.profile import REPO_ROOT
    from plugin_lib.report import preregistered_wave2
    from plugin_lib.commands.document import wave2_section

    judged = json.loads((REPO_ROOT / "results" / "confirm" / "claims" / "wave2_complexity_webnlg.json").read_text())
    section = "\n".join(wave2_section([judged], tmp_path))
    assert "1 of 15 claims judged so far" in section and "Not judged yet, 14 (" in section
    waiting = section[section.index("Not judged yet"):section.index("### The paper's claims")]
    assert all(f"`{c.key}`" in waiting for c in preregistered_wave2.CLAIMS if c.key != judged["key"])
    assert f"`{judged['key']}`" not in waiting and f"`{judged['key']}`" in section
    assert wave2_section([], tmp_path) == []  # no section before the first verdict
    committed = (REPO_ROOT / "results" / "confirm" / "REPORT.md").read_text()
    committed = committed[committed.index("## Wave 2: the paper's claims that had no row"):]
    assert all(f"`{c.key}`" in committed for c in preregistered_wave2.CLAIMS)
