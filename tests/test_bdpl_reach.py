"""Why Table 5 is not measurable at the confirmation's budget (issue 60), from BDPL's own
searches: the growth of top probability x C per update and what reaching the premise needs."""
from __future__ import annotations

import pytest

from plugin_lib.report import bdpl_reach
from plugin_lib.utils.io import atomic_write_json


def search(root, dataset: str, seed: int, finals: list[float], candidates: int = 50, calls: int = 75):
    """A stored search whose top probability x C is ``finals[k]`` after update k + 1."""
    history = [{"step": k + 1, "top_probs": [final / candidates, 1.0 / candidates]} for k, final in enumerate(finals)]
    atomic_write_json(root / "runs" / dataset / "base" / "bdpl-prompts" / f"seed{seed}.json",
                      {"history": history, "bdpl": {"num_candidates": candidates}, "calls_used": calls})


def test_growth_per_update_and_the_updates_the_premise_needs(tmp_path):
    assert bdpl_reach.reach(tmp_path) is None and bdpl_reach.line(tmp_path) == ""
    search(tmp_path, "webnlg", 0, [1.002, 1.004, 1.006, 1.008])  # 0.002 an update
    search(tmp_path, "adidas", 0, [1.005, 1.01, 1.015, 1.02])    # 0.005
    search(tmp_path, "adidas", 1, [1.01, 1.02, 1.03, 1.04])      # 0.01
    found = bdpl_reach.reach(tmp_path)
    assert found["searches"] == 3 and found["updates"] == 4 and found["calls per update"] == 18.75
    assert found["growth per update"] == pytest.approx(0.005)  # the median search
    assert found["updates needed"] == pytest.approx(200) and found["calls needed"] == pytest.approx(3750)
    assert bdpl_reach.line(tmp_path) == (
        "Why Table 5 is not measurable: BDPL's 3 searches made 4 updates (75 calls); top probability x C grew "
        "0.0050 an update from 1.0; the premise asks 2.0: about 200 updates (3,750 calls).")


def test_the_would_be_verdicts_are_labelled_as_such(tmp_path):
    search(tmp_path, "webnlg", 0, [1.005, 1.01, 1.015, 1.02])
    rows = [{"a": "Plugin", "b": ["BDPL"], "would-be verdict": v} for v in ("reproduced", "reproduced", "direction only")]
    atomic_write_json(tmp_path / bdpl_reach.WOULD_BE_FILE, {"claims": rows})
    assert bdpl_reach.line(tmp_path).endswith(
        "Premise ignored, reproduced (would-be verdicts, not claims): Plugin > BDPL 2/3.")
