"""The one configuration object, ``Profile``.

Every setting lives in ``profiles.yaml`` next to this file; ``load_profile(name)`` reads one
profile into a frozen, typed ``Profile`` that is passed everywhere (notebooks, runner, methods,
writers). Where a profile's results and caches go is ``harness.machine``'s.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml

from ..utils.frozen import freeze

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES_FILE = Path(__file__).with_name("profiles.yaml")


class ProfileError(ValueError):
    """profiles.yaml cannot be read, names no such profile, or has a wrong field: one line that
    names the file, the place and what to do. Every command exits 2 on it."""


# Lists in profiles.yaml are never empty (an empty grid or seed list would fail far from here).
Floats = Annotated[tuple[float, ...], pydantic.Field(min_length=1)]
Ints = Annotated[tuple[int, ...], pydantic.Field(min_length=1)]
Names = Annotated[tuple[str, ...], pydantic.Field(min_length=1)]


@dataclass(frozen=True)
class Rows:
    """Rows per split; None is the whole split."""

    train: int | None
    validation: int | None
    test: int | None


@dataclass(frozen=True)
class Grid:
    """Hyperparameters searched on hyper-validation loss (alpha: WeightedComb only).

    ``extend_edges``: how many times a searched value may be pushed past the grid's edge when
    the chosen one sits there (``harness.running.search.select_hparams``); 0 keeps the grid as listed.
    """

    lr: Floats
    weight_decay: Floats
    alpha: Floats
    extend_edges: int
    # "grid": every combination. "coordinate": one hyperparameter at a time (lr, then weight
    # decay, then alpha), each searched from the middle of its list with the others at their
    # current choice, and pushed past an edge as above (harness.running.search.select_hparams).
    search: Literal["grid", "coordinate"] = "grid"


@dataclass(frozen=True)
class Training:
    max_epochs: int
    patience: int
    batch_size: int
    warmup_ratio: float


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    repetition_penalty: float
    batch_size: int


@dataclass(frozen=True)
class TempNetSettings:
    """TempNet (Qiu et al., ICML 2024; github zhqiu/TempNet), ``harness.baselines.tempnet``.

    rho: the KL-constrained DRO loss's rho (null: plain NLL of the scaled logits, which
    calibrates the temperature instead). tau_min, tau_max: the scaled-sigmoid range of the
    temperature. hidden_size: the network's width. top_p, top_k: the sampling that TempNet
    decodes with, at its temperature (top_k 0: no top-k filter)."""

    rho: float | None
    tau_min: float
    tau_max: float
    hidden_size: int
    top_p: float
    top_k: int
    # "input": one temperature per input (this package's first version); "token": one per
    # position, as zhqiu/TempNet's LLaMA-2/megatron/model/tempnet.py. ``temperature``: the
    # generation config's own temperature, applied on top (LLaMA-2-Chat's: 0.6).
    per: Literal["input", "token"] = "input"
    temperature: float = 1.0


@dataclass(frozen=True)
class ProxySettings:
    """Proxy-tuning and DExperts (``harness.methods``, notebook 15): their expert is NewModel's
    model, the anti-expert uniform at CPU scale. ``alphas``: the strengths chosen from on
    hyper-validation loss (alisawuffles/proxy-tuning's default is 1; DExperts' toxicity script
    uses 2). ``top_p``: DExperts' nucleus of the base (its scripts' filter_p 0.9).
    ``pretrained``: also run both arms with a pretrained expert tuned alone and the same model
    untuned as the anti-expert (proxy-tuning's own pairing), beside the Plugin trained from that
    pretrained model (``harness.baselines.variants.expert_variant``: GPT2-Small for GPT-2 bases,
    LLaMA-3.2-1B for LLaMA-3.1-8B, otherwise the base cut to ``ablations.pretrained_layers``).
    Their hyperparameters follow notebook 07's rule for its pretrained model,
    ``ablations.complexity_hparams``, so Plugin-pretrained is one run in both notebooks."""

    alphas: Floats = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0)
    top_p: float = 0.9
    pretrained: bool = False


@dataclass(frozen=True)
class Tokens:
    max_prompt: int
    max_target: int


@dataclass(frozen=True)
class Bdpl:
    """BDPL's optimiser and prompt (harness.baselines.bdpl; Diao et al.'s run_glue_discrete_LM.py):
    prompts sampled per step, AdamW's learning rate and weight decay, the gradient-norm clip,
    prompt positions, candidate phrases, and training pairs per black-box call."""

    samples_per_step: int
    lr: float
    weight_decay: float
    clip_norm: float
    prompt_length: int
    num_candidates: int
    batch_size: int


@dataclass(frozen=True)
class Wrapper:
    """Tables 5 and 8 (notebooks 05 and 11): datasets (None: all four), BDPL's call budget
    and its optimiser."""

    datasets: Names | None
    bdpl_budget: int
    bdpl: Bdpl
    # Larger call budgets tried in order, beside ``bdpl_budget``, to find one at which BDPL
    # learns (its premise holds on hyper-validation); None: only ``bdpl_budget``.
    bdpl_learning_budgets: Ints | None = None


@dataclass(frozen=True)
class TestInputs:
    """Fresh test inputs (``harness.tasks.task_splits``): the test split less the inputs that
    the profile (or profiles) ``fresh_from`` decode, then ``rows.test`` of them drawn with
    ``seed``. Where the split has too few, ``fill_from_validation`` adds validation inputs that
    no profile named decodes or trains on. ``dedupe_references``: a candidate whose reference
    equals a training or hyper-validation reference is left out."""

    fresh_from: str | Names
    seed: int
    fill_from_validation: bool
    dedupe_references: bool

    @property
    def profiles(self) -> tuple[str, ...]:
        """The profiles whose inputs these avoid."""
        return (self.fresh_from,) if isinstance(self.fresh_from, str) else self.fresh_from


@dataclass(frozen=True)
class Finetune:
    """Fine-tuning a base (notebooks 06 and 10). Token limits None: the profile's ``tokens``
    (a prompt cut to fewer tokens loses the start of its chat template)."""

    lr: float
    trainable_layers: int | None
    max_prompt_tokens: int | None = None
    max_target_tokens: int | None = None
    # "full": the weights themselves, in float32 (the authors' base_model_training.py). "lora":
    # rank-``lora_rank`` adapters on every linear layer of the blocks, the base in its run dtype,
    # stored as adapters with the base's name and merged into it when loaded (harness.baselines.finetune).
    method: Literal["full", "lora"] = "full"
    lora_rank: int = 64


@dataclass(frozen=True)
class Ablations:
    """Notebooks 06-08. Seeds None: the profile's seeds."""

    model: str
    finetune_epochs: Ints
    finetune: Finetune
    finetune_pool_pairs: int | None
    layers: Ints
    pretrained_layers: int | None
    complexity_hparams: str
    base_quality_seeds: Ints | None
    complexity_seeds: Ints | None
    architecture_seeds: Ints | None


@dataclass(frozen=True)
class Shift:
    """Notebook 10: epochs of fine-tuning towards the shifted data, its pool (None: all), the
    base (None: the ablations' model; the paper: LLaMA-3.1-8B) and how it is fine-tuned."""

    epochs: int
    pool_pairs: int | None
    model: str | None
    finetune: Finetune | None = None  # None: the ablations' ``finetune``


@dataclass(frozen=True)
class Source:
    vocab_size: int
    concentration: float
    noise: float
    seed: int


@dataclass(frozen=True)
class TokenGrid:
    """``points`` training-token counts from ``low`` to ``high``, evenly spaced in log t."""

    low: int
    high: int
    points: int


@dataclass(frozen=True)
class Theorem1:
    """Notebook 13, the synthetic check of Theorem 1."""

    source: Source
    tokens: TokenGrid
    seeds: Ints
    ridge: float
    fit_from: int
    bootstrap: int


@dataclass(frozen=True)
class ApiServer:
    """The local server notebook 14 starts (``start``: llama-cpp-python's, on the offline GGUF);
    with ``start: false`` it uses the endpoint of the API model's ``base_url_env``."""

    start: bool
    n_threads: int
    n_ctx: int


@dataclass(frozen=True)
class Api:
    """Notebook 14, a model behind an HTTP API: the API model (a registry entry with
    ``source: api``), the in-process base of the same weights it is compared with, k and the
    top-k rule, its own scale (rows, seeds, methods), the decoding batch (1: a server that
    answers one request at a time reuses the previous prompt's cache), and how many training
    pairs are also scored by echo (to compare echo with stepwise teacher forcing)."""

    model: str
    compare: str
    k: int
    rule: str
    rows: Rows
    seeds: Ints
    methods: Names
    decode_batch_size: int
    echo_pairs: int
    server: ApiServer


@dataclass(frozen=True)
class Profile:
    """One way of running the package (``paper``, ``local``, ``smoke``, ...), as in profiles.yaml."""

    name: str
    base_models: Names
    dtype: str
    seeds: Ints
    rows: Rows
    grid: Grid
    training: Training
    decoding: Decoding
    tempnet: TempNetSettings
    tokens: Tokens
    bootstrap_resamples: int
    wrapper: Wrapper
    ablations: Ablations
    shift: Shift
    theorem1: Theorem1
    api: Api
    # The task prompts and ICL demonstrations (``data.prompts``): the authors' code's strings and
    # draw, or the paper's typeset appendix with a draw per input and seed.
    prompts: Literal["authors", "appendix"] = "authors"
    # None: the test inputs are ``rows.test`` drawn from the test split (seed 42). Set: fresh
    # ones, never decoded by another profile (the preregistered confirmation).
    test_inputs: TestInputs | None = None
    # How the frozen base's outputs are stored (core.cache): "full" log-probabilities, "compact"
    # final hidden states turned back into them by the base's output layer (exact; a fraction of
    # the disk), or "auto" (compact on a GPU or where the full one would not fit; printed).
    cache_layout: Literal["auto", "full", "compact"] = "auto"
    # Decoding from static KV caches, the steps compiled and replayed as CUDA graphs
    # (core.decode, docs/gpu.md): "gpu" where the base is on a GPU, else "never". Same tokens, so
    # not a setting a stored run is keyed on (as the device is not); a record says it was used.
    static_decoding: Literal["gpu", "never"] = "never"
    # A search's configurations stepped as one stacked model (core.stacked: one forward and
    # backward for all, each its own optimiser): "gpu" where the base is on a GPU, else "never".
    # The same results up to the rounding of batched kernels, so not a setting runs are keyed on.
    stacked_training: Literal["gpu", "never"] = "never"
    # How many units that train from the stored caches run at once on one GPU, each a process of
    # its own with the base's output layer alone (``plugin-repro grid run``, ``run --executor``;
    # harness.planning.concurrency): "auto" (from the GPU's free memory, the cores and a measured
    # concurrency curve; 1 on a CPU) or a count. The same results bit for bit, so no run is keyed on it.
    trainings_at_once: Literal["auto"] | Annotated[int, pydantic.Field(ge=1)] = "auto"
    # Proxy-tuning and DExperts (notebook 15); a profile without the section (the frozen
    # ``confirm``) gets these defaults.
    proxy: ProxySettings = dataclasses.field(default_factory=ProxySettings)

    def replace(self, **overrides: Any) -> Profile:
        """A copy with top-level fields replaced, the whole checked against the schema."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)} - {"name"}
        if unknown:
            raise ValueError(f"Unknown profile field(s) {sorted(unknown)}; known: "
                             f"{sorted(f.name for f in dataclasses.fields(self))}.")
        return validated({**dataclasses.asdict(self), **overrides}, Profile, self.name)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples as lists), e.g. for fingerprints."""
        return _plain(dataclasses.asdict(self))

    def section(self, name: str) -> dict[str, Any]:
        """One section as plain values: ``profile.section("training")``."""
        return self.as_dict()[name]


for _section in [v for v in list(globals().values()) if dataclasses.is_dataclass(v) and v.__module__ == __name__]:
    _section.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")  # a misspelt key is an error, not ignored


def ablation_settings(profile: Profile, **overrides: Any) -> Ablations:
    """The ablation sizes of ``profile`` (its ``ablations`` section, notebooks 06-08); overrides
    that are None keep the profile's value, the others are type-checked like any profile field."""
    section = dataclasses.asdict(profile.ablations)
    unknown = set(overrides) - set(section)
    if unknown:
        raise ValueError(f"Unknown ablation setting(s) {sorted(unknown)}; known: {sorted(section)}.")
    section.update({k: v for k, v in overrides.items() if v is not None})
    return profile.replace(ablations=section).ablations


def ablation_seeds(setup: Ablations, ablation: str, profile: Profile) -> list[int]:
    """Seeds of one ablation ("base_quality", "complexity", "architecture"): its own, else the profile's."""
    return list(getattr(setup, f"{ablation}_seeds") or profile.seeds)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _as_json(value: Any) -> Any:
    """What ``json.dumps`` cannot write itself: a section given as a dataclass as its mapping, a
    numpy scalar as its number, anything else as its repr (which the schema then names)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value.item() if hasattr(value, "item") else repr(value)


@functools.cache
def _schema(hint: Any) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(hint)


def validated(value: Any, hint: Any, where: str) -> Any:
    """``value`` (plain data, as in profiles.yaml) as type ``hint`` by pydantic, strictly: no
    number read from a string, no bool taken for a number, no unknown or missing key, no empty
    list; a clear error naming each wrong field otherwise (a papermill ``-p seeds notalist``
    among them). Read as JSON, where lists stand for tuples."""
    try:
        return _schema(hint).validate_json(json.dumps(value, default=_as_json), strict=True)
    except pydantic.ValidationError as err:
        errors = err.errors(include_url=False)
        inner = [e for e in errors if not any(o["loc"][:len(e["loc"])] == e["loc"] != o["loc"] for o in errors)]
        wrong = "; ".join(f"{'.'.join([where, *map(str, e['loc'])])}: {e['msg'].replace('valid array', 'list')}"
                          + (f", got {e['input']!r}" if e["type"] != "missing" else "") for e in inner)
        raise ProfileError(f"Profile field(s) wrong: {wrong}. Mend them in plugin_lib/harness/profiles.yaml "
                           "(docs/profiles.md says what each field takes).") from None


@functools.lru_cache(maxsize=1)
def settings() -> dict[str, Any]:
    """profiles.yaml as parsed, frozen (``utils.frozen``): one object that every reader shares."""
    try:
        with open(PROFILES_FILE, encoding="utf-8") as f:
            parsed = yaml.safe_load(f)
    except yaml.YAMLError as err:
        mark, begun = getattr(err, "problem_mark", None), getattr(err, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if begun is not None and getattr(err, "context", None):
            problem += f", {err.context} begun at line {begun.line + 1}, column {begun.column + 1}"
        shown = PROFILES_FILE.relative_to(REPO_ROOT) if PROFILES_FILE.is_relative_to(REPO_ROOT) else PROFILES_FILE
        raise ProfileError(f"{shown}{where}: not valid YAML ({problem}). Mend it there (`git diff {shown}` shows "
                           f"your edits; `git checkout -- {shown}` undoes them).") from None
    except OSError as err:
        raise ProfileError(f"{PROFILES_FILE} cannot be read ({err.strerror}): restore it with `git checkout`.") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("profiles"), dict):
        raise ProfileError(f"{PROFILES_FILE} has no `profiles:` mapping at its top: restore it with `git checkout`.")
    return freeze(parsed)


def profile_names() -> tuple[str, ...]:
    return tuple(settings()["profiles"])


def load_profile(name: str | Profile, **overrides: Any) -> Profile:
    """Profile ``name`` from profiles.yaml; ``overrides`` replace top-level fields (typed).

    Overrides that are None are ignored, so notebook parameters can default to None.
    """
    if isinstance(name, Profile):
        profile = name
    else:
        profiles = settings()["profiles"]
        if not isinstance(name, str) or name not in profiles:
            raise ProfileError(f"Unknown profile {name!r}. Choose one of: {', '.join(profiles)}.")
        profile = validated({**profiles[name], "name": name}, Profile, name)
    given = {k: v for k, v in overrides.items() if v is not None}
    return profile.replace(**given) if given else profile


# Profiles meant for a GPU: the preflight plans them (and stops a machine that cannot run them)
# before anything runs; the others are planned on any machine.
GPU_PROFILES = ("paper", "colab")
