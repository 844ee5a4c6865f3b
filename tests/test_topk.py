import math

import pytest
import torch
import torch.nn.functional as F

from plugin_lib.core.blackbox import TopKBlackBox, restrict_log_probs
from plugin_lib.core.decode import PluginLogitsProcessor, generate, greedy_decode_uncached
from plugin_lib.core.loss import shift_labels, target_positions
from plugin_lib.core.reweighter import ContextFreeReweighter, reweighter_logits
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import collate, encode_pairs
from plugin_lib.core.train import TokenObjective, TrainConfig, fit, plugin_log_probs, reachable_plugin_log_probs
from plugin_lib.experiments.topk import (TOPK_RULE, plot_metric_vs_k, plugin_gaps, record_claims, reference_coverage,
                                         view_label)
from plugin_lib.harness import models
from plugin_lib.harness.running import run_store
from plugin_lib.harness.models import load_base_model, parse_model_name
from plugin_lib.harness.profile import load_profile
from plugin_lib.report import tables

PROMPTS = [f"Describe item {i}: colour {c}, size {s}." for i, (c, s) in
           enumerate([("red", "small"), ("blue", "large"), ("green", "medium")] * 2)]
TARGETS = [f"A {s} {c} item, number {i}." for i, (c, s) in
           enumerate([("red", "small"), ("blue", "large"), ("green", "medium")] * 2)]


def _encode(base, prompts):
    return base.tokenizer(prompts, return_tensors="pt", padding=True)


def _base_log_probs(base, enc):
    return F.log_softmax(base.logits(enc.input_ids, enc.attention_mask).float(), dim=-1)


def _generated_ranks(base, out, enc):
    """Rank (0 = most likely) under the full base of every generated token up to its row's first EOS."""
    prompt_length = enc.input_ids.shape[1]
    mask = torch.cat((enc.attention_mask.repeat_interleave(out.shape[0] // enc.input_ids.shape[0], 0),
                      torch.ones(out.shape[0], out.shape[1] - prompt_length, dtype=torch.long)), 1)
    log_p = F.log_softmax(base.logits(out, mask).float(), -1)[:, prompt_length - 1 : -1]
    generated = out[:, prompt_length:]
    ranks = (log_p > log_p.gather(2, generated[..., None])).sum(-1)
    after_eos = (generated == base.eos_token_id).long().cumsum(1) - (generated == base.eos_token_id).long() > 0
    return ranks[~after_eos]


def test_renormalize_keeps_exactly_the_top_k_renormalised(tiny_base, prompts):
    enc = _encode(tiny_base, prompts)
    full = _base_log_probs(tiny_base, enc)
    view = TopKBlackBox(tiny_base, 20, "renormalize").logits(enc.input_ids, enc.attention_mask)
    assert (view.isfinite().sum(-1) == 20).all()
    torch.testing.assert_close(view.exp().sum(-1), torch.ones(view.shape[:2]))
    top, index = full.topk(20, dim=-1)
    torch.testing.assert_close(view.gather(-1, index), top - top.logsumexp(-1, keepdim=True))


def test_residual_keeps_the_exact_top_k_and_spreads_the_rest(tiny_base, prompts):
    enc = _encode(tiny_base, prompts)
    logits = tiny_base.logits(enc.input_ids, enc.attention_mask)
    full = F.log_softmax(logits.float(), dim=-1)
    view = restrict_log_probs(logits, 20, "residual")
    top, index = full.topk(20, dim=-1)
    assert torch.equal(view.gather(-1, index), top)  # the API's numbers, unchanged
    torch.testing.assert_close(view.exp().sum(-1), torch.ones(view.shape[:2]))
    outside = torch.ones_like(view, dtype=torch.bool).scatter(-1, index, False)
    spread = view[outside].view(*view.shape[:2], -1)
    missing = torch.log((1 - top.exp().sum(-1)) / (tiny_base.vocab_size - 20))
    torch.testing.assert_close(spread, missing[..., None].expand_as(spread))  # one value for all V - k
    assert (spread[..., 0] <= top[..., -1]).all()  # never above the k-th: the order of tokens is kept


@pytest.mark.parametrize("k", [None, "vocab"])
def test_an_unlimited_view_is_the_base(tiny_base, prompts, k):
    k = tiny_base.vocab_size if k == "vocab" else k
    view = TopKBlackBox(tiny_base, k)
    enc = _encode(tiny_base, prompts)
    torch.testing.assert_close(view.logits(enc.input_ids, enc.attention_mask), _base_log_probs(tiny_base, enc))
    assert generate(view, prompts, max_new_tokens=10, progress=False) == generate(
        tiny_base, prompts, max_new_tokens=10, progress=False)


def test_greedy_zeroshot_through_the_view_equals_the_base(smollm2, prompts):
    # The most likely token is always in the top k, and neither rule reorders tokens.
    expected = generate(smollm2, prompts, max_new_tokens=8, progress=False)
    for k, rule in [(1, "residual"), (5, "renormalize")]:
        assert generate(TopKBlackBox(smollm2, k, rule), prompts, max_new_tokens=8, progress=False) == expected


def _reweighter_preferring(token: int, vocab_size: int) -> ContextFreeReweighter:
    rw = ContextFreeReweighter(vocab_size, 8, None)
    torch.nn.init.zeros_(rw.lm_head.weight)
    torch.nn.init.zeros_(rw.lm_head.bias)
    with torch.no_grad():
        rw.lm_head.bias[token] = 1000.0
    return rw.eval()


def test_the_restriction_comes_before_the_plugin(tiny_base, prompts):
    enc = _encode(tiny_base, prompts)
    first_step = _base_log_probs(tiny_base, enc)[:, -1]
    unlikely = int(first_step.max(0).values.argmin())  # outside every row's top k
    rw = _reweighter_preferring(unlikely, tiny_base.vocab_size)
    outputs = {}
    for rule in ("renormalize", "residual"):
        view = TopKBlackBox(tiny_base, 5, rule)
        outputs[rule] = view.generate(enc.input_ids, enc.attention_mask, max_new_tokens=6, do_sample=False,
                                      logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask)])
    prompt_length = enc.input_ids.shape[1]
    assert (outputs["residual"][:, prompt_length:] == unlikely).all()  # promoted from the residual bucket
    assert (outputs["renormalize"][:, prompt_length] != unlikely).all()
    assert (_generated_ranks(tiny_base, outputs["renormalize"], enc) < 5).all()  # never outside the top k


@pytest.mark.parametrize("rule", ["renormalize", "residual"])
def test_generate_and_logits_show_the_same_view(tiny_base, small_reweighter, prompts, rule):
    # The uncached loop reads view.logits, generate runs the model under the view's hook: the
    # same tokens, with the Plugin and the repetition penalty acting on the API's log-probs.
    view = TopKBlackBox(tiny_base, 5, rule)
    rw = small_reweighter("llama")
    enc = _encode(tiny_base, prompts)
    cached = view.generate(enc.input_ids, enc.attention_mask, max_new_tokens=10, do_sample=False,
                           logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask, repetition_penalty=1.3)])
    reference = greedy_decode_uncached(view, enc.input_ids, enc.attention_mask, rw, max_new_tokens=10,
                                       repetition_penalty=1.3)
    assert torch.equal(cached, reference)


def test_beam_search_sees_only_the_top_k(tiny_base, small_reweighter, prompts):
    rw = small_reweighter("llama")
    enc = _encode(tiny_base, prompts)
    kwargs = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, do_sample=False, repetition_penalty=3.0)
    view = TopKBlackBox(tiny_base, 3, "renormalize")
    out = view.generate(enc.input_ids, enc.attention_mask,
                        logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask)], **kwargs)
    assert (_generated_ranks(tiny_base, out, enc) < 3).all()
    # Without the view the same search leaves the top 3, so the check above is not vacuous.
    free = tiny_base.generate(enc.input_ids, enc.attention_mask,
                              logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask)], **kwargs)
    assert (_generated_ranks(tiny_base, free, enc) >= 3).any()


def test_generates_own_processors_come_after_the_restriction(tiny_base, prompts):
    # generate builds processors from its arguments (here suppress_tokens) and runs them before
    # the ones it is given: the view must already hold when they run. The base's top-1 is
    # suppressed and the Plugin prefers its 4th token: with the top 3 restricted first, the
    # 4th is not available; restricting after the suppression would let it in.
    enc = _encode(tiny_base, prompts[:1])
    order = _base_log_probs(tiny_base, enc)[0, -1].argsort(descending=True)
    rw = _reweighter_preferring(int(order[3]), tiny_base.vocab_size)
    out = TopKBlackBox(tiny_base, 3, "renormalize").generate(
        enc.input_ids, enc.attention_mask, max_new_tokens=1, do_sample=False, suppress_tokens=[int(order[0])],
        logits_processor=[PluginLogitsProcessor(rw, enc.attention_mask)])
    assert int(out[0, -1]) in order[1:3].tolist()


def test_model_names_select_a_view_with_the_bases_settings(smollm2):
    assert parse_model_name("smollm2-135m-instruct") is None
    assert parse_model_name("smollm2-135m-instruct@top20") == ("smollm2-135m-instruct", 20, "residual")
    assert parse_model_name("org/model@top5-renormalize") == ("org/model", 5, "renormalize")
    assert parse_model_name("smollm2-135m-instruct@topall") == ("smollm2-135m-instruct", None, "residual")
    for bad in ("smollm2-135m-instruct@bottom5", "smollm2-135m-instruct@top0", "smollm2-135m-instruct@top5-clip",
                "smollm2-135m-instruct@top", "@top5"):
        with pytest.raises(ValueError, match="Unknown model-name suffix"):
            models.model_spec(bad)
    with pytest.raises(ValueError, match="Unknown base model"):
        models.model_spec("gpt5@top5")

    base, view = models.model_spec("smollm2-135m-instruct"), models.model_spec("smollm2-135m-instruct@top20")
    assert view["name"] == "smollm2-135m-instruct@top20" and (view["top_k"], view["top_k_rule"]) == (20, "residual")
    assert {k: v for k, v in view.items() if k not in ("name", "display", "top_k", "top_k_rule")} == {
        k: v for k, v in base.items() if k not in ("name", "display")}
    profile = load_profile("smoke")
    assert run_store.runs_dir(profile, "e2e", "smollm2-135m-instruct@top20") != run_store.runs_dir(
        profile, "e2e", "smollm2-135m-instruct")

    loaded = load_base_model("smollm2-135m-instruct@top20-renormalize")
    assert isinstance(loaded, TopKBlackBox) and (loaded.k, loaded.rule) == (20, "renormalize")
    assert loaded.name == "smollm2-135m-instruct@top20-renormalize" and loaded.vocab_size == smollm2.vocab_size
    with pytest.raises(ValueError, match="positive integer"):
        TopKBlackBox(smollm2, 0)
    with pytest.raises(ValueError, match="rule"):
        TopKBlackBox(smollm2, 5, "clip")


@pytest.fixture(scope="module")
def pairs(tokenizer):
    return encode_pairs(tokenizer, PROMPTS, TARGETS)


def test_training_on_the_renormalised_view_leaves_out_unreachable_targets(smollm2, small_reweighter, tokenizer, pairs):
    batch = collate(pairs, tokenizer.pad_token_id)
    targets = shift_labels(batch["labels"])[target_positions(batch["labels"])]
    # k is chosen from the base's own ranks of the reference tokens, so that some of them fall
    # inside the top k and some outside, whatever the base (on a GPU the suite may run with a
    # random-weight stand-in, whose ranks of the references are arbitrary).
    full = BaseOutputCache.build(smollm2, pairs, progress=False).rows.float()
    ranks = (full > full.gather(1, targets[:, None].to(full.device))).sum(1)
    k = int(ranks.float().median().item()) + 1
    assert ranks.min() < k <= ranks.max()
    cache = BaseOutputCache.build(TopKBlackBox(smollm2, k, "renormalize"), pairs, progress=False)
    assert (cache.rows.isfinite().sum(-1) == k).all()
    reachable = cache.rows.gather(1, targets[:, None].to(cache.rows.device)).squeeze(1).isfinite().cpu()
    assert 0 < reachable.sum() < len(targets)  # some reference tokens fall outside the top k

    rw = small_reweighter("llama")
    all_pairs = range(len(pairs))
    with torch.no_grad():
        plain, _ = TokenObjective(pairs, tokenizer.pad_token_id, cache=cache).nll(rw, all_pairs)
        loss, n = TokenObjective(pairs, tokenizer.pad_token_id, reachable_plugin_log_probs, cache).nll(rw, all_pairs)
        small = reweighter_logits(rw, batch["input_ids"], batch["attention_mask"], target_positions(batch["labels"]))
    assert plain.item() == math.inf  # why plain plugin_log_probs cannot train on this view
    expected = -plugin_log_probs(cache.rows.cpu(), small).gather(1, targets[:, None]).squeeze(1)[reachable].sum()
    torch.testing.assert_close(loss, expected)
    assert n == len(targets)

    train = TokenObjective(pairs[:4], tokenizer.pad_token_id, reachable_plugin_log_probs,
                           BaseOutputCache(cache.rows[: cache.offsets[4]], cache.offsets[:5], head=cache.head))
    hyper = TokenObjective(pairs, tokenizer.pad_token_id, reachable_plugin_log_probs, cache)
    result = fit(rw, train, hyper, TrainConfig(lr=1e-3, max_epochs=1), progress=False)
    assert math.isfinite(result.best_val_loss) and all(p.isfinite().all() for p in rw.parameters())


def test_the_residual_view_trains_with_the_plain_objective(tiny_base, small_reweighter, tokenizer, pairs):
    cache = BaseOutputCache.build(TopKBlackBox(tiny_base, 5, "residual"), pairs, progress=False)
    assert cache.rows.isfinite().all()
    loss, _ = TokenObjective(pairs, tokenizer.pad_token_id, cache=cache).nll(small_reweighter("llama"), range(6))
    assert math.isfinite(loss.item())
    # Without -inf the reachable objective is the plain one.
    small = torch.randn(cache.rows.shape[0], tiny_base.vocab_size)
    assert torch.equal(reachable_plugin_log_probs(cache.rows, small), plugin_log_probs(cache.rows, small))


def test_reference_coverage_counts_targets_in_the_top_k(tiny_base, tokenizer, pairs):
    cache = BaseOutputCache.build(tiny_base, pairs, progress=False)
    batch = collate(pairs, tokenizer.pad_token_id)
    targets = shift_labels(batch["labels"])[target_positions(batch["labels"])]
    ks = [1, 1000, 20000, tiny_base.vocab_size]
    coverage = reference_coverage(cache, pairs, ks)
    for k in ks:
        in_top = (cache.rows.topk(k, dim=-1).indices == targets[:, None]).any(-1)
        assert coverage[k] == pytest.approx(in_top.float().mean().item())
    assert coverage[tiny_base.vocab_size] == 1.0 and 0 < coverage[20000] < 1


def test_ablation_figure_orders_views_from_narrowest_to_full_base():
    names = ["m", "m@topall", "m@top100-residual", "m@top5-residual", "m@top20-renormalize"]
    assert [view_label(n) for n in names] == ["full logits", "all log-probs", "top-100", "top-5", "top-20"]
    records = [{"model": view_label(name), "method": method, "seed": 0,
                "metrics": dict.fromkeys(("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR", "CIDEr", "NIST"), i / 10)}
               for i, name in enumerate(names) for method in ("Zeroshot", "Plugin")]
    summary = tables.summarize(tables.runs_frame(records))
    figure = plot_metric_vs_k(summary, title="test")
    ticks = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert ticks == ["top-5", "top-20", "top-100", "all log-probs", "full logits"]
    assert len(figure.axes[0].lines) >= 2


def test_plugin_gaps_count_metrics_and_give_one_verdict_per_top_k_view(tmp_path, monkeypatch, fake_run):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    metrics = ("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR", "CIDEr", "NIST")
    plugin_ahead = {"m": 7, "m@top20": 4, "m@top5": 2}
    records = []
    for view, ahead in plugin_ahead.items():
        for method in ("Zeroshot", "Plugin"):
            run = fake_run(method, 0, good=12 if method == "Plugin" else 0, model=view)
            run["metrics"] = {m: 0.5 + (0.1 if method == "Plugin" and i < ahead else 0) for i, m in enumerate(metrics)}
            records.append(run)
    frame = tables.runs_frame(records)
    frame["model"] = frame["model"].map(view_label)
    gaps = plugin_gaps(tables.summarize(frame))
    assert list(gaps.index) == ["top-5", "top-20", "full logits"]
    assert gaps["Plugin ahead on"].to_dict() == {"top-5": 2, "top-20": 4, "full logits": 7}
    assert gaps.loc["top-5", "BLEU"] == pytest.approx(0.1) and gaps.loc["top-5", "NIST"] == 0
    entries = record_claims("local", gaps, "e2e", "residual", records, n_resamples=20)
    # top-5: ahead on 2/7 only; top-20: ahead on 4/7 and better outputs; the full base is not a top-k view.
    assert [e["verdict"] for e in entries] == ["not reproduced", "reproduced"]
    assert {e["scope"] for e in entries} == {"beyond"} and entries[1]["rule"] == TOPK_RULE
    assert "4/7" in entries[1]["ours"] and (tmp_path / "local" / "claims" / "topk_e2e_residual_top-20.json").exists()

