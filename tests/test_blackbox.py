import re

import pytest
import torch
from devices import assert_forward_close

from plugin_lib.core.blackbox import BlackBoxLM
from plugin_lib.data import data_dir
from plugin_lib.data.files import REPO_DATA_DIR
from plugin_lib.harness.models import converted_smollm2_dir, load_base_model, model_spec, reweighter_spec
from plugin_lib.harness.profile import load_profile, profile_names


def test_offline_model_loads_as_a_black_box(smollm2):
    assert isinstance(smollm2, BlackBoxLM)
    assert smollm2.vocab_size == 49152 and smollm2.tokenizer.padding_side == "left"
    assert not hasattr(smollm2, "parameters") and not hasattr(smollm2, "state_dict")
    ids = smollm2.tokenizer(["Hello there"], return_tensors="pt").input_ids
    logits = smollm2.logits(ids)
    assert logits.shape == (1, ids.shape[1], 49152) and not logits.requires_grad
    assert all(not p.requires_grad for p in smollm2._model.parameters())


def test_converted_copy_is_reused(smollm2):
    path = converted_smollm2_dir()
    assert (path / "config.json").exists() and any(path.glob("*.safetensors"))
    again = load_base_model("smollm2-135m-instruct")
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(again.logits(ids), smollm2.logits(ids))


def test_left_padding_does_not_change_logits(smollm2):
    tok = smollm2.tokenizer
    enc = tok(["A short one", "A noticeably longer prompt than the first"], return_tensors="pt", padding=True)
    batched = smollm2.logits(enc.input_ids, enc.attention_mask)
    alone = smollm2.logits(tok(["A short one"], return_tensors="pt").input_ids)
    n = alone.shape[1]
    assert_forward_close(batched[0, -n:], alone[0])  # 1e-4 in float32; per dtype on a GPU


def test_unknown_model_and_profile_are_clear_errors():
    with pytest.raises(ValueError, match="Unknown base model"):
        load_base_model("gpt5")
    with pytest.raises(ValueError, match="Unknown profile"):
        load_profile("huge")
    with pytest.raises(ValueError, match="Unknown profile field"):
        load_profile("smoke", batchsize=3)


def test_profiles_are_complete_and_overridable():
    for name in profile_names():
        profile = load_profile(name)
        for model in profile.base_models:
            spec = model_spec(model)
            assert reweighter_spec(spec["family"])["arch"] in ("gpt2", "llama")
    assert load_profile("smoke", seeds=[7]).seeds == (7,)
    assert load_profile("smoke").seeds == (0,)  # overrides do not leak


def test_the_profile_schema_keeps_every_value_given_and_names_each_wrong_one():
    """profiles.yaml is read by pydantic (strict): every value written there is the value loaded,
    and a wrong one is an error naming its field."""
    from plugin_lib.harness.profile import settings

    def same(loaded, given, where):
        if isinstance(given, dict):
            for key, value in given.items():
                same(loaded[key], value, f"{where}.{key}")
        else:
            assert loaded == given, where

    for name in profile_names():
        same(load_profile(name).as_dict(), settings()["profiles"][name], name)
    for wrong, said in [({"seeds": "notalist"}, "smoke.seeds: Input should be a list, got 'notalist'"),
                        ({"seeds": []}, "smoke.seeds: Tuple should have at least 1 item"),
                        ({"seeds": [True]}, "smoke.seeds.0: Input should be a valid integer, got True."),
                        ({"seeds": ["1"]}, "smoke.seeds.0: Input should be a valid integer, got '1'."),
                        ({"training": {"max_epochs": 3}}, "smoke.training.patience: Field required"),
                        ({"rows": {"train": 1, "validation": 1, "test": 1, "tset": 1}},
                         "smoke.rows.tset: Unexpected keyword argument")]:
        with pytest.raises(ValueError, match=re.escape(said)):
            load_profile("smoke", **wrong)


def test_data_dir_errors_say_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="not a directory.*plugin-repro data fetch"):
        data_dir()
    monkeypatch.delenv("PLUGIN_DATA_DIR")
    assert data_dir() == REPO_DATA_DIR and (REPO_DATA_DIR / "README.md").exists()  # the default: data/
    monkeypatch.setenv("PLUGIN_DATA_DIR", "hub")
    assert data_dir() is None  # the Hugging Face Hub, chosen explicitly
