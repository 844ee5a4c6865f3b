"""Typed requests instead of loose parameters (issue 75): a black box's decoding
(``core.sampling.DecodingRequest``) and the commands' flags (``serving.requests``), each one frozen
value checked once, when it is made. Nothing here loads a model."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plugin_lib.core.sampling import DecodingRequest
from plugin_lib.serving.requests import GenerationRequest, TrainingRequest

PAIRS = Path(__file__).parent / "fixtures" / "pairs.jsonl"


def test_a_temperature_gives_transformers_keywords_as_the_server_always_sent_them():
    greedy = DecodingRequest.from_temperature(0.0, 1.0, max_new_tokens=8)
    assert greedy.generate_kwargs() == {"max_new_tokens": 8, "do_sample": False}
    assert len(greedy.warpers()) == 0
    sampled = DecodingRequest.from_temperature(0.7, 0.9, max_new_tokens=8, min_new_tokens=2, pad_token_id=0,
                                               eos_token_id=2)
    assert sampled.generate_kwargs() == {"max_new_tokens": 8, "do_sample": True, "temperature": 0.7, "top_p": 0.9,
                                         "top_k": None, "pad_token_id": 0, "eos_token_id": 2, "min_new_tokens": 2}
    assert [type(w).__name__ for w in sampled.warpers()] == ["TemperatureLogitsWarper", "TopPLogitsWarper"]
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        DecodingRequest.from_temperature(-1.0, 1.0)


@pytest.mark.parametrize("fields, message", [
    ({"max_new_tokens": -1}, "max_new_tokens and min_new_tokens must be at least 0"),
    ({"num_beams": 0}, "num_beams must be at least 1"),
    ({"do_sample": True, "temperature": 0.0}, "temperature must be above 0"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k must be at least 0"),
])
def test_a_decoding_request_out_of_range_is_refused_when_made(fields, message):
    with pytest.raises(ValueError, match=message):
        DecodingRequest(**fields)


def test_a_decoding_request_is_frozen_and_its_end_ids_default_to_the_box_s():
    request = DecodingRequest(eos_token_id=[5, 2])
    assert request.eos_token_id == (5, 2) and request.end_ids(0) == {2, 5}
    assert DecodingRequest().end_ids(7) == {7} and DecodingRequest(eos_token_id=3).end_ids(7) == {3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.max_new_tokens = 3
    with pytest.raises(TypeError):
        DecodingRequest(repetition_penalty=1.1)  # not a keyword a black box's own loop implements


def test_the_api_black_box_refuses_beams_before_any_request():
    from plugin_lib.core.api import ApiBlackBox

    box = ApiBlackBox.__new__(ApiBlackBox)  # no server: the refusal comes first
    with pytest.raises(NotImplementedError, match="Beam search"):
        box.generate(None, None, num_beams=3)


@pytest.mark.parametrize("flags, message", [
    ({"base_only": True, "temperature": 0.5}, "--base-only decodes greedily"),
    ({"engine": "nope"}, "unknown --engine 'nope'; choose one of package, vllm."),
    ({"head_dtype": "float16"}, "Unknown head dtype 'float16'"),
    ({"engine": "vllm", "base_url": "http://x", "docs": True}, "--base-url, --docs: the package's own engine only"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be at least 1"),
    ({"temperature": -0.5}, "--temperature must be at least 0"),
    ({"max_prompt_tokens": 0}, "--max-prompt-tokens must be at least 1"),
])
def test_a_generation_request_names_its_bad_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        GenerationRequest(**flags)


def test_a_generation_request_overrides_only_what_was_given():
    assert GenerationRequest().overrides() == {}
    assert GenerationRequest(max_new_tokens=8, temperature=0.0).overrides() == {"max_new_tokens": 8, "temperature": 0.0}


@pytest.mark.parametrize("flags, message", [
    ({"lr": [-1.0]}, "--lr must be positive and --weight-decay at least 0."),
    ({"weight_decay": [-0.1]}, "--lr must be positive and --weight-decay at least 0."),
    ({"reweighter_layers": 0}, "--reweighter-layers must be at least 1, got 0."),
    ({"epochs": 0}, "--epochs must be at least 1"),
    ({"base": "http://127.0.0.1:1"}, "an endpoint base needs --tokenizer"),
])
def test_a_training_request_names_its_bad_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        TrainingRequest(**{"base": "smollm2-135m-instruct", "data": PAIRS, "out": Path("out"), **flags})


def test_a_training_request_sets_its_flags_over_the_profile_s_recipe():
    from plugin_lib.serving.artifact import BaseSpec

    spec = BaseSpec("model", "smollm2-135m-instruct")
    plain = TrainingRequest(base=spec.name, data=PAIRS, out=Path("out"), profile="smoke")
    recipe = plain.recipe(spec)
    assert (recipe.name, recipe.prompt_format, recipe.refit, recipe.arch) == ("smoke", "plain", True,
                                                                              spec.reweighter_arch())
    flags = TrainingRequest(base=spec.name, data=PAIRS, out=Path("out"), profile="smoke", epochs=3, lr=[1e-3, 5e-3],
                            seed=0, chat=True, refit=False, reweighter_layers=2, reweighter_width=64)
    recipe = flags.recipe(spec)
    assert (recipe.max_epochs, recipe.lr, recipe.seed, recipe.prompt_format, recipe.refit) == (
        3, (1e-3, 5e-3), 0, "chat", False)
    assert (recipe.arch["n_layer"], recipe.arch["hidden_size"], recipe.arch["intermediate_size"]) == (2, 64, 256)
    with pytest.raises(ValueError, match="--reweighter-width 4 does not apply to a gpt2 reweighting model"):
        dataclasses.replace(flags, reweighter_width=4).recipe(BaseSpec("model", "gpt2-medium"))
