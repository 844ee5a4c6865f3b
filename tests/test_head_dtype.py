"""The reweighting model's output layer in bfloat16 at decoding (``core.reweighter.for_decoding``,
``--head-dtype`` of generate, evaluate and serve): opt-in, a copy whose logits stay within
bfloat16's rounding of the float32 model's, and never what is trained or saved. Its speed is
measured in ``benchmarks/bench_decode.py``, not here."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from plugin_lib.core.decode import generate
from plugin_lib.core.reweighter import LowPrecisionHead, for_decoding, make_reweighter, reweighter_logits
from plugin_lib.serving import cli
from plugin_lib.serving.artifact import BaseSpec, DecodingSettings, PluginModel

BFLOAT16_UNIT = 2.0 ** -8  # bfloat16 keeps 8 significant bits: a rounding moves a value by at most half of this


def test_float32_decodes_with_the_model_itself(small_reweighter):
    model = small_reweighter("llama")
    assert for_decoding(model, "float32") is model


def test_an_unknown_head_dtype_is_named(small_reweighter):
    with pytest.raises(ValueError, match="Unknown head dtype 'float16'"):
        for_decoding(small_reweighter("llama"), "float16")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mlp", "linear"])
def test_a_bfloat16_head_is_a_copy_within_its_rounding_and_the_model_is_untouched(small_reweighter, arch):
    model = small_reweighter(arch)
    with torch.no_grad():  # logits of a trained model's scale, not an initialisation's
        model.get_output_embeddings().weight.mul_(8.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    decoder = for_decoding(model, "bfloat16")
    assert decoder is not model and isinstance(decoder.get_output_embeddings(), LowPrecisionHead)
    assert decoder.get_output_embeddings().weight.dtype == torch.bfloat16

    ids = torch.randint(0, model.get_output_embeddings().weight.shape[0], (3, 7))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        exact = reweighter_logits(model, ids, mask)
        approx = reweighter_logits(decoder, ids, mask)
        hidden = {}
        handle = model.get_output_embeddings().register_forward_hook(lambda m, i, o: hidden.update(h=i[0]))
        reweighter_logits(model, ids, mask)
        handle.remove()
    assert approx.dtype == torch.float32 and approx.shape == exact.shape
    # Each product h_i * W_vi carries the roundings of both factors (about 2 units in all), and
    # float32 accumulation adds little; the bound is per logit, from |h| @ |W|^T.
    bound = 2 * BFLOAT16_UNIT * (hidden["h"].abs() @ model.get_output_embeddings().weight.abs().T) + 1e-5
    assert ((approx - exact).abs() <= bound).all()
    assert not torch.equal(approx, exact)  # it is another computation, not the same one relabelled
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == before[name].dtype and torch.equal(tensor, before[name]), name
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mlp", "linear"])
def test_a_bfloat16_copy_shares_the_body_and_adds_only_the_head(small_reweighter, arch):
    model = small_reweighter(arch)
    decoder = for_decoding(model, "bfloat16")
    own = {p.data_ptr() for p in model.parameters()}
    new = [(name, p) for name, p in decoder.named_parameters() if p.data_ptr() not in own]
    shared = [p for p in decoder.parameters() if p.data_ptr() in own]
    head = model.get_output_embeddings()
    head_params = [head.weight] + ([] if head.bias is None else [head.bias])
    assert shared, "the copy should reuse the body's weights"
    # Only the bfloat16 head (weight, and bias where it has one) is new memory; no float32 copy is made.
    assert [p.dtype for _, p in new] == [torch.bfloat16] * len(head_params), [name for name, _ in new]
    assert [p.shape for _, p in new] == [p.shape for p in head_params]
    body = {p.data_ptr() for p in model.parameters()} - {p.data_ptr() for p in head_params}
    assert body <= {p.data_ptr() for p in shared}


def test_a_plugin_with_a_bfloat16_head_decodes_with_it_and_saves_the_float32_model(smollm2, tmp_path):
    reweighter = make_reweighter("llama", smollm2.vocab_size, hidden_size=32, intermediate_size=64, seed=3)
    adapted = PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                          decoding=DecodingSettings(max_new_tokens=6), head_dtype="bfloat16")
    assert adapted.reweighter is reweighter and adapted.decoder is not reweighter
    prompts = ["Name a colour.", "name[Cotto], food[Indian]"]
    assert adapted.generate(prompts) == generate(smollm2, [adapted.format_prompt(p) for p in prompts],
                                                 adapted.decoder, max_new_tokens=6,
                                                 repetition_penalty=adapted.decoding.repetition_penalty,
                                                 progress=False)
    adapted.save_pretrained(tmp_path / "art")
    loaded = PluginModel.from_pretrained(tmp_path / "art", base=smollm2)
    assert loaded.head_dtype == "float32" and loaded.decoder is loaded.reweighter
    for name, tensor in reweighter.state_dict().items():
        assert torch.equal(loaded.reweighter.state_dict()[name], tensor), name


def test_the_command_line_takes_the_head_dtype_and_names_a_wrong_one(smollm2, tmp_path):
    reweighter = make_reweighter("llama", smollm2.vocab_size, hidden_size=32, intermediate_size=64, seed=3)
    PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                decoding=DecodingSettings(max_new_tokens=4)).save_pretrained(tmp_path / "art")
    ok = CliRunner().invoke(cli.app, ["generate", "--plugin", str(tmp_path / "art"), "--prompt", "Hi",
                                      "--head-dtype", "bfloat16"])
    assert ok.exit_code == 0, ok.output
    wrong = CliRunner().invoke(cli.app, ["generate", "--plugin", str(tmp_path / "art"), "--prompt", "Hi",
                                         "--head-dtype", "float16"])
    assert wrong.exit_code == 2 and "Unknown head dtype 'float16'" in wrong.output


def test_the_server_decodes_with_the_bfloat16_head(smollm2):
    from test_serving import Served

    reweighter = make_reweighter("llama", smollm2.vocab_size, hidden_size=32, intermediate_size=64, seed=3)
    adapted = PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                          decoding=DecodingSettings(max_new_tokens=8), head_dtype="bfloat16")
    calls = {"float32": 0, "bfloat16": 0}
    for name, model in (("float32", reweighter), ("bfloat16", adapted.decoder)):
        model.get_output_embeddings().register_forward_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    with Served(adapted) as client:
        client.completions.create(model="mine", prompt="Name a colour.", max_tokens=8, temperature=0)
    assert calls["bfloat16"] >= 1 and calls["float32"] == 0
