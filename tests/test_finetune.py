"""Fine-tuning a base: what is trained, the cache, resuming from a shorter run, the prompts,
training only when the weights are needed."""
import dataclasses
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from plugin_lib import data
from plugin_lib.data import prompts
from plugin_lib.harness.baselines import finetune
from plugin_lib.harness import models, tasks
from plugin_lib.harness.baselines.finetune import FinetuneConfig, finetune_base
from plugin_lib.harness.models import load_base_model
from plugin_lib.harness.profile import load_profile
from plugin_lib.utils.io import atomic_write_json, read_json

CFG = FinetuneConfig(lr=1e-2, batch_size=2, trainable_layers=1)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny_dir(tmp_path, tokenizer):
    """A 2-layer random LLaMA over SmolLM2's tokenizer, saved as a local model directory."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _examples(n=4):
    meta = {"dataset": "e2e", "split": "validation"}
    return [data.Example(f"e2e-validation-{i:05d}", f"name[Item {i}], food[Thai]",
                         (f"Item {i} serves Thai food.", f"Thai food at Item {i}."), meta)
            for i in range(n)]


def _weights(path):
    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def test_finetuning_changes_only_the_trainable_weights(cache, tiny_dir):
    path = finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=CFG, progress=False)
    assert path.parent == cache / "finetuned"
    assert path.name.startswith("tiny-llama-e2e-toy-") and path.name.endswith("-1ep")
    before, after = _weights(tiny_dir), _weights(path)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("model.layers.1.", "model.norm.")) for k in changed)
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    info = finetune.finetune_info(path)
    assert (info["epochs"], info["inputs"], info["pairs"], info["pool"]) == (1, 4, 8, "toy")
    assert info["history"][0]["train_loss"] > 0
    base = load_base_model(str(path))  # a fine-tuned model is a black box again
    assert base.vocab_size == len(base.tokenizer)


def test_full_finetuning_trains_every_weight(cache, tiny_dir):
    path = finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=FinetuneConfig(lr=1e-2, batch_size=2),
                         progress=False)
    before, after = _weights(tiny_dir), _weights(path)
    assert not torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert not torch.equal(before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"])


def test_cached_model_is_reused_without_training(cache, tiny_dir, monkeypatch):
    first = finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=CFG, progress=False)

    def must_not_load(*args, **kwargs):
        raise AssertionError("a cached fine-tuned model was trained again")

    monkeypatch.setattr(models, "load_causal_lm", must_not_load)
    assert finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=CFG, progress=False) == first
    # Other examples or settings are another run: not served from this cache entry.
    with pytest.raises(AssertionError, match="trained again"):
        finetune_base(str(tiny_dir), _examples(3), 1, pool="toy", cfg=CFG, progress=False)
    with pytest.raises(AssertionError, match="trained again"):
        finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=FinetuneConfig(lr=1e-3), progress=False)


def test_longer_run_continues_from_the_shorter_checkpoint(cache, tiny_dir, monkeypatch, tmp_path):
    trained = []
    real_epoch = finetune.train_epoch

    def counting_epoch(model, objective, optimizer, cfg, epoch, progress=False):
        trained.append(epoch)
        return real_epoch(model, objective, optimizer, cfg, epoch, progress)

    monkeypatch.setattr(finetune, "train_epoch", counting_epoch)
    finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=CFG, progress=False)
    resumed = finetune_base(str(tiny_dir), _examples(), 3, pool="toy", cfg=CFG, progress=False)
    assert trained == [1, 2, 3] and finetune.finetune_info(resumed)["resumed_from_epoch"] == 1
    assert [h["epoch"] for h in finetune.finetune_info(resumed)["history"]] == [1, 2, 3]

    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / "other-cache"))
    straight = finetune_base(str(tiny_dir), _examples(), 3, pool="toy", cfg=CFG, progress=False)
    assert trained == [1, 2, 3, 1, 2, 3]
    a, b = _weights(resumed), _weights(straight)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_finetuning_prompt_is_the_prompt_the_base_sees(smollm2):
    example = _examples(1)[0]
    for style in ("authors", "appendix"):
        task = tasks.Task(smollm2, "e2e", "llama", train=[], hyper=[], test=[example], use_chat_template=True,
                            prompt_style=style)
        prompt = finetune.model_prompt("smollm2-135m-instruct", "e2e", example.source, smollm2.tokenizer, style)
        assert prompt == task.prompt(example)
        assert prompts.fill("e2e", "llama", example.source, style) in prompt and prompt.startswith("<|im_start|>")


def test_epochs_and_datasets_are_checked(cache, tiny_dir):
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        finetune_base(str(tiny_dir), _examples(), 0, pool="toy", cfg=CFG)
    mixed = _examples(1) + [data.Example("x", "a", ("b",), {"dataset": "webnlg"})]
    with pytest.raises(ValueError, match="one dataset"):
        finetune_base(str(tiny_dir), mixed, 1, pool="toy", cfg=CFG)


def test_a_finetuned_base_is_trained_only_when_its_weights_are_needed(cache, tiny_dir, tmp_path):
    """Stored runs on a fine-tuned base need its name; a fresh clone with the committed records
    re-executes notebooks 06 and 10 without fine-tuning anything."""
    profile = load_profile("smoke")
    setup = dataclasses.replace(profile.ablations, finetune_epochs=(0, 1),
                                finetune=dataclasses.replace(profile.ablations.finetune, trainable_layers=1))
    pool = finetune.Pool(_examples(), "toy", "four toy inputs")
    records = tmp_path / "records"
    bases = finetune.finetuned_bases(str(tiny_dir), pool, setup, prompt_style="authors", records=records)
    tuned = bases[1]
    assert bases[0] == str(tiny_dir) and not tuned.path.exists()
    box = finetune.load_finetuned_base(tuned)
    assert box.name == f"finetuned/{tuned.path.name}" and box.tokenizer.padding_side == "left"
    assert not tuned.path.exists()  # the name and the tokenizer need no weights
    assert box.vocab_size == len(box.tokenizer)  # the weights do: fine-tuned now
    assert finetune.is_complete(tuned.path)
    record = records / f"{tuned.path.name}.json"
    assert read_json(record) == finetune.finetune_info(tuned.path)
    shutil.rmtree(tuned.path)  # elsewhere: the record is there, the model is not
    again = finetune.finetuned_bases(str(tiny_dir), pool, setup, prompt_style="authors", records=records)[1]
    assert again.info() == read_json(record) and not again.path.exists()


def test_a_finetuned_base_trained_to_other_weights_is_refused(cache, tiny_dir, tmp_path):
    """The same recipe on another processor trains to other weights: the runs stored on the
    kept record's weights must not be mixed with new runs on these."""
    profile = load_profile("smoke")
    setup = dataclasses.replace(profile.ablations, finetune_epochs=(0, 1),
                                finetune=dataclasses.replace(profile.ablations.finetune, trainable_layers=1))
    pool = finetune.Pool(_examples(), "toy", "four toy inputs")
    records = tmp_path / "records"
    tuned = finetune.finetuned_bases(str(tiny_dir), pool, setup, prompt_style="authors", records=records)[1]
    finetune.prepare(tuned)
    assert tuned.info() == finetune.finetune_info(tuned.path)  # the same training: accepted
    record = records / f"{tuned.path.name}.json"
    elsewhere = read_json(record)
    elsewhere["history"][0]["train_loss"] += 1e-6  # what the other machine measured
    elsewhere["history"][0]["seconds"] += 1.0
    atomic_write_json(record, elsewhere)
    again = finetune.finetuned_bases(str(tiny_dir), pool, setup, prompt_style="authors", records=records)[1]
    with pytest.raises(RuntimeError, match="trained to other weights.*move that record and those runs aside"):
        finetune.load_finetuned_base(again).vocab_size
    shutil.rmtree(again.path)  # a fresh clone: only the record, no weights to compare
    assert again.info() == elsewhere


def test_lora_finetuning_stores_adapters_that_are_merged_when_loaded(cache, tiny_dir):
    from peft import PeftModel

    cfg = FinetuneConfig(lr=1e-2, batch_size=2, method="lora", lora_rank=4)
    path = finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=cfg, progress=False)
    assert (path / "adapter_config.json").exists() and not list(path.glob("model*.safetensors"))
    adapters = sum(f.stat().st_size for f in path.glob("adapter_model.*"))
    assert adapters < (tiny_dir / "model.safetensors").stat().st_size / 5  # the base is named, not stored
    assert path.name != finetune_base(str(tiny_dir), _examples(), 1, pool="toy", cfg=FinetuneConfig(
        lr=1e-2, batch_size=2), progress=False).name  # a LoRA fine-tune is not a full one
    tuned, original = finetune.load_finetuned_base(path), load_base_model(str(tiny_dir))
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    assert tuned.name == f"finetuned/{path.name}"
    assert not torch.allclose(tuned.logits(ids), original.logits(ids))  # the adapters learned something
    model, _ = models.load_causal_lm(str(tiny_dir))
    with torch.no_grad():
        unmerged = PeftModel.from_pretrained(model, path)(input_ids=ids).logits
    torch.testing.assert_close(tuned.logits(ids), unmerged, rtol=1e-5, atol=1e-5)
    longer = finetune_base(str(tiny_dir), _examples(), 2, pool="toy", cfg=cfg, progress=False)
    info = finetune.finetune_info(longer)
    assert info["resumed_from_epoch"] == 1 and info["config"]["method"] == "lora"
