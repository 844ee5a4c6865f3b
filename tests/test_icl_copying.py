"""The exploratory ICL-copying diagnostic (``experiments.main_tables.icl_copying_table``)."""
import math

import pytest

from plugin_lib.experiments import main_tables
from plugin_lib.harness.machine import results_dir
from plugin_lib.utils.io import atomic_write_json


def test_copying_counts_only_text_the_input_does_not_have(toy_example):
    query, shown = toy_example(0, "test"), toy_example(7, "validation")
    demonstrations = [(shown, shown.references[0])]
    assert main_tables.copies_demonstrations("Item 7 is a red thing.", query, demonstrations)
    # the input's own words, and words shared by both, are not copying
    assert not main_tables.copies_demonstrations("Item 0 is a red thing.", query, demonstrations)
    assert not main_tables.copies_demonstrations("It is a red thing.", query, demonstrations)


def test_the_layout_echo_is_a_separator_or_a_second_line():
    assert main_tables.echoes_layout("Bananaman | starring | Bill_Oddie")
    assert main_tables.echoes_layout("Apollo_11: William_Anders\nApostrophe: Apollo_11")
    assert not main_tables.echoes_layout("Bill Oddie stars in Bananaman.\n")


def _store(profile, task, method, seed, predictions, bleu=0.5, test_ids=None):
    path = results_dir(profile) / "runs" / task.dataset / task.base.name / f"{method}-seed{seed}.json"
    atomic_write_json(path, {"dataset": task.dataset, "model": task.base.name, "method": method, "seed": seed,
                             "metrics": {"BLEU": bleu}, "predictions": predictions,
                             "test_ids": test_ids or [ex.id for ex in task.test]})


def test_the_table_compares_icl_with_zeroshot_on_the_same_inputs(tiny_profile, toy_task):
    shown, reference = toy_task.demonstrations(1, seed=0)[0][0]
    own = [ex.references[0] for ex in toy_task.test]
    _store(tiny_profile, toy_task, "Zeroshot", 0, ["stale"], test_ids=["toy-test-9"])  # other inputs: passed over
    _store(tiny_profile, toy_task, "Zeroshot", 1, own, bleu=0.7)
    _store(tiny_profile, toy_task, "ICL-1", 0, [reference, own[1]], bleu=0.3)

    table = main_tables.icl_copying_table(tiny_profile, "e2e", toy_task.base.name, task=toy_task)

    row = table.set_index("method").loc["ICL-1"]
    assert (row["copies demonstrations"], row["Zeroshot copies"], row["echoes layout"]) == (0.5, 0.0, 0.0)
    assert (row["BLEU"], row["Zeroshot BLEU"]) == (0.3, 0.7)  # the stored runs' scores
    assert row["clean inputs"] == 1  # input 1, where both outputs are the input's own reference
    assert row["BLEU (clean)"] == row["Zeroshot BLEU (clean)"] == pytest.approx(1.0)
    assert "ICL-3" not in table["method"].values  # no stored runs, no row
    assert (results_dir(tiny_profile) / "tables" / "icl_copying_e2e.csv").exists()


def test_no_clean_input_gives_nan_not_an_error(tiny_profile, toy_task):
    _store(tiny_profile, toy_task, "Zeroshot", 0, ["a | b", "c\nd"])  # both echo the layout
    _store(tiny_profile, toy_task, "ICL-1", 0, ["a", "b"])
    row = main_tables.icl_copying_table(tiny_profile, "e2e", toy_task.base.name, task=toy_task).iloc[0]
    assert row["clean inputs"] == 0 and math.isnan(row["BLEU (clean)"]) and math.isnan(row["Zeroshot BLEU (clean)"])


def test_runs_on_other_inputs_are_refused(tiny_profile, toy_task):
    _store(tiny_profile, toy_task, "Zeroshot", 0, ["a", "b"])
    _store(tiny_profile, toy_task, "ICL-3", 0, ["a"], test_ids=["toy-test-0"])
    with pytest.raises(ValueError, match="stored ICL-3 runs are on other test inputs"):
        main_tables.icl_copying_table(tiny_profile, "e2e", toy_task.base.name, task=toy_task)
    toy_task.test = toy_task.test[:1]
    with pytest.raises(ValueError, match="no stored Zeroshot run"):
        main_tables.icl_copying_table(tiny_profile, "e2e", toy_task.base.name, task=toy_task)
