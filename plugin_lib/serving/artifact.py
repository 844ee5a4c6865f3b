"""``PluginModel``: a base, a trained reweighting model and what it takes to use them, as one
directory (``save_pretrained`` / ``from_pretrained``, after transformers' conventions).

The directory::

    plugin_config.json   format, the base's spec, the decoding settings, the reweighter's kind
    reweighter/          a transformers reweighter (config.json + model.safetensors), or
    reweighter.safetensors  a context-free one (its shape is in plugin_config.json)
    tokenizer/           the base's tokenizer, as the reweighter was trained on it
    training.json        the training record: data hash, grid, chosen hyper-parameters,
                         hyper-validation loss, package version
    README.md            a model card in the Hugging Face Hub's format

The base is not in the directory: it is named (``BaseSpec``), as a registry name, a Hub id or a
local directory loaded in process, or an OpenAI-compatible endpoint reached through
``core.api.ApiBlackBox``. Loading checks the saved tokenizer against the base's and refuses a
mismatch (``TokenizerMismatch``): the product b * r needs one shared vocabulary.
"""
from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import shutil
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from transformers import AutoTokenizer, LogitsProcessorList

from ..core.api import ApiBlackBox, DEFAULT_SPECULATE
from ..core.api_client import CompletionsClient, TokenizerMismatch
from ..core.blackbox import DEFAULT_RULE, RULES, BlackBoxLM
from ..core.decode import PluginLogitsProcessor, generate
from ..core.reweighter import check_vocabulary, for_decoding
from ..core.sampling import DecodingRequest
from ..data.prompts import format_for_model
from ..harness import models
from ..utils.io import remove_stale_temporaries, temporary_prefix
from . import artifact_files
from .artifact_files import FORMAT, ArtifactError, load_reweighter, read_json, save_reweighter, usual_modes
from .inputs import CONFIG_FILE, MAX_PROMPT_TOKENS, is_endpoint

PROMPT_FORMATS = ("plain", "chat")


@dataclass(frozen=True)
class BaseSpec:
    """Where the base lives.

    ``kind="model"``: ``name`` is a registry name (``profiles.yaml``), a Hub id or a local
    directory, loaded in process; ``"<name>@top<k>"`` gives its top-k view.
    ``kind="endpoint"``: ``name`` is the server's URL; ``top_k`` log-probabilities are asked per
    position, the key is read from ``api_key_env`` at each request (never stored here), and
    ``model`` is the request's model field (None: the server's only model), ``speculate`` the
    positions asked per greedy decoding request (exact; ``core.api.ApiBlackBox.generate``).
    """

    kind: str
    name: str
    top_k: int | None = None
    rule: str = DEFAULT_RULE
    model: str | None = None
    api_key_env: str = "PLUGIN_API_KEY"
    teacher_forcing: str = "stepwise"
    max_concurrency: int = 4
    speculate: int = DEFAULT_SPECULATE

    def __post_init__(self):
        if self.kind not in ("model", "endpoint"):
            raise ArtifactError(f"Unknown base kind {self.kind!r}: 'model' or 'endpoint'.")
        if self.kind == "endpoint" and not self.top_k:
            raise ArtifactError("An endpoint base needs top_k: how many log-probabilities to ask per position.")
        if self.rule not in RULES:
            raise ArtifactError(f"Unknown top-k rule {self.rule!r}; choose one of {RULES}.")

    @classmethod
    def parse(cls, base: str, *, top_k: int | None = None, model: str | None = None,
              api_key_env: str = "PLUGIN_API_KEY") -> "BaseSpec":
        """``--base`` of the command line: a URL is an endpoint, anything else a model name."""
        if is_endpoint(base):
            return cls("endpoint", base.rstrip("/"), top_k=top_k or 20, model=model, api_key_env=api_key_env)
        if top_k:
            base = f"{base}@top{top_k}"
        models.model_spec(base)  # an unknown name fails here, before any work
        return cls("model", base)

    @property
    def display(self) -> str:
        return f"{self.name} (top-{self.top_k}, {self.rule})" if self.kind == "endpoint" else self.name

    def reweighter_arch(self) -> dict:
        """The authors' reweighting model for this base's family: the registry's family, or
        LLaMA-like for anything else (an endpoint, a Hub id), whose 1-layer model fits any vocabulary."""
        return models.reweighter_spec(models.model_spec(self.name)["family"] if self.kind == "model" else "llama")

    def load(self, tokenizer=None) -> BlackBoxLM:
        """The black box. An endpoint needs ``tokenizer``, a local copy of the server's."""
        if self.kind == "model":
            return models.load_base_model(self.name)
        if tokenizer is None:
            raise ArtifactError("An endpoint base needs the local copy of its tokenizer.")
        client = CompletionsClient(self.name, api_key_env=self.api_key_env, max_concurrency=self.max_concurrency)
        return ApiBlackBox(client, tokenizer, self.top_k, rule=self.rule, name=f"{self.name}@top{self.top_k}",
                           teacher_forcing=self.teacher_forcing, model=self.model, speculate=self.speculate)


class PromptTooLong(ValueError):
    """A prompt longer than the limit: refused, never cut."""


@dataclass
class DecodingSettings:
    """How the adapted model decodes unless a request says otherwise. ``temperature`` 0 is
    greedy; ``prompt_format`` is how a prompt is shown to the base, as in training: ``plain``
    (as given) or ``chat`` (one user turn of the tokenizer's chat template)."""

    max_new_tokens: int = 64
    repetition_penalty: float | None = 1.1
    temperature: float = 0.0
    top_p: float = 1.0
    prompt_format: str = "plain"
    max_prompt_tokens: int = 128

    def __post_init__(self):
        if self.prompt_format not in PROMPT_FORMATS:
            raise ArtifactError(f"Unknown prompt_format {self.prompt_format!r}; choose one of {PROMPT_FORMATS}.")


@dataclass
class Completion:
    """One generated continuation and what it cost in tokens."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of sequence) or "length"


def package_version() -> str:
    try:
        return importlib.metadata.version("plugin-repro")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class PluginModel:
    """The adapted model: p_t ∝ b_t · r_t, decoded by ``generate`` / ``complete``.

    Args:
        base: the black box (in process or behind an API).
        reweighter: the trained reweighting model over the base's vocabulary.
        base_spec: how to find the base again when the artifact is loaded.
        decoding: default decoding settings.
        training: the training record (``training.json``), if any.
        head_dtype: ``float32`` (exact), or ``bfloat16``: the reweighting model's output layer
            decodes in bfloat16, faster where the hardware has it (``core.reweighter.for_decoding``).
    """

    def __init__(self, base: BlackBoxLM, reweighter: torch.nn.Module, *, base_spec: BaseSpec,
                 decoding: DecodingSettings | None = None, training: dict | None = None,
                 head_dtype: str = "float32"):
        check_vocabulary(base.vocab_size, reweighter)
        self.base, self.reweighter = base, reweighter.eval()
        self.head_dtype, self.decoder = head_dtype, for_decoding(self.reweighter, head_dtype)
        self.base_spec, self.decoding = base_spec, decoding or DecodingSettings()
        self.training = training or {}
        # An in-process base hooks its model during generate (top-k views); one call at a time.
        self._in_process_lock = threading.Lock() if not isinstance(base, ApiBlackBox) else None

    @property
    def tokenizer(self):
        return self.base.tokenizer

    def __repr__(self) -> str:
        return f"PluginModel(base={self.base_spec.display!r}, reweighter={type(self.reweighter).__name__})"

    # -- generation

    def format_prompt(self, prompt: str) -> str:
        """The prompt as the reweighting model saw prompts in training."""
        return format_for_model(prompt, self.tokenizer, self.decoding.prompt_format == "chat")

    def generate(self, prompts: list[str], *, progress: bool = False, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                 **overrides) -> list[str]:
        """Continuations of ``prompts`` (batched), with the artifact's decoding settings unless
        ``overrides`` (``max_new_tokens``, ``temperature``, ``top_p``, ``repetition_penalty``).
        Every prompt is used whole, as ``serve`` uses it; one over ``max_prompt_tokens`` is refused
        (``check_prompt_lengths``)."""
        settings = {**asdict(self.decoding), **overrides}
        texts = [self.format_prompt(p) for p in prompts]
        self.check_prompt_lengths(texts, max_prompt_tokens)
        request = DecodingRequest.from_temperature(settings["temperature"], settings["top_p"],
                                                   max_new_tokens=settings["max_new_tokens"])
        return generate(self.base, texts, self.decoder, repetition_penalty=settings["repetition_penalty"],
                        progress=progress, **request.generate_kwargs())

    def check_prompt_lengths(self, texts: list[str], limit: int = MAX_PROMPT_TOKENS) -> list[int]:
        """The token counts of formatted prompts; ``PromptTooLong`` naming the first one over
        ``limit``. The one policy of ``generate``, ``evaluate`` and ``serve``: a prompt is used
        whole or refused, never cut (training kept the last ``decoding.max_prompt_tokens``
        tokens of its prompts; a longer prompt is still used whole)."""
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False).input_ids]
        for i, length in enumerate(lengths):
            if length > limit:
                raise PromptTooLong(f"prompt {i + 1} has {length} tokens; at most {limit} are accepted "
                                    "(--max-prompt-tokens). Shorten it: it is never cut silently.")
        return lengths

    def complete(self, text: str, *, max_new_tokens: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, seed: int | None = None, streamer=None, min_new_tokens: int = 0
                 ) -> Completion:
        """One continuation of ``text``, already formatted (``format_prompt`` or a chat template).
        ``streamer``: a transformers streamer (e.g. ``TextIteratorStreamer``) fed token by token."""
        d = self.decoding
        enc = self.tokenizer([text], return_tensors="pt", add_special_tokens=False)
        prompt_length = enc.input_ids.shape[1]
        processor = PluginLogitsProcessor(self.decoder, enc.attention_mask,
                                          repetition_penalty=d.repetition_penalty)
        extra = {"streamer": streamer} if streamer is not None else {}
        request = DecodingRequest.from_temperature(
            d.temperature if temperature is None else temperature, d.top_p if top_p is None else top_p,
            max_new_tokens=max_new_tokens or d.max_new_tokens, min_new_tokens=min_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.base.eos_token_id)
        lock = self._in_process_lock or _NO_LOCK
        with lock:
            if seed is not None and request.do_sample:
                torch.manual_seed(seed)
            out = self.base.generate(enc.input_ids, enc.attention_mask, logits_processor=LogitsProcessorList([processor]),
                                     **request.generate_kwargs(), **extra)
        new = out[0, prompt_length:].tolist()
        eos = self.base.eos_token_id
        stopped = eos in new
        if stopped:
            new = new[: new.index(eos) + 1]
        return Completion(self.tokenizer.decode(new, skip_special_tokens=True), prompt_length, len(new),
                          "stop" if stopped else "length")

    # -- saving and loading

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the artifact to ``directory``, whole or not at all: it is built beside it and
        moved into place (an existing artifact there is replaced only once the new one is complete)."""
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Named after this process, so the next save reaps what a killed one left (a kill -9 skips
        # the cleanup below): ``.<name>.<host~pid>.partial.tmp`` and ``...old.tmp``.
        remove_stale_temporaries(target.parent, (f".{glob.escape(target.name)}.*.tmp",))
        partial = target.parent / f"{temporary_prefix(target)}partial.tmp"
        old = target.parent / f"{temporary_prefix(target)}old.tmp"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            config = {"format": FORMAT, "package_version": package_version(), "base": asdict(self.base_spec),
                      "decoding": asdict(self.decoding), "reweighter": save_reweighter(self.reweighter, partial)}
            self.tokenizer.save_pretrained(partial / "tokenizer")
            (partial / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
            (partial / "training.json").write_text(json.dumps(self.training, indent=2) + "\n")
            (partial / "README.md").write_text(model_card(self.base_spec, self.decoding, self.training))
            usual_modes(partial)
            if target.exists():
                os.replace(target, old)
            os.replace(partial, target)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return target

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, base: BlackBoxLM | None = None,
                        base_url: str | None = None, head_dtype: str = "float32") -> "PluginModel":
        """Load an artifact. ``base``: an already loaded black box to use instead of the saved
        spec's; ``base_url``: the same endpoint at another address; ``head_dtype``: as in the
        constructor."""
        config = read_config(directory)
        directory = Path(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
        spec = BaseSpec(**config["base"])
        if base_url is not None:
            if spec.kind != "endpoint":
                raise ArtifactError(f"base_url is for a Plugin over an endpoint; this one's base is the model {spec.name!r}.")
            spec = BaseSpec(**{**config["base"], "name": base_url.rstrip("/")})
        if base is None:
            base = spec.load(tokenizer)
        check_same_tokenizer(tokenizer, base.tokenizer, spec.display)
        reweighter = load_reweighter(directory, config["reweighter"]).to(base.device)
        training = read_json(directory / "training.json") if (directory / "training.json").exists() else {}
        return cls(base, reweighter, base_spec=spec, decoding=DecodingSettings(**config["decoding"]), training=training,
                   head_dtype=head_dtype)


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


def read_config(directory: str | os.PathLike) -> dict:
    """``plugin_config.json`` of an artifact, with a clear error for anything else."""
    config = artifact_files.read_config(directory)
    unknown = set(config.get("base", {})) - {f.name for f in fields(BaseSpec)}
    if unknown:
        raise ArtifactError(f"{Path(directory) / CONFIG_FILE}: unknown base fields {sorted(unknown)}.")
    return config


def check_same_tokenizer(saved, base_tokenizer, where: str) -> None:
    """``TokenizerMismatch`` unless the artifact's tokenizer is the base's (same vocabulary and
    end-of-sequence token)."""
    if saved.get_vocab() != base_tokenizer.get_vocab() or saved.eos_token_id != base_tokenizer.eos_token_id:
        raise TokenizerMismatch(
            f"The Plugin was trained on another tokenizer than {where}'s ({len(saved)} vs {len(base_tokenizer)} "
            "tokens, or other ids): a reweighting model works only on the vocabulary it was trained on. "
            "Load it with the base it was trained for, or train a Plugin for this base.")


def _what_it_saw(training: dict) -> str:
    """Which pairs the saved model trained on: all of them (refit), or the training part."""
    split = (f"the configuration was chosen on {training.get('train_pairs', '?')} training and "
             f"{training.get('hyper_pairs', '?')} hyper-validation pairs")
    refit = training.get("refit")
    if refit:
        return f"The saved model trained on all {refit['pairs']} pairs for {refit['epochs']} epochs; {split}."
    return (f"The saved model trained on the {training.get('train_pairs', '?')} training pairs only (no refit); "
            f"{split}.")


def model_card(spec: BaseSpec, decoding: DecodingSettings, training: dict) -> str:
    """README.md in the Hub's model-card format: YAML metadata, then what the model is."""
    base_model = spec.name if spec.kind == "model" and "/" in spec.name and not Path(spec.name).exists() else None
    meta = ["---", "library_name: plugin-repro", "pipeline_tag: text-generation",
            "tags:", "- plugin", "- logit-reweighting", "- black-box-adaptation"]
    if base_model:
        meta += [f"base_model: {base_model.split('@')[0]}"]
    meta += ["---", ""]
    chosen = training.get("hparams", {})
    lines = [
        "# A Plugin reweighting model",
        "",
        "A small reweighting model r trained on top of a frozen base b, after Hiranandani et al., *Logits are All We "
        "Need to Adapt Closed Models* (ICML 2025). The adapted model predicts p_t ∝ b_t · r_t; only r was trained.",
        "",
        f"- **Base:** {spec.display} ({'in process' if spec.kind == 'model' else 'an OpenAI-compatible endpoint'})",
        f"- **Training data:** {training.get('pairs', '?')} (prompt, completion) pairs, sha256 "
        f"`{training.get('data_sha256', '?')}`. {_what_it_saw(training)}",
        f"- **Chosen:** {', '.join(f'{k} {v:g}' for k, v in chosen.items()) or '?'}; hyper-validation loss "
        f"{training.get('val_loss', float('nan')):.4f} (epoch {training.get('best_epoch', '?')})",
        f"- **Decoding:** {'greedy' if decoding.temperature == 0 else f'temperature {decoding.temperature}'}, "
        f"repetition penalty {decoding.repetition_penalty}, up to {decoding.max_new_tokens} new tokens, "
        f"prompts {decoding.prompt_format}",
        "",
        "## Use",
        "",
        "```bash",
        "plugin-repro generate --plugin . --prompt \"...\"",
        "plugin-repro serve --plugin . --port 8000   # OpenAI-compatible: /v1/completions, /v1/chat/completions",
        "```",
        "",
        "```python",
        "from plugin_lib.serving import PluginModel",
        "plugin = PluginModel.from_pretrained(\".\")",
        "print(plugin.generate([\"...\"])[0])",
        "```",
        "",
        f"Written by plugin-repro {package_version()}. `training.json` holds the full training record.",
        "",
    ]
    return "\n".join(meta + lines)
