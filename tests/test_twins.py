"""Shape twins, the paper-twin profile, the dtype rule, the float16 cache and its placement,
and the preflight plan: everything of the GPU path that a CPU can check.

Twins have random weights: twin: says nothing about the paper's numbers.
"""
from __future__ import annotations

import dataclasses
import json
import io

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.cache import BaseOutputCache, GIB, cache_dtype, choose_placement, gpu_headroom
from plugin_lib.core.pairs import collate, encode_pairs
from plugin_lib.core.train import TokenObjective
from plugin_lib.core.loss import target_positions
from plugin_lib.core.pairs import EncodedPair
from plugin_lib.commands import preflight as preflight_command
from plugin_lib.commands import studies
from plugin_lib.experiments import table5, table8
from plugin_lib.harness import models, tasks
from plugin_lib.harness.planning import preflight, preflight_counts, preflight_rates
from plugin_lib.harness.planning.preflight_counts import pretrained_params
from plugin_lib.harness.profile import REPO_ROOT, load_profile
from plugin_lib.harness.running import run_keys
from plugin_lib.report import claims, comparison

import real_data

PAPER_SHAPES = {
    "gpt2-medium-twin": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "n_positions": 1024, "vocab_size": 50257},
    "gpt2-xl-twin": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "n_positions": 1024, "vocab_size": 50257},
    "llama-3.1-8b-twin": {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    },
}
# Parameters of the published checkpoints: GPT2-M 355M, GPT2-XL 1.56B, LLaMA-3.1-8B 8.03B.
PAPER_PARAMETERS = {"gpt2-medium-twin": 354_823_168, "gpt2-xl-twin": 1_557_611_200,
                    "llama-3.1-8b-twin": 8_030_261_248}
PROMPTS = ["name[The Eagle], eatType[coffee shop], food[French]", "name[Aromi], area[city centre]",
           "name[Zizzi], eatType[pub], food[Italian], near[The Sorrento]"]
TARGETS = ["The Eagle is a French coffee shop.", "Aromi is in the city centre.", "Zizzi is an Italian pub."]


# ---------------------------------------------------------------- the twins


@pytest.mark.parametrize("name", list(PAPER_SHAPES))
def test_full_size_twins_have_the_paper_models_exact_configurations(name):
    config = models.model_config(name)
    for key, value in PAPER_SHAPES[name].items():
        assert getattr(config, key) == value, key
    if name.startswith("llama"):
        assert config.rope_parameters == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in meta.parameters()) == PAPER_PARAMETERS[name]
    spec = models.model_spec(name)
    assert models.TWIN_LABEL in spec["display"] and models.is_twin(name)
    real = {"GPT2-M": "gpt2-medium", "GPT2-XL": "gpt2-xl", "LLaMA-3.1-8B": "llama-3.1-8b"}[spec["paper_model"]]
    assert models.model_spec(real)["twin"] == name and models.model_spec(real)["family"] == spec["family"]


@pytest.mark.parametrize("name", ["gpt2-medium-twin-small", "gpt2-xl-twin-small", "llama-3.1-8b-twin-small"])
def test_small_twins_load_seeded_with_the_paper_vocabulary_and_the_offline_tokenizer(name):
    base = models.load_base_model(name)
    again = models.load_base_model(name)
    full = name.removesuffix("-small")
    assert base.vocab_size == PAPER_SHAPES[full]["vocab_size"] > len(base.tokenizer) == 49152
    assert base.dtype == torch.float32 and base.tokenizer.padding_side == "left"
    ids = base.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    torch.testing.assert_close(base.logits(ids.input_ids, ids.attention_mask),
                               again.logits(ids.input_ids, ids.attention_mask), rtol=0, atol=0)  # same weights
    assert models.model_spec(name)["family"] == models.model_spec(full)["family"]
    assert not models.model_spec(name).get("chat_template", False)
    # Generated ids beyond the tokenizer decode to nothing instead of failing.
    assert isinstance(base.tokenizer.decode([100, 60000, 200]), str)


def test_loading_a_twin_leaves_its_registry_entry_and_so_its_run_keys_as_written(toy_example, profiles_as_written):
    """transformers writes ``rope_theta`` into the ``rope_scaling`` mapping a LLaMA config is
    given. While that mapping was the registry's own, every run key of the LLaMA twin changed
    once it had loaded: `grid plan` saw its computed units as pending, and `grid run` ended
    with units left and no failure."""
    name, full = "llama-3.1-8b-twin-small", "llama-3.1-8b-twin"
    written = profiles_as_written["models"]
    examples = [toy_example(0, "train")], [toy_example(1, "validation")], [toy_example(2, "test")]
    before = run_keys.examples_fingerprint(name, *examples)
    models.load_base_model(name)
    models.model_config(full)  # the full-size twin's configuration alone: no 32 GB of weights
    for twin in (name, full):
        assert models.model_spec(twin) == {"name": twin, **written[twin]}
    assert run_keys.examples_fingerprint(name, *examples) == before


def test_dtype_rule():
    rule = models.resolve_dtype
    for name in ("llama-3.1-8b", "llama-3.1-8b-twin", "llama-3.1-8b-twin-small"):
        assert rule(name, "auto", "cuda", bf16_supported=True) == torch.bfloat16  # an A100, H100
        assert rule(name, "auto", "cuda", bf16_supported=False) == torch.float16  # a Colab T4
        assert rule(name, None, "cuda", bf16_supported=False) == torch.float16
        assert rule(name, "auto", "cpu") == torch.float32
    for name in ("gpt2-medium", "gpt2-xl", "gpt2-xl-twin", "smollm2-135m-instruct"):
        assert rule(name, "auto", "cuda", bf16_supported=True) == torch.float16
    assert rule("llama-3.1-8b", "float32", "cuda") == torch.float32  # an explicit dtype is kept
    assert rule("gpt2-xl", torch.bfloat16, "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="Unknown dtype"):
        rule("gpt2-xl", "float8", "cuda")
    assert load_profile("paper").dtype == load_profile("paper-twin").dtype == "auto"


# ---------------------------------------------------------------- the paper-twin profile


def test_paper_twin_profile_is_the_paper_path_on_small_twins():
    paper, twin = load_profile("paper"), load_profile("paper-twin")
    assert len(twin.base_models) == len(paper.base_models)
    for real, small in zip(paper.base_models, twin.base_models):
        assert models.is_twin(small) and not models.is_twin(real)
        assert models.model_spec(small)["family"] == models.model_spec(real)["family"]
        assert models.arch_for(small) == models.arch_for(real)  # GPT-2 and LLaMA reweighting models
        assert models.model_spec(small).get("half") == models.model_spec(real).get("half")
    assert twin.tokens == paper.tokens  # the paper's token limits (no chat template to make room for)
    assert twin.shift.model == twin.base_models[-1] and paper.shift.model == paper.base_models[-1]
    assert models.model_spec(twin.ablations.model)["paper_model"] == models.model_spec(paper.ablations.model)["display"]
    assert comparison.table_models(twin, table5.paper_rows()) == ["gpt2-xl-twin-small"]
    assert comparison.table_models(twin, table8.paper_rows()) == ["gpt2-xl-twin-small", "llama-3.1-8b-twin-small"]
    assert comparison.paper_counterpart("llama-3.1-8b-twin-small", table8.paper_rows()) == "LLaMA-3.1-8B"


def test_only_the_paper_and_local_profiles_measure_claims(monkeypatch, tmp_path):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    for name, verdict in (("paper-twin", "not measurable at this scale"), ("smoke", "not measurable at this scale"),
                          ("local", "reproduced"), ("paper", "reproduced")):
        entry = claims.record_claim(name, "k", "A claim", "1", "2", "reproduced", rule="a rule",
                                    statistic={"summary": "s", "n": {"inputs": 1, "seeds": 1}})
        assert entry["verdict"] == verdict


def test_twin_tasks_use_the_family_prompts_without_a_chat_template(toy_example):
    base = models.load_base_model("gpt2-xl-twin-small")
    task = tasks.Task(base, "e2e", models.model_spec(base.name)["family"], [toy_example(0, "validation")], [],
                        [toy_example(1, "test")])
    text = task.prompt(task.test[0])
    assert "<|im_start|>" not in text and "Item 1" in text


# ---------------------------------------------------------------- the float16 cache


def _float32_cache(base, pairs) -> BaseOutputCache:
    """Recomputation: the base's log-probabilities at the target positions in float32."""
    batch = collate(pairs, base.tokenizer.pad_token_id)
    logits = base.logits(batch["input_ids"], batch["attention_mask"])
    rows = torch.log_softmax(logits[target_positions(batch["labels"])].float(), -1)
    return BaseOutputCache(rows, np.concatenate(([0], np.cumsum([p.target_length for p in pairs]))))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_base_is_cached_in_float16_within_1e3_nats_per_token(dtype, tmp_path):
    base = models.load_base_model("llama-3.1-8b-twin-small", dtype=dtype, device="cpu")
    pairs = encode_pairs(base.tokenizer, PROMPTS, TARGETS)
    cache = BaseOutputCache.build(base, pairs, progress=False)
    on_disk = BaseOutputCache.build(base, pairs, directory=tmp_path, progress=False)
    assert cache_dtype(dtype) == torch.float16 and cache.dtype == on_disk.dtype == torch.float16
    assert cache.nbytes == sum(p.target_length for p in pairs) * 128256 * 2  # half of float32's
    reference = _float32_cache(base, pairs)
    pad = base.tokenizer.pad_token_id
    reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(base.name))
    for rows in (cache, on_disk):
        cached = TokenObjective(pairs, pad, cache=rows).mean_nll(reweighter)
        recomputed = TokenObjective(pairs, pad, cache=reference).mean_nll(reweighter)
        assert abs(cached - recomputed) < 1e-3
    assert cache_dtype(torch.float32) == torch.float32


# ---------------------------------------------------------------- cache placement


def test_cache_placement_rule_with_injected_memory():
    choose = choose_placement
    gpu = {"device_type": "cuda", "has_directory": True}
    h100 = {"gpu_total": 80 * GIB, "host_available": 200 * GIB}
    assert gpu_headroom(80 * GIB) == 12 * GIB and gpu_headroom(16 * GIB) == 4 * GIB
    # LLaMA-3.1-8B in bf16 (16 GB) on an H100: E2E's caches (about 30 GiB in float16) fit beside it.
    assert choose(30 * GIB, gpu_free=62 * GIB, **h100, **gpu) == "gpu"
    assert choose(52 * GIB, gpu_free=62 * GIB, **h100, **gpu) == "pinned"  # past the headroom
    assert choose(120 * GIB, gpu_free=62 * GIB, **h100, **gpu) == "mmap"  # over half the host memory
    assert choose(120 * GIB, gpu_free=62 * GIB, **h100, device_type="cuda", has_directory=False) == "memory"
    assert choose(1 * GIB, gpu_free=None, gpu_total=None, host_available=None, **gpu) == "mmap"  # unknown
    assert choose(1 * GIB, device_type="cpu", has_directory=True, gpu_free=80 * GIB, gpu_total=80 * GIB) == "mmap"
    assert choose(1 * GIB, device_type="cpu", has_directory=False) == "memory"


def test_placed_caches_hold_the_same_rows(tiny_base, tokenizer, tmp_path):
    pairs = encode_pairs(tokenizer, PROMPTS, TARGETS)
    mapped = BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, progress=False)
    assert mapped.placement == "mmap" and isinstance(mapped.rows, np.memmap)
    loaded = BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, placement="memory", progress=False)
    assert loaded.placement == "memory" and isinstance(loaded.rows, torch.Tensor)
    torch.testing.assert_close(loaded.get([2, 0]), mapped.get([2, 0]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="placement"):
        BaseOutputCache.build(tiny_base, pairs, placement="disk", progress=False)
    with pytest.raises(MemoryError, match="directory"):
        BaseOutputCache.build(tiny_base, pairs, placement="mmap", progress=False)


# ---------------------------------------------------------------- the preflight (counts need the data)


@pytest.fixture
def paper_data():
    real_data.require("e2e", "webnlg", "commongen", "adidas")


def test_preflight_counts_what_the_runner_encodes(smollm2, paper_data):
    profile = load_profile("smoke")
    counts = preflight_counts.count_task("e2e", "smollm2-135m-instruct", profile)
    task = tasks.make_task(smollm2, "e2e", profile)
    pairs = task.encoded("train") + task.encoded("hyper")
    assert (counts.train_pairs, counts.hyper_pairs) == (len(task.encoded("train")), len(task.encoded("hyper")))
    assert counts.target_tokens == sum(p.target_length for p in pairs)
    assert counts.pair_tokens == pytest.approx(np.mean([len(p.input_ids) for p in pairs]))
    assert counts.test_inputs == len(task.test)


def test_preflight_plans_the_paper_profile_on_a_cpu(paper_data):
    if torch.cuda.is_available():
        pytest.skip("checks the plan of a machine without a GPU")
    out = io.StringIO()
    assert preflight_command.run("paper", measure=False, plan_only=True, out=out) == 0  # the plan, stopping nothing
    text = out.getvalue()
    for notebook in studies.NOTEBOOKS:
        assert notebook in text
    assert "needs GPU" in text and "the hours need the GPU" in text and "earlier probe" in text
    assert "WARNING: profile 'paper' needs a CUDA GPU" in text and "issue" not in text
    assert "more than one 80 GiB GPU" not in text  # LLaMA-3.1-8B is fine-tuned with LoRA (notebook 10)
    plans = {p.notebook: p for p in preflight_command.plans(load_profile("paper"))}
    e2e = plans["01_table1_e2e"]
    assert e2e.pairs == 4299 and e2e.seeds == 5 and e2e.epochs == 80
    # Three bases: NewModel, TempNet, Plugin (3 + 2) x (4 + 2) each and WeightedComb x (3 + 2) more, at
    # most: every grid may grow by extend_edges = 2 past an edge.
    assert e2e.tally.configs == 3 * (30 + 30 + 30 + 150)
    # Zeroshot once (TempNet-greedy reuses it); six x 5 seeds
    assert e2e.tally.decode_tokens == 3 * (1 + 6 * 5) * 1847 * 64
    # Every notebook fits one 80 GB GPU, and the whole profile 80 GiB of disk (compact caches,
    # LoRA adapters for notebook 10's LLaMA-3.1-8B).
    assert max(p.peak_gpu for p in plans.values()) <= 80 * GIB
    assert sum(p.tally.disk_bytes for p in plans.values()) <= 80 * GIB
    assert plans["12_topk_logprobs"].tally.cache_bytes == 0  # the views read notebook 01's stored states
    # Each trained method's chosen weights stay on disk (<label>-best.pt, float32): four per base.
    one_each = sum(4 * preflight_counts.reweighter_params(m) for m in load_profile("paper").base_models)
    assert e2e.tally.weights_bytes == 4 * one_each and "reweighting weights" in text


def test_rates_measured_on_a_gpu_plan_the_paper_profile_elsewhere(paper_data, tmp_path):
    """--rates: the hours from rates a GPU machine saved (--save-rates); here the committed H200's."""
    measured = REPO_ROOT / "results" / "gpu" / "h200_2026-11-27" / "paper_rates.json"
    out = io.StringIO()
    assert preflight_command.run("paper", plan_only=True, rates_file=str(measured), out=out) == 0
    text = out.getvalue()
    assert "measured with llama-3.1-8b-twin on NVIDIA H200" in text and "needs GPU" not in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:2].isdigit()}
    assert float(rows["01_table1_e2e"][13]) < float(rows["01_table1_e2e"][12])  # expected epochs < the cap
    # A round trip keeps every rate; a file that is not one says how to make one.
    rates = preflight_rates.load_rates(measured, ["gpt2-xl", "smollm2-135m-instruct"])
    preflight_rates.save_rates(rates, tmp_path / "again.json")
    again = preflight_rates.load_rates(tmp_path / "again.json", ["gpt2-xl"])
    assert again["gpt2-xl"].train_pairs_per_s == rates["gpt2-xl"].train_pairs_per_s and rates["smollm2-135m-instruct"] is None
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="--save-rates"):
        preflight_rates.load_rates(tmp_path / "bad.json", ["gpt2-xl"])
    # every field is written, measured or null: a file that lacks one is not read with guesses
    partial = json.loads(measured.read_text())
    del partial["rates"]["gpt2-xl"]["lora_tokens_per_s"]
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    with pytest.raises(SystemExit, match="gpt2-xl's rates lack lora_tokens_per_s"):
        preflight_rates.load_rates(tmp_path / "partial.json", ["gpt2-xl"])


def test_the_colab_profile_fits_a_t4_session_per_gpt2_notebook(paper_data):
    out = io.StringIO()
    assert preflight_command.run("colab", measure=False, plan_only=True, gpu_name="t4", out=out) == 0
    text = out.getvalue()
    assert "Planned for one NVIDIA T4" in text and "(an estimate)" in text and "Total (estimates)" in text
    profile = load_profile("colab")
    plans = preflight_command.plans(profile, gpu_name="t4")
    llama = {"10_distribution_shift"}  # the paper's LLaMA-3.1-8B: an A100
    for plan in plans:
        if plan.notebook not in llama:
            assert plan.peak_gpu <= 16e9, plan.notebook
    assert sum(p.tally.disk_bytes for p in plans) <= 60 * GIB
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:2].isdigit()}
    for notebook in ("01_table1_e2e", "03_table3_commongen", "11_table8_lora"):
        assert rows[notebook][11] == "yes" and float(rows[notebook][12]) <= 12  # fits; hours at the cap


def test_preflight_stops_a_gpu_profile_on_a_machine_without_a_gpu(paper_data):
    if torch.cuda.is_available():
        pytest.skip("checks a machine without a GPU")
    out = io.StringIO()
    assert preflight_command.run("paper", measure=False, out=out) == 1
    assert "WILL NOT FIT: profile 'paper' needs a CUDA GPU and this machine has none" in out.getvalue()
    assert "--plan-only" in out.getvalue()


def test_preflight_stops_when_memory_or_disk_will_not_do(paper_data):
    out = io.StringIO()
    assert preflight_command.run("paper", measure=False, gpu_memory_gb=16, disk_free_gb=1e6, out=out) == 1
    assert "WILL NOT FIT: 10_distribution_shift" in out.getvalue()
    out = io.StringIO()
    assert preflight_command.run("smoke", measure=False, disk_free_gb=0.01, out=out) == 1
    assert "of disk" in out.getvalue()


def test_the_preflight_without_its_data_says_what_to_do_in_one_line(capsys, tmp_path, monkeypatch):
    """No data (this test declares none, so the folder it sees is empty): exit 2, one line naming
    the missing file and how to fetch it, no traceback; and nothing before it, even on a first run
    (an empty cache: no model is converted or loaded first, issue 76)."""
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / "cache"))
    for cached in (preflight_counts._splits, preflight_counts._count):  # splits read by earlier tests
        cached.cache_clear()
    assert preflight_command.main(["--profile", "smoke", "--plan-only", "--no-measure"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("preflight: Missing data file") and "fetch" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "cache").exists()


def test_a_base_that_cannot_be_loaded_here_leaves_only_its_own_rates_out(paper_data, tmp_path, monkeypatch):
    """As on a GPU machine that does not carry one base's weights: the other bases' rates are
    measured and saved, that one's hours are left out, with a note."""
    measured, bases = [], list(load_profile("paper-twin").base_models)
    missing = bases[-1]

    def measure(model, profile, counts, device, shared_counts=()):
        assert shared_counts  # --save-rates measures the concurrency curve too
        if model == missing:
            raise OSError(f"Could not load base model '{missing}' from /nowhere.\nmore")
        measured.append(model)
        return preflight_rates.Rates(measured_with=f"{model} (a test's stand-in)", forward_tokens_per_s=1e4,
                                     train_pairs_per_s=100.0, decode_step_s=0.01, plugin_step_s=0.011, device="cpu")

    monkeypatch.setattr(preflight, "measure_rates", measure)
    out = io.StringIO()
    preflight_command.run("paper-twin", plan_only=True, save_rates_file=str(tmp_path / "rates.json"), out=out)
    assert set(bases[:-1]) <= set(measured)  # measured here: not a GPU-only profile
    assert (f"Rates of {missing} not measured: it cannot be loaded here (Could not load base model "
            f"'{missing}' from /nowhere.); its hours are left out.") in out.getvalue()
    assert "not timed (no rate for a base)" in out.getvalue()
    saved = preflight_rates.load_rates(tmp_path / "rates.json", measured + [missing])
    assert saved[measured[-1]].train_pairs_per_s == 100.0 and saved[missing] is None


def test_the_preflight_prices_notebook_15s_pretrained_arms(paper_data):
    """colab's GPT-2 bases with GPT2-Small: per dataset and base, NewModel-pretrained and
    Plugin-pretrained train one configuration (the 1-layer choice) and every later seed, the proxy
    arms' expert once more per later seed, at GPT2-Small's parameter count."""
    on = load_profile("colab")
    off = on.replace(proxy={**on.section("proxy"), "pretrained": False})
    with_arms, without = (next(p for p in preflight_command.plans(profile) if p.notebook == "15_proxy_tuning")
                          for profile in (on, off))
    seeds, tasks = len(on.seeds), 4 * len(on.base_models)
    # E2E's Plugin-pretrained on the ablations' base is notebook 07's run, counted there.
    assert with_arms.tally.trainings - without.tally.trainings == tasks * (2 * seeds + (seeds - 1)) - seeds
    assert with_arms.tally.configs == without.tally.configs  # each narrowed run trains the 1-layer choice, no search
    gpt2_small = pretrained_params("gpt2-medium", "gpt2", None)
    assert 124e6 < gpt2_small < 125e6  # GPT2-Small's published 124M
    # two chosen float32 models per task (one of 07's)
    added = with_arms.tally.weights_bytes - without.tally.weights_bytes
    assert added == pytest.approx((tasks * 2 - 1) * 4 * gpt2_small, rel=1e-6)


def test_a_search_is_priced_at_the_grid_rate_where_one_was_measured(paper_data):
    """A search's configurations are priced apart (grid_pair_epochs): at the rate of
    configurations trained together where one was measured, else one by one, and the preflight
    says which. Rates saved before the grid rate existed still load."""
    measured = REPO_ROOT / "results" / "gpu" / "h200_2026-11-27" / "paper_rates.json"
    old = preflight_rates.load_rates(measured, ["gpt2-xl"])["gpt2-xl"]
    assert old.grid_train_pairs_per_s is None and old.static_decoding is False
    work = {"model": "gpt2-xl", "grid_pair_epochs": 1e6, "pair_epochs": 2e5}
    assert old.seconds(work) == pytest.approx(1.2e6 / old.train_pairs_per_s)
    faster = dataclasses.replace(old, grid_train_pairs_per_s=4 * old.train_pairs_per_s)
    assert faster.seconds(work) == pytest.approx(0.25e6 / old.train_pairs_per_s + 2e5 / old.train_pairs_per_s)
    assert preflight_rates.expected_share(work, 0.5)["grid_pair_epochs"] == 5e5  # early stopping shortens it too
    out = io.StringIO()
    preflight_command.run("paper", plan_only=True, rates_file=str(measured), out=out)
    assert "a search's configurations priced one by one" in out.getvalue()
    assert "static caches" not in out.getvalue()  # the decoding rates' basis: timed without graphs
    out = io.StringIO()
    preflight._rates_lines(load_profile("paper"), {"gpt2-xl": dataclasses.replace(old, static_decoding=True)}, None, out)
    assert "at batch 32 from static caches with CUDA graphs;" in out.getvalue()
    # The plan: every configuration of notebook 01's searches, at the cap, is grid work; later seeds are not.
    profile = load_profile("paper")
    e2e = {p.notebook: p for p in preflight_command.plans(profile)}["01_table1_e2e"]
    searched = sum(w.get("grid_pair_epochs", 0.0) for w in e2e.work)
    assert searched == pytest.approx(e2e.tally.configs * profile.training.max_epochs * e2e.pairs)
    assert sum(w.get("pair_epochs", 0.0) for w in e2e.work) == pytest.approx(
        3 * 4 * (len(profile.seeds) - 1) * profile.training.max_epochs * e2e.pairs)  # 4 trained methods, 3 bases


def test_the_grid_rate_is_measured_on_configurations_sharing_each_batch(tiny_base):
    pairs = [EncodedPair(tuple(range(3, 15)), 8) for _ in range(4)]
    rows = torch.randn(4 * 4, tiny_base.vocab_size).log_softmax(-1)
    objective = TokenObjective(pairs, 0, cache=BaseOutputCache(rows, np.arange(5) * 4))
    arch = {"arch": "llama", "n_layer": 1, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    assert preflight_rates._grid_step_s(objective, arch, tiny_base.vocab_size, torch.device("cpu"), 2) > 0


def test_a_stacked_grid_is_priced_at_its_rate_only_where_the_profile_stacks(paper_data, tiny_base):
    """The stacked rate (core.stacked, measured on a GPU) prices a search only in a profile whose
    stacked_training is "gpu"; elsewhere the preflight names it as measured and not used. Rates
    saved before it existed load without it."""
    measured = REPO_ROOT / "results" / "gpu" / "h200_2026-11-27" / "paper_rates.json"
    old = preflight_rates.load_rates(measured, ["gpt2-xl"])["gpt2-xl"]
    assert old.stacked_train_pairs_per_s is None
    paper = load_profile("paper")
    assert paper.stacked_training == "never" and old.for_profile(paper) == old
    timed = dataclasses.replace(old, grid_train_pairs_per_s=2 * old.train_pairs_per_s,
                                stacked_train_pairs_per_s=6 * old.train_pairs_per_s)
    stacking = paper.replace(stacked_training="gpu")
    work = {"grid_pair_epochs": 6e5}
    assert timed.seconds(work) == pytest.approx(3e5 / old.train_pairs_per_s)
    assert timed.for_profile(stacking).seconds(work) == pytest.approx(1e5 / old.train_pairs_per_s)
    assert dataclasses.replace(timed, device="cpu").for_profile(stacking).grid_train_pairs_per_s == \
        2 * old.train_pairs_per_s  # a GPU's setting: a CPU's rates stay as they are
    out = io.StringIO()
    preflight._rates_lines(paper, {"gpt2-xl": timed}, None, out)
    assert "trained together at" in out.getvalue()
    assert "(stacked, measured: " in out.getvalue() and "not used: the profile's stacked_training is never)" \
        in out.getvalue()
    out = io.StringIO()
    preflight._rates_lines(stacking, {"gpt2-xl": timed.for_profile(stacking)}, None, out)
    assert "a search's configurations stepped as one stacked model at" in out.getvalue() and "x6.00" in out.getvalue()
    with pytest.raises(ValueError, match="stacked_training"):
        paper.replace(stacked_training="yes")
    pairs = [EncodedPair(tuple(range(3, 15)), 8) for _ in range(4)]
    rows = torch.randn(4 * 4, tiny_base.vocab_size).log_softmax(-1)
    objective = TokenObjective(pairs, 0, cache=BaseOutputCache(rows, np.arange(5) * 4))
    arch = {"arch": "llama", "n_layer": 1, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    assert preflight_rates._grid_step_s(objective, arch, tiny_base.vocab_size, torch.device("cpu"), 2,
                                        stacked=True) > 0


def test_lora_is_priced_at_its_measured_rate_where_one_was_measured(paper_data, tokenizer):
    """Training through the base: at the LoRA rate measure_rates times (one step of the adapters,
    set up as lora.lora_on), else estimated from the forward rate, and the preflight says which."""
    from conftest import make_tiny_base

    pairs = [EncodedPair(tuple(range(3, 15)), 8) for _ in range(4)]
    base = make_tiny_base(tokenizer)  # its own: the measurement adds adapters to the weights it is given
    plain, recomputed = preflight_rates._lora_rates(base, pairs, 2, "a tiny base")
    assert plain > 0 and recomputed == plain  # a CPU never recomputes
    assert {n.split(".")[-3] for n, p in base._model.named_parameters() if p.requires_grad} == {"lora_A", "lora_B"}
    measured = REPO_ROOT / "results" / "gpu" / "h200_2026-11-27" / "paper_rates.json"
    old = preflight_rates.load_rates(measured, ["gpt2-xl"])["gpt2-xl"]
    assert old.lora_tokens_per_s is None  # saved before the LoRA rate existed
    work = {"lora_tokens": 1e6}
    assert old.seconds(work) == pytest.approx(4 * 1e6 / old.forward_tokens_per_s)  # 4 passes: recomputed on a GPU
    kept = old.for_profile(load_profile("paper"), lora_recompute=False)  # where the planned peak fits
    assert kept.seconds(work) == pytest.approx(3 * 1e6 / old.forward_tokens_per_s)
    timed = dataclasses.replace(old, lora_tokens_per_s=5000.0)
    assert timed.seconds(work) == pytest.approx(200.0)
    out = io.StringIO()
    preflight._rates_lines(load_profile("paper"), {"gpt2-xl": old, "llama-3.1-8b": timed}, None, out)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("LoRA estimated from the forward rate (4 forward passes a token, activations "
                             "recomputed, as the planned peak needs: no LoRA rate here).")
    assert "LoRA trained at 5,000 tokens/s, activations recomputed, as the planned peak needs (measured with" in lines[1]


def test_a_lora_step_that_does_not_fit_leaves_the_other_rates(paper_data, monkeypatch):
    """On a GPU the LoRA step is measured last; if it runs out of memory, the base's other rates
    (the grid rate among them) are still measured and saved, and LoRA's hours are estimated."""
    from plugin_lib.harness.planning.preflight_counts import count_task

    def no_room(*_args, **_kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")

    monkeypatch.setattr(preflight_rates, "lora_on", no_room)
    profile = load_profile("paper-twin")
    model = profile.base_models[0]
    with pytest.warns(UserWarning, match="did not fit in the GPU's memory"):
        rates = preflight_rates.measure_rates(model, profile, count_task("e2e", model, profile), torch.device("cpu"))
    assert rates.lora_tokens_per_s is None and rates.train_pairs_per_s > 0 and rates.plugin_step_s > 0
