"""The preregistered confirmation (issue 25): the frozen rules' tests on constructed inputs, and
the check that git history shows the rules before every confirmatory result."""
import subprocess

import numpy as np
import pytest

from plugin_lib.metrics import METRIC_NAMES
from plugin_lib.report import freeze, preregistered as pre

from conftest import FAKE_REFERENCES


def _run(seed, predictions, score=0.5):
    ids = list(FAKE_REFERENCES)
    return {"seed": seed, "test_ids": ids, "predictions": predictions, "metrics": dict.fromkeys(METRIC_NAMES, score)}


def _outputs(good):
    """The first ``good`` inputs answered with their reference, the rest with unrelated words."""
    return [refs[0] if n < good else "completely unrelated words here" for n, refs in enumerate(FAKE_REFERENCES.values())]


REFERENCES = list(FAKE_REFERENCES.values())


# ---------------------------------------------------------------- the history check


def test_git_history_shows_the_rules_before_every_confirmatory_result():
    try:
        problems = freeze.check()
    except freeze.HistoryUnavailable as why:
        pytest.skip(f"no git history to check: {why}")
    assert problems == []


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def history(tmp_path):
    """A git repository with a rules file, a profiles.yaml with a `confirm` profile, and a
    helper that commits (path, text) pairs and returns the commit."""
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.org")
    _git(tmp_path, "config", "user.name", "t")

    def commit(files, message="c"):
        for path, text in files.items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-q", "-m", message)
        return subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()

    return tmp_path, commit


PROFILES = """models:
  m: {source: test, family: f}
reweighters:
  f: {arch: llama}
profiles:
  confirm:
    base_models: [m]
    ablations: {model: m}
    api: {model: m, compare: m}
    shift: {model: null}
    grid: {lr: [%s]}
"""


def test_the_check_flags_results_before_the_freeze_changed_rules_and_a_changed_profile(history):
    repo, commit = history
    early = commit({"results/confirm/claims/a.json": "{}"}, "a result before any rule")
    assert freeze.check(repo, None, ["rules.py"], profiles="profiles.yaml")  # results without a freeze
    frozen = commit({"rules.py": "RULE = 1\n", "profiles.yaml": PROFILES % "0.1"}, "freeze")
    commit({"results/confirm/claims/b.json": "{}"}, "a result after the freeze")
    problems = freeze.check(repo, frozen, ["rules.py"], profiles="profiles.yaml")
    assert len(problems) == 1 and "a.json" in problems[0] and early[:10] in problems[0]
    _git(repo, "rm", "-q", "results/confirm/claims/a.json")
    commit({}, "drop the early result")
    assert freeze.check(repo, frozen, ["rules.py"], profiles="profiles.yaml") == []
    commit({"rules.py": "RULE = 2\n", "profiles.yaml": PROFILES % "0.2"}, "rules adjusted after the numbers")
    problems = freeze.check(repo, frozen, ["rules.py"], profiles="profiles.yaml")
    assert any("rules.py differs" in p for p in problems) and any("'confirm' profile" in p for p in problems)


def test_a_result_in_the_freezing_commit_itself_does_not_come_after_it(history):
    repo, commit = history
    frozen = commit({"rules.py": "RULE = 1\n", "profiles.yaml": PROFILES % "0.1",
                     "results/confirm/x.json": "{}"})
    assert any("x.json" in p for p in freeze.check(repo, frozen, ["rules.py"], profiles="profiles.yaml"))


def test_a_shallow_or_missing_history_is_named(tmp_path):
    with pytest.raises(freeze.HistoryUnavailable, match="not a git checkout"):
        freeze.check(tmp_path, None)


# ---------------------------------------------------------------- the statistics


def test_holm_adjusts_step_down_and_keeps_order():
    adjusted = pre.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    # sorted: a 4 x 0.01, c 3 x 0.03, b max(0.09, 2 x 0.04), d max(0.09, 1 x 0.5)
    assert adjusted == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.5})


def test_hierarchical_draws_resample_seeds_then_inputs():
    seeds, counts = pre.hierarchical_draws(3, 5, resamples=400, seed=1)
    assert seeds.shape == (400, 3) and counts.shape == (400, 3, 5)
    assert (counts.sum(axis=2) == 5).all()
    assert set(np.unique(seeds)) == {0, 1, 2} and (seeds == seeds[:, :1]).all(axis=1).mean() < 0.25


def test_a_clearly_better_system_is_reproduced_and_an_equal_one_is_not():
    better = [_run(s, _outputs(11), 0.9) for s in range(3)]
    worse = [_run(0, _outputs(3), 0.2)]
    result = pre.superiority(pre.compare(better, worse, REFERENCES, resamples=300))
    assert result["verdict"] == pre.REPRODUCED and result["n"] == {"inputs": 12, "seeds": 3}
    same = pre.superiority(pre.compare(better, [_run(s, _outputs(11), 0.9) for s in range(3)], REFERENCES,
                                       resamples=300))
    assert same["verdict"] == pre.NOT_REPRODUCED  # no metric ahead: not the direction
    assert all(p == 1.0 for p in same["p"].values())


def test_the_observed_difference_is_the_corpus_scores_of_the_runs():
    from plugin_lib.metrics import compute_metrics

    a, b = _outputs(9), _outputs(4)
    comparison = pre.compare([_run(0, a)], [_run(0, b)], REFERENCES, resamples=50)
    bleu = compute_metrics(a, REFERENCES)["BLEU"] - compute_metrics(b, REFERENCES)["BLEU"]
    assert comparison["difference"]["BLEU"] == pytest.approx(bleu, abs=1e-9)


def test_a_null_claim_needs_its_margin_shown_not_a_failed_test():
    same = [_run(s, _outputs(8)) for s in range(3)]
    shown = pre.non_superiority(pre.compare(same, same, REFERENCES, resamples=300))
    assert shown["verdict"] == pre.REPRODUCED  # identical systems: every draw differs by 0 < margin
    better = pre.non_superiority(pre.compare([_run(s, _outputs(12), 0.9) for s in range(3)],
                                             [_run(0, _outputs(2), 0.1)], REFERENCES, resamples=300))
    assert better["verdict"] == pre.NOT_REPRODUCED
    wide = pre.non_superiority(pre.compare([_run(0, _outputs(7))], [_run(0, _outputs(6))], REFERENCES,
                                           resamples=300), margins={m: 0.001 for m in pre.MARGINS})
    assert wide["verdict"] == pre.DIRECTION_ONLY or wide["verdict"] == pre.NOT_REPRODUCED
    assert wide["verdict"] != pre.REPRODUCED  # a tiny margin cannot be shown with 12 inputs


def test_equivalence_is_tost_and_a_clear_gap_is_not_equivalent():
    same = [_run(s, _outputs(8)) for s in range(2)]
    assert pre.equivalence(pre.compare(same, same, REFERENCES, resamples=300))["verdict"] == pre.REPRODUCED
    gap = pre.equivalence(pre.compare([_run(0, _outputs(1), 0.1)], [_run(0, _outputs(12), 0.9)], REFERENCES,
                                      resamples=300))
    assert gap["verdict"] == pre.NOT_REPRODUCED


def test_the_report_shows_comparisons_as_a_table_of_differences_intervals_and_holm_p():
    from plugin_lib.report import claim_tables

    better = [_run(s, _outputs(11), 0.9) for s in range(3)]
    worse = [_run(0, _outputs(3), 0.2)]
    superior = {**pre.superiority(pre.compare(better, worse, REFERENCES, resamples=300)), "versus": "vs B"}
    null = {**pre.non_superiority(pre.compare(better, better, REFERENCES, resamples=300)), "versus": "deeper"}
    claims = [{"key": key, "claim": key, "paper": "", "ours": "s", "verdict": result["verdict"], "rule": "r",
               "scope": "paper", "statistic": {"summary": "s", "n": result["n"],
                                                "result": {"verdict": result["verdict"], "comparisons": [result]}}}
              for key, result in (("better", superior), ("null", null))]
    text = "\n".join(claim_tables.claims_table(claims, claim_tables.PREREGISTERED_LEGEND))
    assert "{'" not in text  # no Python reprs of the records
    assert "| claim | paper | ours (the statistic) | verdict |" in text  # ours is the statistic: one column
    assert "(in full: [claims/better.json](claims/better.json))" in text

    def cell(result, metric, interval):
        low, high = result[interval][metric]
        return f"{result['difference'][metric]:+.4f} [{low:+.4f}, {high:+.4f}], p {result['p (Holm)'][metric]:.3f}"

    ahead, significant = len(superior["ahead on"]), len(superior["significant on"])
    assert (ahead, significant) == (7, 4)
    others = ", ".join(f"{m} {superior['effect'][m]:+.4f}" for m in ("ROUGE-L", "METEOR", "CIDEr"))
    assert (f"| vs B | reproduced | 7/7 | 4/4 | {' | '.join(cell(superior, m, 'ci95') for m in pre.BOOTSTRAP_METRICS)}"
            f" | {others} |") in text
    assert ("| comparison | verdict | not better by the margin on | "
            "BLEU: A - B [90% CI], Holm p, not better by the margin |") in text
    assert f"| deeper | reproduced | 4/4 | {cell(null, 'BLEU', 'ci90')} |" in text


def test_other_record_lists_become_tables_with_every_key_and_escaped_cells():
    from plugin_lib.report import claim_tables

    per_seed = [{"seed": 0, "prefix": "a | b", "learned": False}, {"seed": 1, "prefix": "", "gain": 0.5}]
    table = claim_tables.records_table(per_seed)
    assert table[0] == "| seed | prefix | learned | gain |"
    assert table[2] == "| 0 | a \\| b | False | n/a |" and table[3] == "| 1 |  | n/a | 0.5 |"


def test_ratio_compare_pools_counts_per_seed():
    n = 40
    plugin = [(np.full(n, 3), np.full(n, 10)) for _ in range(3)]
    base = [(np.full(n, 1), np.full(n, 10))]
    result = pre.ratio_compare(plugin, base, resamples=200)
    assert result["verdict"] == pre.REPRODUCED and result["difference"] == pytest.approx(0.2)
    assert pre.ratio_compare(base, plugin[:1], resamples=200)["verdict"] == pre.NOT_REPRODUCED
    empty = pre.ratio_compare([(np.zeros(n, int), np.zeros(n, int))], base, resamples=50)
    assert empty["share A per seed"] == [0.0]


def test_sign_test_counts_each_input_once():
    outcomes = [[1] * 15 + [-1] * 2 + [0] * 3, [1] * 15 + [-1] * 2 + [0] * 3]
    result = pre.sign_test_over_inputs(outcomes)
    assert result["inputs favouring A"] == 15 and result["ties"] == 3 and result["verdict"] == pre.REPRODUCED
    assert pre.sign_test_over_inputs([[1, -1, 1, -1]])["verdict"] == pre.NOT_REPRODUCED


def test_narrower_spread_needs_an_f_test_against_every_rival():
    tight = {m: [0.5, 0.5001, 0.4999] for m in METRIC_NAMES}
    loose = {m: [0.3, 0.5, 0.7] for m in METRIC_NAMES}
    assert pre.narrower_spread({"T": tight, "M": loose, "L": loose}, "T")["verdict"] == pre.REPRODUCED
    assert pre.narrower_spread({"T": loose, "M": tight, "L": loose}, "T")["verdict"] == pre.NOT_REPRODUCED
    one = {m: [0.5] for m in METRIC_NAMES}
    assert pre.narrower_spread({"T": one, "M": one}, "T")["verdict"] == pre.NOT_MEASURABLE


def _prompt(prefix, gain, top):
    return {"prefix": prefix, "hyper_reward": -2.0 + gain, "hyper_reward_no_prefix": -2.0, "top_probs": [top] * 6,
            "bdpl": {"num_candidates": 50}}


def test_bdpl_premise_needs_a_prompt_that_left_uniform():
    # As the exploratory runs: a non-empty prompt chosen on hyper-validation, but 0.0203 ~ 1/50.
    assert not pre.bdpl_learned([_prompt("a b", 0.019, 0.0203)] * 3)["holds"]
    assert not pre.bdpl_learned([_prompt("", 0.0, 0.3)] * 3)["holds"]
    assert pre.bdpl_learned([_prompt("a b", 0.05, 0.3), _prompt("c", 0.02, 0.1), _prompt("", 0, 0.02)])["holds"]


def test_shift_premise_is_a_binomial_test_against_the_references_share():
    biased = pre.biased_against_target(target=0, counted=98, reference_target=40, reference_counted=100)
    assert biased["holds"] and biased["p"] < 1e-10
    assert not pre.biased_against_target(target=1, counted=3, reference_target=40, reference_counted=100)["holds"]
    assert not pre.biased_against_target(0, 0, 40, 100)["holds"]


def test_flops_and_rate_verdicts_are_exact():
    assert pre.flops_verdict(104, 100) == pre.REPRODUCED
    assert pre.flops_verdict(105, 100) == pre.NOT_REPRODUCED  # 1.05 is not below 1.05
    assert pre.rate_verdict(-1.2, -0.9) == pre.REPRODUCED and pre.rate_verdict(-0.8, -0.5) == pre.NOT_REPRODUCED


def test_weakest_and_premise_failures():
    assert pre.weakest([pre.REPRODUCED, pre.DIRECTION_ONLY]) == pre.DIRECTION_ONLY
    assert pre.weakest([pre.REPRODUCED, pre.NOT_MEASURABLE]) == pre.NOT_MEASURABLE


def test_every_claim_has_its_rule_in_words_and_a_unique_key():
    keys = [c.key for c in pre.CLAIMS]
    assert len(keys) == len(set(keys))
    for c in pre.CLAIMS:
        assert c.test in pre.TESTS and (c.premise is None or c.premise in pre.PREMISES)
        assert len(pre.rule_text(c)) > 40
    notebooks = {c.notebook for c in pre.CLAIMS}
    assert notebooks == {f"{i:02d}" for i in range(1, 14)}
