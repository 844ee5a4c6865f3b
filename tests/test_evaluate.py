"""``plugin-repro evaluate`` (issue 44): the Plugin against its base alone on a small held-out
file, with the package's metrics and chrF, paired bootstrap intervals, stored in the artifact
and its model card; and ``generate --base-only``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from typer.testing import CliRunner

from plugin_lib.core.decode import generate
from plugin_lib.metrics import compute_metrics
from plugin_lib.serving import cli
from plugin_lib.serving.evaluation import METRICS, _Sacrebleu, base_only_outputs
from test_serving import PROMPT, plugin  # noqa: F401 - the fixture

HELDOUT = Path(__file__).parent / "fixtures" / "heldout.jsonl"  # six pairs none of the tests trains on


def test_evaluate_scores_both_systems_and_writes_the_card(plugin, tmp_path):  # noqa: F811
    plugin.save_pretrained(tmp_path / "mine")
    runner = CliRunner()
    args = ["evaluate", "--plugin", str(tmp_path / "mine"), "--data", str(HELDOUT), "--resamples", "200",
            "--max-new-tokens", "8"]
    done = runner.invoke(cli.app, args)
    assert done.exit_code == 0, done.output
    stored = json.loads((tmp_path / "mine" / "evaluation.json").read_text())
    assert stored["n"] == 6 and stored["resamples"] == 200 and stored["data"]["pairs"] == 6
    assert {"BLEU", "ROUGE-1", "ROUGE-2", "NIST", "sacreBLEU", "chrF", "exact match", "output/reference length",
            "empty", "at the token limit"} <= set(stored["metrics"])
    references = [[json.loads(line)["completion"]] for line in HELDOUT.read_text().splitlines()]
    for system in ("plugin", "base"):  # the whole-set scores are the package's own, and sacrebleu's
        outputs = stored["outputs"][system]
        expected = compute_metrics(outputs, references, metrics=["BLEU", "NIST"])
        assert stored["metrics"]["BLEU"][system] == expected["BLEU"]
        assert np.isclose(stored["metrics"]["NIST"][system], expected["NIST"])
        refs = [r[0] for r in references]
        assert np.isclose(stored["metrics"]["sacreBLEU"][system], BLEU().corpus_score(outputs, [refs]).score)
        assert stored["metrics"]["exact match"][system] == np.mean([o.strip() == r.strip() for o, r in zip(outputs, refs)])
        assert np.isclose(stored["metrics"]["output/reference length"][system],
                          sum(len(o.split()) for o in outputs) / sum(len(r.split()) for r in refs))
        assert stored["metrics"]["empty"][system] == np.mean([not o.strip() for o in outputs])
    assert stored["max_new_tokens"] == 8 and stored["signatures"]["sacreBLEU"].startswith("nrefs:1")
    for metric, row in stored["metrics"].items():
        assert row["difference"] == row["plugin"] - row["base"] and row["ci95"][0] <= row["ci95"][1]
        assert row["measures"] == METRICS[metric]  # every row names its implementation and scale
    assert "| chrF | sacrebleu chrF, 0-100 |" in done.stdout and "95% CI" in done.stdout
    assert "| BLEU | plugin_lib.metrics (the paper's, as the E2E scorer), 0-1 |" in done.stdout
    card = (tmp_path / "mine" / "README.md").read_text()
    assert str(HELDOUT) in card and "sacrebleu signatures" in card  # the card names the file evaluated on
    assert card.count("## Evaluation") == 1 and card.index("## Evaluation") < card.index("## Use")
    assert runner.invoke(cli.app, args).exit_code == 0  # again: the section is replaced, not added
    assert (tmp_path / "mine" / "README.md").read_text().count("## Evaluation") == 1
    missing = runner.invoke(cli.app, ["evaluate", "--plugin", str(tmp_path / "mine"), "--data", str(tmp_path / "x.jsonl")])
    assert missing.exit_code == 2 and "x.jsonl: no such file" in missing.output


def test_chrf_and_bleu_of_resampled_corpora_are_sacrebleus():
    hypotheses, references = ["the cat sat on the mat", "a dog barked", "blue"], ["the cat is on the mat",
                                                                                 "a dog is barking", "blue sky"]
    chrf = _Sacrebleu(CHRF(), hypotheses, references)
    assert np.isclose(chrf.scores(np.ones((1, 3), dtype=np.int64))[0],
                      CHRF().corpus_score(hypotheses, [references]).score)
    twice = np.array([[2, 0, 1]])
    assert np.isclose(chrf.scores(twice)[0], CHRF().corpus_score(hypotheses[:1] * 2 + hypotheses[2:],
                                                                 [references[:1] * 2 + references[2:]]).score)
    bleu = _Sacrebleu(BLEU(), hypotheses, references)
    assert np.isclose(bleu.scores(np.ones((1, 3), dtype=np.int64))[0], BLEU().corpus_score(hypotheses, [references]).score)


def test_generate_base_only_is_the_base_decoded_as_the_plugin_decodes(plugin, tmp_path):  # noqa: F811
    plugin.save_pretrained(tmp_path / "mine")
    done = CliRunner().invoke(cli.app, ["generate", "--plugin", str(tmp_path / "mine"), "--prompt", PROMPT,
                                        "--base-only", "--max-new-tokens", "8"])
    assert done.exit_code == 0, done.output
    alone = generate(plugin.base, [plugin.format_prompt(PROMPT)], None, max_new_tokens=8,
                     repetition_penalty=plugin.decoding.repetition_penalty, progress=False)[0]
    assert done.stdout.strip() == alone == base_only_outputs(plugin, [PROMPT], max_new_tokens=8)[0]
