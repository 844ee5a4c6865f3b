"""Fine-tuning a base model on task data: the stronger bases of the base-quality ablation.

The paper fine-tunes GPT2-M for 1, 2 and 5 epochs ("1FT", "2FT", "5FT") and trains a Plugin
on each (its Figures 2 and 5). Fine-tuning needs the weights, so it works on the white-box
model (``harness.models.load_causal_lm``); the result is saved as an ordinary model directory and
used as a black box again through ``load_base_model(path)``.

Choices:

- Prompts: the shared task prompts in the profile's style and the base's own format
  (``prompts.build_prompt``, then the chat template where the model registry says the base uses
  one), exactly what ``tasks.Task.prompt`` gives the base at test time, so the base learns the
  task format.
  The loss is the token cross-entropy on the target (+ EOS) only, as for every method here.
- What is trained: every weight (``trainable_layers=None``), or only the last k transformer
  blocks and the final norm (embeddings and output head frozen). The second is much cheaper
  on a CPU: the backward pass stops at block ``n - k``. Or (``method="lora"``) rank-r adapters
  on every linear layer of the blocks, with the base frozen in its run dtype: LLaMA-3.1-8B's
  full fine-tuning in float32 needs about 144 GiB of GPU memory (weights, gradients and AdamW's
  moments: 16 bytes a parameter), adapters about 30. The adapters are stored (with the base's
  name, in ``finetune.json``) and merged into the base when it is loaded as a black box.
- Schedule: AdamW at a constant learning rate, the data in a new seeded order every epoch.
  With a constant rate "fine-tuned for 2 epochs" is a prefix of "fine-tuned for 5 epochs",
  so the 1, 2 and 5 epoch models are checkpoints of one run: asking for 5 epochs continues
  from the 2-epoch checkpoint (its weights and optimiser state) and trains 3 more epochs,
  and the result equals an uninterrupted 5-epoch run.
- Caching: each checkpoint is a directory under ``<cache dir>/finetuned/`` whose name
  encodes the model, dataset, pool, a digest of the exact examples and settings (the prompt
  style too, unless it is "appendix", the style of the models made before the choice existed),
  and the epochs. It is written to a temporary directory and renamed, so a half-written model is
  never picked up, and reused when present.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ...core.pairs import encode_pairs
from ...core.train import TokenObjective, small_model_log_probs
from ... import data
from ...core.blackbox import BlackBoxLM
from ...data import Example, prompts, training_pairs
from ...utils.io import atomic_write_json, read_json, remove_stale_temporaries
from .. import machine, models
from .lora import checkpoint_activations
from ..profile import Ablations, Profile, Tokens

INFO_FILE = "finetune.json"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class FinetuneConfig:
    lr: float = 1e-4
    batch_size: int = 8
    trainable_layers: int | None = None  # None: all weights; k: the last k blocks + final norm
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    max_prompt_tokens: int = 128
    max_target_tokens: int = 127
    method: str = "full"  # or "lora": adapters of rank ``lora_rank`` on the blocks' linear layers
    lora_rank: int = 64


def finetune_config(setup: Ablations, tokens: Tokens | None = None) -> FinetuneConfig:
    """The profile's ``ablations.finetune`` as a ``FinetuneConfig``: token limits it leaves
    unset are ``tokens``' (the profile's), else the config's defaults."""
    fields = dataclasses.asdict(setup.finetune)
    limits = {"max_prompt_tokens": tokens.max_prompt, "max_target_tokens": tokens.max_target} if tokens else {}
    for key in ("max_prompt_tokens", "max_target_tokens"):
        if fields[key] is None:
            fields.pop(key)
            if key in limits:
                fields[key] = limits[key]
    return FinetuneConfig(**fields)


def model_prompt(model_name: str, dataset: str, source: str, tokenizer, style: str = "authors") -> str:
    """The task prompt as the base sees it (the same text as ``tasks.Task.prompt``)."""
    spec = models.model_spec(model_name)
    text = prompts.build_prompt(dataset, spec["family"], source, style=style)
    return prompts.format_for_model(text, tokenizer, spec.get("chat_template", False))


def _dataset_of(examples: Sequence[Example]) -> str:
    names = {ex.meta.get("dataset") for ex in examples}
    if len(names) != 1 or None in names:
        raise ValueError(f"Fine-tuning examples must come from one dataset; got {sorted(map(str, names))}.")
    return names.pop()


def run_prefix(model_name: str, examples: Sequence[Example], pool: str, cfg: FinetuneConfig,
               prompt_style: str = "authors") -> str:
    """Directory name of a fine-tuning run without its epochs: model, dataset, pool, digest."""
    settings = dataclasses.asdict(cfg)
    if cfg.method == "full":  # the models made before the choice existed keep their names
        del settings["method"], settings["lora_rank"]
    keyed = [model_name, [(ex.id, ex.source, ex.references) for ex in examples], settings]
    if prompt_style != "appendix":  # appendix-era models (results/local) keep their names
        keyed.append(prompt_style)
    payload = json.dumps(keyed)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:10]
    model = Path(model_name).name if Path(model_name).exists() else model_name.replace("/", "--")
    return f"{model}-{_dataset_of(examples)}-{pool}-{digest}"


def checkpoint_dir(prefix: str, epochs: int) -> Path:
    return machine.cache_dir() / "finetuned" / f"{prefix}-{epochs}ep"


def is_complete(path: Path) -> bool:
    return (path / INFO_FILE).exists()


def _latest_checkpoint(prefix: str, before: int) -> tuple[int, Path | None]:
    """The most-trained finished checkpoint of the run with fewer than ``before`` epochs."""
    for epochs in range(before - 1, 0, -1):
        path = checkpoint_dir(prefix, epochs)
        if is_complete(path) and (path / OPTIMIZER_FILE).exists():
            return epochs, path
    return 0, None


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The list of transformer blocks of a LLaMA-style (``layers``) or GPT-2 (``h``) model."""
    inner = model.base_model
    for name in ("layers", "h"):
        if isinstance(getattr(inner, name, None), torch.nn.ModuleList):
            return getattr(inner, name)
    raise ValueError(f"Cannot find the transformer blocks of {type(model).__name__}.")


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    inner = model.base_model
    return inner.norm if hasattr(inner, "norm") else inner.ln_f


def select_trainable(model: torch.nn.Module, trainable_layers: int | None) -> list[torch.nn.Parameter]:
    """Unfreeze all weights, or only the last ``trainable_layers`` blocks and the final norm."""
    if trainable_layers is None:
        model.requires_grad_(True)
    else:
        layers = decoder_layers(model)
        if not 1 <= trainable_layers <= len(layers):
            raise ValueError(f"trainable_layers must be in 1..{len(layers)}, got {trainable_layers}.")
        model.requires_grad_(False)
        for layer in layers[len(layers) - trainable_layers :]:
            layer.requires_grad_(True)
        final_norm(model).requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def train_epoch(model, objective: TokenObjective, optimizer, cfg: FinetuneConfig, epoch: int,
                progress: bool = False) -> float:
    """One pass over the pairs in a new order; returns the mean token loss."""
    # Order and dropout depend on (seed, epoch) only, so a run resumed from a checkpoint
    # takes the same steps as an uninterrupted one.
    torch.manual_seed(cfg.seed * 1000 + epoch)
    order = torch.randperm(len(objective)).tolist()
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    total, tokens = 0.0, 0
    starts = range(0, len(order), cfg.batch_size)
    for start in tqdm(starts, desc=f"fine-tune epoch {epoch}", disable=not progress):
        loss_sum, n = objective.nll(model, order[start : start + cfg.batch_size])
        optimizer.zero_grad(set_to_none=True)
        (loss_sum / n).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        total, tokens = total + loss_sum.item(), tokens + n
    model.eval()
    return total / tokens


def save_model_dir(target: Path, model, tokenizer, extra: dict[str, object] | None = None) -> Path:
    """Save model and tokenizer (and ``extra`` files: JSON-able dicts or torch objects) to
    ``target`` atomically: into a temporary directory, then renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target.parent, (f".{target.name}-*",))  # left by a killed process
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, value in (extra or {}).items():
            if name.endswith(".json"):
                (tmp / name).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            else:
                torch.save(value, tmp / name)
        tmp.rename(target)
    except BaseException as err:  # a full disk or Ctrl-C leaves no half-written directory
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(err, OSError) or not (target / "config.json").exists():
            raise  # (an OSError after another process finished the same model first is fine)
    return target


def finetune_base(
    model_name: str,
    examples: Sequence[Example],
    epochs: int,
    *,
    pool: str,
    cfg: FinetuneConfig = FinetuneConfig(),
    prompt_style: str = "authors",
    progress: bool = True,
) -> Path:
    """Directory of ``model_name`` fine-tuned for ``epochs`` epochs on all (input, reference)
    pairs of ``examples`` in prompts of ``prompt_style``; trained only if not cached, continuing
    from the latest shorter checkpoint of the same run. ``pool`` is a short name of where the
    examples come from."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1 (0 epochs is the original model), got {epochs}.")
    prefix = run_prefix(model_name, examples, pool, cfg, prompt_style)
    target = checkpoint_dir(prefix, epochs)
    if is_complete(target):
        return target
    done, start = _latest_checkpoint(prefix, epochs)
    if cfg.method == "lora":
        model, tokenizer = _lora_model(model_name, cfg, start)
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        model, tokenizer = models.load_causal_lm(str(start) if start else model_name, dtype=torch.float32)
        params = select_trainable(model, cfg.trainable_layers)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    info = read_json(start / INFO_FILE) if start else None
    history = info["history"] if info else []
    if start:
        optimizer.load_state_dict(torch.load(start / OPTIMIZER_FILE, map_location=model.device))

    dataset = _dataset_of(examples)
    pairs = training_pairs(examples)
    encoded = encode_pairs(
        tokenizer,
        [model_prompt(model_name, dataset, ex.source, tokenizer, prompt_style) for ex, _ in pairs],
        [reference for _, reference in pairs],
        max_prompt_tokens=cfg.max_prompt_tokens,
        max_target_tokens=cfg.max_target_tokens,
    )
    objective = TokenObjective(encoded, tokenizer.pad_token_id, log_probs=small_model_log_probs)
    for epoch in range(done + 1, epochs + 1):
        started = time.perf_counter()
        # peft's wrapper answers ``base_model`` with its LoraModel; the objective needs the
        # transformers model (with the adapters in it), as harness.baselines.lora's fit_lora does.
        trained = model.get_base_model() if cfg.method == "lora" else model
        loss = train_epoch(trained, objective, optimizer, cfg, epoch, progress)
        history.append({"epoch": epoch, "train_loss": loss, "seconds": time.perf_counter() - started})
    info = {
        "model": model_name,
        "dataset": dataset,
        "pool": pool,
        "epochs": epochs,
        "config": dataclasses.asdict(cfg),
        "prompt_style": prompt_style,
        "inputs": len(examples),
        "pairs": len(pairs),
        "trainable_parameters": sum(p.numel() for p in params),
        "resumed_from_epoch": done,
        "history": history,
    }
    return save_model_dir(target, model, tokenizer, {OPTIMIZER_FILE: optimizer.state_dict(), INFO_FILE: info})


LORA_LAYERS = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
               "gpt2": ["c_attn", "c_proj", "c_fc"]}


def _lora_model(model_name: str, cfg: FinetuneConfig, start: Path | None):
    """The base in its run dtype (``auto``: half precision on a GPU) with trainable rank-r
    adapters (float32, peft's default) on every linear layer of its blocks: new, or
    ``start``'s to continue."""
    from peft import LoraConfig, PeftModel, get_peft_model

    model, tokenizer = models.load_causal_lm(model_name, dtype="auto")
    if model.device.type == "cuda":
        checkpoint_activations(model)
    if start is not None:
        return PeftModel.from_pretrained(model, start, is_trainable=True), tokenizer
    model_type = model.config.model_type
    if model_type not in LORA_LAYERS:
        raise ValueError(f"No LoRA layers known for model type {model_type!r}; fine-tune it with method 'full'.")
    torch.manual_seed(cfg.seed)
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=LORA_LAYERS[model_type], fan_in_fan_out=model_type == "gpt2")
    return get_peft_model(model, config), tokenizer


def finetune_info(path: str | Path) -> dict:
    """What a fine-tuned model directory was trained on and how (its ``finetune.json``)."""
    return read_json(Path(path) / INFO_FILE)


# ---------------------------------------------------------------- fine-tuned bases of the studies
# (the base-quality ablation, notebook 06, and the distribution shift, notebook 10)


@dataclass(frozen=True)
class Pool:
    examples: list[data.Example]
    name: str  # short, goes into the fine-tuned model's directory name
    description: str


def _cap_pairs(examples: list[data.Example], max_pairs: int | None, seed: int) -> list[data.Example]:
    """A seeded choice of inputs with at most ``max_pairs`` (input, reference) pairs, in order."""
    if max_pairs is None:
        return examples
    chosen, pairs = set(), 0
    for i in np.random.RandomState(seed).permutation(len(examples)):
        if pairs + len(examples[i].references) <= max_pairs:
            chosen.add(int(i))
            pairs += len(examples[i].references)
    return [ex for i, ex in enumerate(examples) if i in chosen]


def _pool_candidates(dataset: str, rows: int | None) -> tuple[list[data.Example], str, str]:
    """(inputs, short name, description) of where fine-tuning data can come from."""
    if "train" in data.SPLITS[dataset]:
        try:
            return data.load_dataset(dataset, "train"), "train", "the train split"
        except data.MissingDataError:
            pass  # E2E offline: the cleaned train split is not in shared/data
    return (data.load_dataset(dataset, "validation"), f"val-outside{rows}",
            f"the validation inputs outside the profile's {rows}-input validation subset")


def finetune_pool(dataset: str, profile: Profile, max_pairs: int | None = None, seed: int = 0) -> Pool:
    """Inputs to fine-tune the base on, disjoint from the Plugin's data and the test split.

    The dataset's train split where there is one (WebNLG, CommonGen; E2E with its train file);
    otherwise (E2E offline, Adidas) the validation inputs outside the profile's validation
    subset, which holds everything the Plugin trains and stops on. Inputs of the whole test
    split are removed too (a few Adidas products occur in both splits, one WebNLG input in
    train and validation).
    """
    rows = profile.rows.validation
    plugin_inputs = {ex.source for ex in data.load_dataset(dataset, "validation", rows=rows)}
    test_inputs = {ex.source for ex in data.load_dataset(dataset, "test")}
    if profile.test_inputs is not None:  # fresh test inputs may come from the validation split
        from ..tasks import task_splits

        test_inputs |= {ex.source for ex in task_splits(dataset, profile)[2]}
    candidates, name, origin = _pool_candidates(dataset, rows)
    pool = [ex for ex in candidates if ex.source not in plugin_inputs and ex.source not in test_inputs]
    pool = _cap_pairs(pool, max_pairs, seed)
    if not pool:
        raise ValueError(f"No {dataset} inputs are left to fine-tune on outside the Plugin's data and the test split.")
    pairs = len(data.training_pairs(pool))
    return Pool(pool, f"{name}-{pairs}pairs",
                f"{len(pool)} inputs ({pairs} pairs) from {origin}, disjoint by input from the Plugin's "
                "training and hyper-validation data and from the test split")


@dataclass(frozen=True)
class FinetunedBase:
    """A fine-tuned base, known by its checkpoint directory and fine-tuned on first use only.

    The runs stored on a fine-tuned base need its name, not its weights, so re-executing
    notebooks 06 and 10 from stored runs (a fresh clone) fine-tunes nothing. What the fine-tuning
    did (its ``finetune.json``) is copied to ``record``, kept with the results.
    """

    path: Path
    model_name: str
    train: Callable[[], Path]
    record: Path | None = None

    @property
    def name(self) -> str:
        """The black box's name: ``finetuned/<directory name>``, the same on every machine."""
        return f"finetuned/{self.path.name}"

    def info(self) -> dict:
        """Its ``finetune.json``: the kept copy, else the model's (fine-tuning it if need be).
        Where both exist they must describe the same training (:func:`check_same_training`)."""
        if self.record is not None and self.record.is_file():
            kept = read_json(self.record)
            if is_complete(self.path):
                check_same_training(kept, finetune_info(self.path), self)
            return kept
        info = finetune_info(self.train())
        if self.record is not None:
            atomic_write_json(self.record, info)
        return info


def check_same_training(kept: dict, here: dict, base: FinetunedBase) -> None:
    """Refuse a fine-tuned base whose weights here are not the ones its kept record describes.

    The runs stored on a fine-tuned base are keyed on its recipe (data, settings, seed), which
    fixes its weights only on the same kind of processor: another CPU or GPU rounds differently,
    and the same recipe trains to other weights (measured: an epoch's training loss 1.8986240
    on one machine, 1.8986157 on another). New runs on these weights beside stored runs made on
    the others would compare two different bases, so the training losses, which any difference
    in the weights changes, must agree exactly."""
    losses = [[epoch["train_loss"] for epoch in info.get("history", [])] for info in (kept, here)]
    if losses[0] == losses[1]:
        return
    runs = base.record.parent.parent / "runs" / str(kept.get("dataset")) / f"finetuned--{base.path.name}"
    raise RuntimeError(
        f"The fine-tuned base {base.name} in {base.path} was trained to other weights than the ones "
        f"its kept record {base.record} describes (training loss per epoch {losses[1]} here, "
        f"{losses[0]} there: another processor rounds differently). The runs stored in {runs} were "
        "made on those weights. To compute runs on this base here, move that record and those runs "
        "aside (they are recomputed on these weights); to keep them, put the weights they were made "
        f"with in {base.path}."
    )


def prepare(base: FinetunedBase) -> Path:
    """Fine-tune ``base`` unless it is complete, and keep its record: a unit of the grid."""
    path = base.train()
    base.info()
    return path


def is_prepared(base: FinetunedBase) -> bool:
    """Whether ``base`` is fine-tuned and its record kept (:func:`prepare` would do nothing)."""
    return is_complete(base.path) and (base.record is None or base.record.is_file())


def records_dir(profile: Profile) -> Path:
    """Where the records of a profile's fine-tuned bases are kept (committed with its results)."""
    return machine.results_dir(profile) / "finetuned"


def finetuned_bases(model_name: str, pool: Pool, setup: Ablations, *, prompt_style: str,
                    tokens: Tokens | None = None, records: Path | None = None,
                    progress: bool = False) -> dict[int, str | FinetunedBase]:
    """Per number of fine-tuning epochs, the base: the model name for 0, else a
    :class:`FinetunedBase`, fine-tuned when first used (each continues from the latest shorter
    checkpoint). ``prompt_style``: the profile's ``prompts``, the prompts the tasks on these bases
    use; ``tokens``: the profile's token limits, for a ``finetune`` section that sets none;
    ``records``: the folder for their records (:func:`records_dir`)."""
    cfg = finetune_config(setup, tokens)
    prefix = run_prefix(model_name, pool.examples, pool.name, cfg, prompt_style)
    bases: dict[int, str | FinetunedBase] = {}
    for epochs in sorted(setup.finetune_epochs):
        if epochs == 0:
            bases[0] = model_name
            continue
        path = checkpoint_dir(prefix, epochs)
        train = functools.partial(finetune_base, model_name, pool.examples, epochs, pool=pool.name, cfg=cfg,
                                  prompt_style=prompt_style, progress=progress)
        bases[epochs] = FinetunedBase(path, model_name, train, records / f"{path.name}.json" if records else None)
    return bases


class _LazyBlackBox:
    """A black box whose model is loaded, fine-tuned first if need be, when something asks for
    more than its name or tokenizer."""

    def __init__(self, name: str, tokenizer, load: Callable[[], BlackBoxLM]):
        self.name, self.tokenizer, self._load, self._box = name, tokenizer, load, None
        self.states_name = name  # its runs folder, without loading it

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if self._box is None:
            self._box = self._load()
        return getattr(self._box, attribute)


def load_finetuned_base(base: str | Path | FinetunedBase, dtype=None) -> BlackBoxLM:
    """A fine-tuned model as a black box, named ``finetuned/<directory name>`` so that its
    run files have a short name that does not depend on the machine. A :class:`FinetunedBase`
    is loaded (and fine-tuned) only when its weights are first needed."""
    if isinstance(base, FinetunedBase):
        def load() -> BlackBoxLM:
            path = base.train()
            base.info()  # keeps the record beside the results
            return load_finetuned_base(path, dtype)
        return _LazyBlackBox(base.name, models.load_tokenizer(base.model_name), load)
    if (Path(base) / "adapter_config.json").exists():  # adapters: merged into the base they were trained on
        from peft import PeftModel

        model, tokenizer = models.load_causal_lm(finetune_info(base)["model"], dtype=dtype)
        model = PeftModel.from_pretrained(model, base).merge_and_unload()
        return BlackBoxLM(model, tokenizer, f"finetuned/{Path(base).name}")
    model, tokenizer = models.load_causal_lm(str(base), dtype=dtype)
    return BlackBoxLM(model, tokenizer, f"finetuned/{Path(base).name}")
