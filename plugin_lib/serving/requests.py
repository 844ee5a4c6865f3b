"""What a ``plugin-repro`` command was asked, as one frozen value checked once, when it is made:
``TrainingRequest`` (every flag of ``train``) and ``GenerationRequest`` (how ``generate``,
``evaluate`` and ``serve`` decode). A bad value is a ValueError whose message is the command's one
line (exit status 2), raised before any model loads. Imports nothing heavy, so refused flags answer
at once (tests/test_cli_faults.py); what needs torch is imported where it is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..harness import machine
from ..harness.profile import load_profile
from .inputs import MAX_PROMPT_TOKENS, is_endpoint

ENGINES = ("package", "vllm")
HEAD_DTYPES = ("float32", "bfloat16")  # core.reweighter.HEAD_DTYPES' names, without importing torch


@dataclass(frozen=True, kw_only=True)
class TrainingRequest:
    """``plugin-repro train``: the base and the pairs to train on, the artifact to write, the
    recipe (``profile``'s, with ``epochs``, ``lr``, ``weight_decay``, ``seed``, ``chat`` and
    ``refit`` over it; None or empty: the profile's), the reweighting model's size (None: the
    family's), and an endpoint base's ``top_k``, ``model``, key variable and ``tokenizer``."""

    base: str
    data: Path
    out: Path
    profile: str | None = None
    epochs: int | None = None
    lr: tuple[float, ...] = ()
    weight_decay: tuple[float, ...] = ()
    reweighter_layers: int | None = None
    reweighter_width: int | None = None
    refit: bool = True
    top_k: int | None = None
    chat: bool = False
    seed: int | None = None
    model: str | None = None
    api_key_env: str = "PLUGIN_API_KEY"
    tokenizer: str | None = None

    def __post_init__(self):
        # typer gives a repeated option as a list, or None when it is not given
        object.__setattr__(self, "lr", tuple(self.lr or ()))
        object.__setattr__(self, "weight_decay", tuple(self.weight_decay or ()))
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"--epochs must be at least 1, got {self.epochs}.")
        if any(x <= 0 for x in self.lr) or any(x < 0 for x in self.weight_decay):
            raise ValueError("--lr must be positive and --weight-decay at least 0.")
        if self.reweighter_layers is not None and self.reweighter_layers < 1:
            raise ValueError(f"--reweighter-layers must be at least 1, got {self.reweighter_layers}.")
        if is_endpoint(self.base) and not self.tokenizer:
            raise ValueError("an endpoint base needs --tokenizer (a local copy of the server's tokenizer).")

    def base_spec(self):
        """The base's ``artifact.BaseSpec``; an unknown name is a ValueError here."""
        from .artifact import BaseSpec

        return BaseSpec.parse(self.base, top_k=self.top_k, model=self.model, api_key_env=self.api_key_env)

    def recipe(self, spec):
        """The profile's ``recipe.TrainingRecipe`` with what the flags set over it, for the base
        ``spec``. Without ``profile``, ``harness.machine.auto_profile`` chooses (torch looks for a GPU)."""
        from .recipe import TrainingRecipe

        recipe = TrainingRecipe.from_profile(load_profile(self.profile or machine.auto_profile()))
        budget = {"max_epochs": self.epochs, "lr": self.lr, "weight_decay": self.weight_decay}
        recipe = recipe.replace(**{k: v for k, v in budget.items() if v}, arch=self.reweighter_arch(spec),
                                prompt_format="chat" if self.chat else "plain", refit=self.refit)
        return recipe if self.seed is None else recipe.replace(seed=self.seed)

    def reweighter_arch(self, spec) -> dict:
        """The family's reweighting model (the authors'), with ``reweighter_layers`` blocks and
        hidden width ``reweighter_width`` where given (a LLaMA-style model keeps its 4x
        feed-forward ratio). A width is checked here, against the family's model."""
        arch = spec.reweighter_arch()
        if self.reweighter_layers is not None:
            arch["n_layer"] = self.reweighter_layers
        width = self.reweighter_width
        if width is not None:
            key = {"llama": "hidden_size", "gpt2": "n_embd"}.get(arch["arch"])
            if key is None or width < 8:
                raise ValueError(f"--reweighter-width {width} does not apply to a {arch['arch']} reweighting model "
                                 "(llama or gpt2, at least 8).")
            heads = arch.get("num_attention_heads", arch.get("n_head", 1))
            if width % heads:
                raise ValueError(f"--reweighter-width must be a multiple of its {heads} attention heads, got {width}.")
            arch[key] = width
            if arch["arch"] == "llama":
                arch["intermediate_size"] = 4 * width
        return arch


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """How ``generate``, ``evaluate`` and ``serve`` decode an artifact: the ``engine``, the
    reweighting model's output layer (``head_dtype``), the endpoint base at another address
    (``base_url``), the artifact's decoding settings a flag overrides (None: the artifact's),
    the base alone (``base_only``, greedy), the longest prompt accepted, and ``serve``'s
    interactive ``docs`` (the package's server only)."""

    engine: str = "package"
    head_dtype: str = "float32"
    base_url: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    base_only: bool = False
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    docs: bool = False

    def __post_init__(self):
        if self.base_only and self.temperature:
            raise ValueError("--base-only decodes greedily, as the comparison with the Plugin does; leave out "
                             "--temperature.")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown --engine {self.engine!r}; choose one of {', '.join(ENGINES)}.")
        if self.head_dtype not in HEAD_DTYPES:
            raise ValueError(f"Unknown head dtype {self.head_dtype!r}; choose one of {HEAD_DTYPES}.")
        package_only = [flag for flag, given in (("--base-url", self.base_url), ("--docs", self.docs)) if given]
        if self.engine == "vllm" and package_only:
            raise ValueError(f"{', '.join(package_only)}: the package's own engine only; leave "
                             f"{'it' if len(package_only) == 1 else 'them'} out with --engine vllm.")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}.")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"--temperature must be at least 0 (0: greedy), got {self.temperature}.")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"--max-prompt-tokens must be at least 1, got {self.max_prompt_tokens}.")

    def overrides(self) -> dict:
        """The artifact's decoding settings the flags replace (``PluginModel.generate``'s overrides)."""
        return {k: v for k, v in (("max_new_tokens", self.max_new_tokens), ("temperature", self.temperature))
                if v is not None}

    def load(self, artifact: Path):
        """The artifact's ``PluginModel``, its base reached at ``base_url`` where given."""
        from .artifact import PluginModel

        return PluginModel.from_pretrained(artifact, base_url=self.base_url, head_dtype=self.head_dtype)
