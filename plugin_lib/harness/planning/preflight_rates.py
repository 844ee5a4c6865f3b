"""The preflight's rates: measured for a few seconds on this machine (``measure_rates``), or
estimated for a named GPU class from an earlier H100 probe (``estimated_rates``, ``gpus``), and
the hours they give a notebook's work (``Rates.seconds``).
"""
from __future__ import annotations

import dataclasses
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...core.decode import PluginLogitsProcessor, compiled_step
from ...core.reweighter import make_reweighter
from ...core.cache import BaseOutputCache, cache_dtype, choose_placement, host_available_bytes
from ...core.pairs import EncodedPair
from ...core.stacked import ParameterStack, stack_signature
from ...core.train import TokenObjective, configs_that_fit, grid_pays
from . import concurrency, gpus
from .. import models
from .gpus import GpuClass
from ..baselines.lora import checkpoint_activations, lora_objective
from ..baselines.lora import lora_on
from .shared_rates import Shape, measure_shared
from .preflight_counts import TaskCounts, base_shape, cache_layout, count_task, dtype_bytes, load_dtype, shape_model
from ..profile import Profile

GRID_CONFIGS = 12  # configurations trained together when the grid rate is measured (as benchmarks/bench_fused.py)
TRAINING_WORK = ("pair_epochs", "grid_pair_epochs", "lora_tokens")  # what early stopping shortens


@dataclass(frozen=True)
class Rates:
    """Measured on this machine with ``measured_with``, in the dtype the run loads it in."""

    measured_with: str
    forward_tokens_per_s: float  # base forward (cache build, BDPL calls)
    train_pairs_per_s: float  # a reweighting model trained from a cache on the base's device
    decode_step_s: float  # one greedy step of the base at the profile's decoding batch
    plugin_step_s: float  # the same with the Plugin's logits processor
    device: str
    # Each of GRID_CONFIGS reweighting models trained together from one cache (core.train.fit_grid:
    # each batch read once for all), per model; None where a grid does not pay (the runner then
    # trains one by one) or it was not measured.
    grid_train_pairs_per_s: float | None = None
    # Whether the decoding steps were timed from static caches with CUDA graphs (the profile's
    # static_decoding "gpu", core.decode).
    static_decoding: bool = False
    # LoRA training through the base (tokens/s: forward, backward and AdamW on the adapters, as
    # lora.lora_on sets it up); None where it was not measured, which then estimates it from
    # the forward rate.
    lora_tokens_per_s: float | None = None
    # The same grid stepped as one stacked model (core.stacked; the profile's stacked_training
    # "gpu"), per model; measured on a GPU only, and None where the family's reweighting model is
    # not stacked there (GPT-2's, with dropout) or where it was not measured.
    stacked_train_pairs_per_s: float | None = None
    # The concurrency curve (harness.planning.shared_rates): pairs/s of k processes that train from a compact
    # cache at once, together, by k ("1", "4", "8", "12"); None until a GPU measured it, or where
    # the processes' weights were not all equal. With it: a training process's peak device
    # memory, the machine's cores and GPU memory, and a lone step's host and device milliseconds.
    shared_train_pairs_per_s: dict[str, float] | None = None
    training_process_bytes: int | None = None
    cores: int | None = None
    gpu_memory_bytes: int | None = None
    step_host_ms: float | None = None
    step_device_ms: float | None = None
    # LoRA without activations recomputed (where the planned peak fits the GPU:
    # preflight_counts.lora_recompute); lora_tokens_per_s is with them on a GPU, as it always was.
    lora_plain_tokens_per_s: float | None = None
    # Whether the run this prices recomputes LoRA's activations (for_profile sets it; a CPU never does).
    lora_recompute: bool = True

    def stacks(self, profile: Profile) -> bool:
        """Whether ``profile`` trains a search's configurations as one stacked model where these
        rates were measured (``stacked_training`` "gpu", on a GPU) at a measured stacked rate."""
        return profile.stacked_training == "gpu" and self.device == "cuda" and bool(self.stacked_train_pairs_per_s)

    def for_profile(self, profile: Profile, trainings: int = 1, lora_recompute: bool = True) -> Rates:
        """These rates as ``profile`` trains: a search's configurations ``trainings`` processes
        at once at the measured curve's aggregate rate (``harness.planning.concurrency``), else at the
        stacked rate where it stacks them (``stacks``); LoRA with or without recomputing."""
        shared = concurrency.best_measured(self.shared_train_pairs_per_s, trainings) if trainings > 1 else None
        if shared and shared > 1:
            grid = self.shared_train_pairs_per_s[str(shared)]
        elif self.stacks(profile):
            grid = self.stacked_train_pairs_per_s
        else:
            grid = self.grid_train_pairs_per_s
        return dataclasses.replace(self, grid_train_pairs_per_s=grid, lora_recompute=lora_recompute)

    def lora_rate(self) -> float | None:
        """LoRA's measured tokens/s as the run trains it: with recomputed activations on a GPU
        where the planned peak needs them (the rate files have always had), else without."""
        if self.device == "cuda" and not self.lora_recompute and self.lora_plain_tokens_per_s:
            return self.lora_plain_tokens_per_s
        return self.lora_tokens_per_s  # recomputing: an upper bound where the plain rate is not measured

    def seconds(self, work: dict) -> float:
        s = work.get("forward_tokens", 0.0) / self.forward_tokens_per_s
        s += work.get("pair_epochs", 0.0) / self.train_pairs_per_s
        s += work.get("grid_pair_epochs", 0.0) / (self.grid_train_pairs_per_s or self.train_pairs_per_s)
        s += work.get("decode_steps", 0) * self.decode_step_s + work.get("plugin_steps", 0) * self.plugin_step_s
        # Training through the base: LoRA at its measured rate, else (and full fine-tuning) as
        # forward + backward, about 3 forward passes per token (4 for LoRA on a GPU where it
        # recomputes activations); full fine-tuning runs in float32 (about twice the
        # half-precision cost on a GPU).
        recompute = 1 if self.device == "cuda" and self.lora_recompute else 0
        if self.lora_rate():
            s += work.get("lora_tokens", 0.0) / self.lora_rate()
        else:
            s += (3 + recompute) * work.get("lora_tokens", 0.0) / self.forward_tokens_per_s
        float32 = 2 if self.device == "cuda" else 1
        s += 3 * float32 * work.get("finetune_tokens", 0.0) / self.forward_tokens_per_s
        return s


def _timed(fn, repeats: int = 1, warm_up: bool = True) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    if warm_up:
        fn()
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - started) / repeats


def measure_rates(model: str, profile: Profile, counts: TaskCounts, device: torch.device,
                  shared_counts: tuple[int, ...] = ()) -> Rates:
    """A few seconds of measurement: the base's forward throughput on a batch of training
    pairs, greedy steps with and without the Plugin, and reweighting-model training steps
    from a cache of random log-probabilities held where the run would hold it. On a GPU the
    base is the model's full-size shape twin; on a CPU the model itself, on smaller batches.
    ``shared_counts``: also the concurrency curve at these counts (``harness.planning.shared_rates``;
    ``--save-rates`` asks for it)."""
    gpu = device.type == "cuda"
    runner_model = shape_model(model) if gpu else model
    base = models.load_base_model(runner_model, dtype=profile.dtype, device=device)
    vocab = len(base.tokenizer)
    batch = profile.training.batch_size if gpu else min(2, profile.training.batch_size)
    length = max(8, int(round(counts.pair_tokens)))
    ids = torch.randint(3, vocab, (batch, length))
    base.logits(ids[:1, :8])  # warm-up
    forward = _timed(lambda: base.logits(ids), warm_up=gpu)

    decode_batch, steps = profile.decoding.batch_size, (8 if gpu else 3)
    prompt = torch.randint(3, vocab, (decode_batch, max(4, int(round(counts.prompt_tokens)))))
    mask = torch.ones_like(prompt)
    reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(model)).to(base.device)
    settings = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                    pad_token_id=base.tokenizer.pad_token_id)
    # The decoding the run will use: from static caches with CUDA graphs where the profile says so
    # (core.decode; the first call compiles, the second records the graphs: both before timing).
    static = gpu and profile.static_decoding == "gpu"
    step = compiled_step(reweighter) if static else None
    if static:
        settings["cache_implementation"] = "static"

    def plugin_call():
        processor = PluginLogitsProcessor(reweighter, mask, static_length=prompt.shape[1] + steps if static else None,
                                          step=step)
        return base.generate(prompt, mask, logits_processor=[processor], **settings)

    if static:  # one more warm-up each: _timed's own then replays the graphs
        base.generate(prompt, mask, **settings)
        plugin_call()
    alone = _timed(lambda: base.generate(prompt, mask, **settings), warm_up=gpu)
    plugin = _timed(plugin_call, warm_up=gpu)

    target = max(2, length // 4)
    train_batch = profile.training.batch_size
    pairs = [EncodedPair(tuple(ids[i % batch].tolist()), length - target) for i in range(2 * train_batch)]
    rows = torch.randn(len(pairs) * target, base.vocab_size).log_softmax(-1).to(cache_dtype(base.dtype))
    cache = BaseOutputCache(rows, np.arange(len(pairs) + 1) * target)
    free, total = torch.cuda.mem_get_info(base.device) if gpu else (None, None)
    where = choose_placement(cache.nbytes, device_type=base.device.type, has_directory=False, gpu_free=free,
                             gpu_total=total, host_available=host_available_bytes())
    objective = TokenObjective(pairs, base.tokenizer.pad_token_id, cache=cache.placed(where, base.device))
    train = _step_s(objective, [reweighter], train_batch)
    grid = _grid_step_s(objective, models.arch_for(model), base.vocab_size, base.device, train_batch) \
        if grid_pays(base.device, objective.cache) else None
    stacked = _grid_step_s(objective, models.arch_for(model), base.vocab_size, base.device, train_batch,
                           stacked=True) if gpu else None
    shape = shared_shape(model, profile, counts, device) if shared_counts else None
    lora = _lora_rates(base, pairs, train_batch, runner_model)  # the last: it puts adapters into the base's weights
    measured = dict(measured_with=runner_model, forward_tokens_per_s=batch * length / forward,
                    train_pairs_per_s=train_batch / train, decode_step_s=alone / steps, plugin_step_s=plugin / steps,
                    device=base.device.type, grid_train_pairs_per_s=train_batch / grid if grid else None,
                    static_decoding=static,
                    lora_tokens_per_s=train_batch * length / lora[1] if lora[1] else None,
                    lora_plain_tokens_per_s=train_batch * length / lora[0] if lora[0] else None,
                    stacked_train_pairs_per_s=train_batch / stacked if stacked else None,
                    cores=concurrency.machine_cores(), gpu_memory_bytes=total)
    del base, reweighter, objective
    if gpu:
        torch.cuda.empty_cache()
    if shape is not None:  # after the base is gone: the processes have the device to themselves
        measured.update(_shared_fields(shape, shared_counts, runner_model))
    return Rates(**measured)


def shared_shape(model: str, profile: Profile, counts: TaskCounts, device: torch.device) -> Shape:
    """A training process of the concurrency curve as a unit of ``model`` trains in ``profile``,
    from the base's configuration (no weights): its output layer's shape in the dtype the run
    loads the base in, the family's reweighting model, E2E's pair and target lengths."""
    shape = base_shape(model)
    targets = max(2, int(round(counts.target_tokens / max(counts.pairs, 1))))
    batch_size = profile.training.batch_size
    dtype = models.resolve_dtype(shape_model(model) if device.type == "cuda" else model, profile.dtype, device)
    return Shape(vocab=shape["vocab"], hidden=shape["hidden"], dtype=str(dtype).removeprefix("torch."),
                 arch=tuple(sorted(models.arch_for(model).items())),
                 pairs=(8 if device.type == "cuda" else 2) * batch_size,
                 length=max(int(round(counts.pair_tokens)), targets + 2), targets=targets,
                 batch_size=batch_size, device=str(device))


def _shared_fields(shape: Shape, shared_counts: tuple[int, ...], label: str) -> dict:
    """The curve's fields of ``Rates``; without the curve where the processes' weights differed."""
    cores = concurrency.machine_cores()
    steps = 100 if shape.device.startswith("cuda") else 5  # a CPU rehearses the measurement; its rates plan nothing
    curve = measure_shared(shape, [k for k in shared_counts if k == 1 or k <= cores], steps=steps)
    if not curve.digests_equal:
        warnings.warn(f"{label}: trainings at once ended with other weights than one alone; the concurrency "
                      "curve is left out (the plan prices one at a time).", stacklevel=2)
    return dict(shared_train_pairs_per_s=curve.pairs_per_s if curve.digests_equal else None,
                training_process_bytes=curve.peak_bytes, step_host_ms=curve.host_ms, step_device_ms=curve.device_ms)


def _lora_rates(base, pairs: list[EncodedPair], batch_size: int, label: str) -> tuple[float | None, float | None]:
    """Seconds of one LoRA training step through ``base``, without and (on a GPU) with
    activations recomputed, set up as the runs set it up (``lora.lora_on``), on the base's
    own weights: measured last, as it adds adapters to them. A step that does not fit the GPU
    leaves its figure None (LoRA's hours are then estimated), the other rates stand."""
    gpu = base.device.type == "cuda"
    plain = recomputed = None
    try:
        adapted = lora_on(base._model, seed=0, recompute=False)  # noqa: SLF001 - the measurement's own copy
        plain = _step_s(lora_objective(pairs, base.tokenizer.pad_token_id), [adapted], batch_size)
    except torch.cuda.OutOfMemoryError as err:
        warnings.warn(f"{label}: a LoRA training step without recomputed activations did not fit in the GPU's "
                      f"memory here ({err}).", stacklevel=2)
        adapted = None
        torch.cuda.empty_cache()
    if not gpu:
        return plain, plain  # a CPU never recomputes: both figures are the one rate
    try:
        if adapted is None:
            adapted = lora_on(base._model, seed=0, recompute=True)  # noqa: SLF001
        else:
            checkpoint_activations(base._model)  # noqa: SLF001 - the same adapters, now recomputed
        recomputed = _step_s(lora_objective(pairs, base.tokenizer.pad_token_id), [adapted], batch_size)
    except torch.cuda.OutOfMemoryError as err:
        warnings.warn(f"{label}: a LoRA training step did not fit in the GPU's memory here ({err}); LoRA's hours "
                      "are estimated from the forward rate.", stacklevel=2)
    return plain, recomputed


def _grid_step_s(objective: TokenObjective, arch: dict, vocab_size: int, device: torch.device, batch_size: int,
                 stacked: bool = False) -> float | None:
    """Seconds per model of one training step of ``GRID_CONFIGS`` reweighting models (as many as
    fit, ``configs_that_fit``, as the runner does) that share each batch, as
    ``core.train.fit_grid`` trains a search's configurations (one warm-up step); with
    ``stacked``, stepped as one stacked model (``fit_grid(stack=True)``), or None where this
    model would not be stacked here (``core.stacked.stack_signature``: dropout on a GPU)."""
    first = make_reweighter(vocab_size=vocab_size, seed=0, **arch).to(device)
    if stacked and stack_signature(first) is None:
        return None
    grid = [first] + [make_reweighter(vocab_size=vocab_size, seed=i, **arch).to(device)
                      for i in range(1, configs_that_fit(first, GRID_CONFIGS))]
    return _step_s(objective, grid, batch_size, stacked)


def _step_s(objective: TokenObjective, grid: list[torch.nn.Module], batch_size: int, stacked: bool = False) -> float:
    """Seconds per model of one AdamW training step of every model in ``grid`` on one shared batch
    of ``objective`` (one warm-up step first: the objective holds two batches), one model after
    another or, with ``stacked``, all in one ``ParameterStack``."""
    device = next(grid[0].parameters()).device
    for model in grid:
        model.train()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in grid]
    parameters = ParameterStack(grid) if stacked else None
    starts = iter(range(0, len(objective), batch_size))

    def step():
        start = next(starts)
        shared = objective.batch(range(start, start + batch_size), device)
        if parameters is not None:
            parameters.losses_and_gradients(objective, shared)
            for optimizer in optimizers:
                optimizer.step()
            return
        for model, optimizer in zip(grid, optimizers):
            loss, n = objective.batch_nll(model, shared)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            optimizer.step()

    seconds = _timed(step) / len(grid)
    if parameters is not None:
        parameters.release()
    return seconds


def save_rates(rates: dict[str, Rates | None], path: str | Path) -> None:
    """Write measured rates (``--save-rates``), naming the device, so that a machine without
    that GPU can plan with them (``--rates``)."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    record = {"device_name": device, "torch": torch.__version__,
              "rates": {m: dataclasses.asdict(r) for m, r in rates.items() if r is not None}}
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)  # atomic: a killed run leaves no half-written file


def load_rates(path: str | Path, models_needed) -> dict[str, Rates | None]:
    """Rates saved by ``save_rates`` on another machine, for ``models_needed`` (None where the
    file has none), each labelled with the device that measured it."""
    try:
        record = json.loads(Path(path).read_text())
        saved = record["rates"]
        fields = {f.name for f in dataclasses.fields(Rates)}
        for model, entry in saved.items():  # every field, measured or null: what save_rates writes
            if set(entry) != fields:
                raise ValueError(f"{model}'s rates lack {', '.join(sorted(fields - set(entry)))}"
                                 if fields - set(entry) else f"{model}'s rates have unknown "
                                 f"{', '.join(sorted(set(entry) - fields))}")
        rates = {m: Rates(**{**saved[m], "measured_with": f"{saved[m]['measured_with']} on {record['device_name']}, "
                                                          f"saved in {Path(path).name}"}) if m in saved else None
                 for m in models_needed}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise SystemExit(f"--rates {path}: not a rates file written by --save-rates ({err}). "
                         "On a GPU machine: plugin-repro preflight --profile paper --save-rates FILE")
    return rates


def estimated_rates(model: str, profile: Profile, card: GpuClass, counts: TaskCounts) -> Rates | None:
    """Rates of ``model`` on ``card`` from the H100 probe (``gpus``), or None for a base the
    probe did not cover: cache building and training scaled by the card's throughput (training
    from a compact cache adds its output layer's product), decoding by its memory bandwidth."""
    spec = models.model_spec(model)
    probe = gpus.probe_rates(spec.get("paper_model", spec["display"]))
    if probe is None or counts.pairs == 0:
        return None
    ratio, s = gpus.compute_ratio(card), base_shape(model)
    train_s = ratio / probe["train"]
    if cache_layout(model, profile, card, counts.target_tokens) == "compact":
        train_s += counts.target_tokens / counts.pairs * gpus.head_s_per_token(card, s["hidden"], s["vocab"])
    step = gpus.decode_step_s(card, s["params"] * dtype_bytes(load_dtype(model, profile, card)), s["layers"])
    return Rates(f"the H100 probe scaled to the {card.name} (an estimate)",
                 probe["cache"] * max(counts.pair_tokens, 1.0) / ratio, 1 / train_s, step,
                 step * gpus.PLUGIN_DECODE_RATIO, "cuda")


def expected_share(work: dict, factor: float) -> dict:
    """``work`` with its trainings at the expected epochs (``factor`` of the cap)."""
    return {k: v * factor if k in TRAINING_WORK else v for k, v in work.items()}


def reference_estimate(works: list[dict], profile: Profile) -> str:
    """Cache building and training of ``works`` (``costs.work``'s, with their ``model``) at the
    probed H100 rates (not measured here)."""
    build = train = 0.0
    for work in works:
        ref = reference_rates(work["model"])
        if ref is None:
            continue
        pair_tokens = count_task("e2e", work["model"], profile).pair_tokens
        build += work.get("forward_tokens", 0.0) / pair_tokens / ref["cache"]
        train += (work.get("pair_epochs", 0.0) + work.get("grid_pair_epochs", 0.0)) / ref["train"]
    return (f"For scale only, at H100 rates from an earlier probe of the paper's shapes (GPT2-M at GPT2-XL's): "
            f"building the caches {build / 3600:,.1f} h and training at most {train / 3600:,.0f} h "
            f"({train / 3600 / profile.training.max_epochs:,.1f} h per epoch of every training); "
            "decoding, BDPL, LoRA and fine-tuning are not included.")


def reference_rates(model: str) -> dict | None:
    """The probed H100 rates (cache building, training) of the paper base that ``model`` is or
    twins, or None for a base the probe did not cover."""
    spec = models.model_spec(model)
    return gpus.probe_rates(spec.get("paper_model", spec["display"]))
