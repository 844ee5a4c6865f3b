"""TempNet (Qiu et al., ICML 2024, "To Cool or not to Cool?"), the paper's baseline (f).

Followed (github zhqiu/TempNet): the network of ``LLaMA-2/megatron/model/tempnet.py``, the loss
of ``vocab_parallel_cross_entropy_temp`` in ``LLaMA-2/megatron/core/tensor_parallel/
cross_entropy.py`` with rho from ``LLaMA-2/pretrain_llama_distributed.sh`` (TempNet trained
alone on a frozen LLaMA-2-Chat, our setting), and for decoding the root ``tempnet.py`` with the
README's inference snippet (logits / tau inside ``generate``, then the chat model's sampling).

- **Network** (:class:`TempNet`): the base's logits, shifted by their maximum and L2-normalised,
  go through Linear(V, h), sigmoid, dropout 0.5, Linear(h, h); a softmax at a learned scale
  weighs the hidden units, and Linear(h, 1) (initialised to weights 1, bias 0) reads the
  weighted deviation from uniform weights; tau = tau_min + (tau_max - tau_min) * sigmoid(.).
  The input is shift- and scale-free: the network sees the *shape* of the base's distribution.
- **One temperature per token** (``per: token``), as the published network
  (``LLaMA-2/megatron/model/tempnet.py``) predicts it: each position's temperature comes from
  the base's logits at that position, in training (every cache row) and in decoding (every
  step's scores). **One per input** (``per: input``, as the paper describes its TempNet and this
  package's first version did): the network reads the base's logits at the prompt's last
  position only (the first row of each pair in the base-output cache; the first step's scores
  when decoding), and that temperature holds for the whole output. Neither needs a base call.
- **Loss** (:func:`tempnet_loss`), per target token with base logits z and label y:
  tau * CE(z / tau, y) + tau * (rho - log V), the KL-constrained DRO loss. With the base frozen,
  tau * CE(z / tau, y) = tau * logsumexp(z / tau) - z_y, so its derivative in tau is
  rho - KL(softmax(z / tau) || uniform), whatever the label: the optimum makes the scaled
  distributions' mean KL from uniform equal rho (their entropy about log V - rho). TempNet so
  learns how sharp the base should be, not which tokens the data prefers. ``rho`` None: plain
  NLL of z / tau instead (temperature scaling), whose optimum calibrates the base to the data.
  Where the base's mean KL from uniform at tau 1 is already near rho, both optima are near 1
  (SmolLM2-135M on E2E hyper-validation: KL 8.8 nats, both optima about 1.05 with rho 8.5), and
  so is the learned temperature; tests/test_tempnet.py shows it learning other optima.
- **Decoding** (:func:`tempnet_generate`): the repetition penalty, then logits / tau, then
  top-k and top-p, then a seeded sample. The published inference divides by tau and hands the
  result to ``generate`` with the released model's ``GenerationConfig``; that file is not public
  in the repository, so we use what the stock LLaMA-2-Chat config gives (sampling, top_p 0.9,
  transformers' default top_k 50). Its temperature 0.6 is the profile's ``temperature``: the
  logits are divided by tau times it (1: the learned tau alone, as the first version). Greedy
  decoding at any positive tau picks the same tokens as the base, so greedy TempNet is Zeroshot
  (``methods.predict`` decodes "TempNet-greedy" as Zeroshot; tests/test_tempnet.py checks the
  equality through this module's processor).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList

from ...core.blackbox import BlackBoxLM
from ...core.combine import temperature_log_probs
from ...core.decode import repetition_penalty_processor
from ...core.cache import BaseOutputCache
from ...core.train import TokenObjective
from ..profile import TempNetSettings


def check_settings(settings: TempNetSettings) -> None:
    """ValueError for a temperature range or sampling setting TempNet cannot use."""
    if not 0 < settings.tau_min < settings.tau_max:
        raise ValueError(f"TempNet needs 0 < tau_min < tau_max, got [{settings.tau_min}, {settings.tau_max}].")
    if settings.hidden_size < 1:
        raise ValueError(f"TempNet's hidden_size must be positive, got {settings.hidden_size}.")
    if not 0 < settings.top_p <= 1 or settings.top_k < 0:
        raise ValueError(f"TempNet samples with 0 < top_p <= 1 and top_k >= 0, got top_p={settings.top_p}, "
                         f"top_k={settings.top_k}.")
    if settings.rho is not None and settings.rho <= 0:
        raise ValueError(f"rho bounds a KL divergence and must be positive (or null: plain NLL), got {settings.rho}.")


class TempNet(nn.Module):
    """Base logits (B, V) -> one temperature per row (B,), in (tau_min, tau_max)."""

    def __init__(self, vocab_size: int, hidden_size: int, tau_min: float, tau_max: float):
        super().__init__()
        self.tau_min, self.tau_max, self.hidden_size = tau_min, tau_max, hidden_size
        self.project = nn.Sequential(
            nn.Linear(vocab_size, hidden_size), nn.Sigmoid(), nn.Dropout(0.5), nn.Linear(hidden_size, hidden_size)
        )
        self.log_scale = nn.Parameter(torch.zeros(()))  # the published `scaler`, log 1
        self.last = nn.Linear(hidden_size, 1)
        nn.init.ones_(self.last.weight)
        nn.init.zeros_(self.last.bias)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        x = logits.float()
        # A token a top-k view rules out (-inf) reads as the least likely one, not as NaN.
        finite = torch.isfinite(x)
        lowest = torch.where(finite, x, torch.inf).amin(-1, keepdim=True)
        x = torch.where(finite, x, lowest)
        x = F.normalize(x - x.amax(-1, keepdim=True), dim=-1)
        hidden = self.project(x)
        weights = torch.softmax(hidden / self.log_scale.exp(), dim=-1)
        z = self.last((weights - 1.0 / self.hidden_size) * hidden).squeeze(-1)
        return self.tau_min + (self.tau_max - self.tau_min) * torch.sigmoid(z)


class FixedTemperature(nn.Module):
    """TempNet's stand-in that gives every row the temperature ``tau``: in ``tempnet_generate``
    (or ``methods.predict(task, "TempNet", ...)``) it samples the base alone exactly as TempNet
    samples, which is the control for TempNet's scores."""

    def __init__(self, tau: float = 1.0):
        super().__init__()
        self.tau = nn.Parameter(torch.tensor(float(tau)), requires_grad=False)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return self.tau.expand(logits.shape[0])


def make_tempnet(vocab_size: int, settings: TempNetSettings, seed: int) -> TempNet:
    check_settings(settings)
    torch.manual_seed(seed)
    return TempNet(vocab_size, settings.hidden_size, settings.tau_min, settings.tau_max)


def tempnet_loss(logits: torch.Tensor, targets: torch.Tensor, tau: torch.Tensor, rho: float | None) -> torch.Tensor:
    """Per-token loss (N,) of logits (N, V) scaled by tau (N,): tau * CE(z / tau, y) +
    tau * (rho - log V), TempNet's KL-constrained DRO loss; rho None: CE(z / tau, y)."""
    nll = -F.log_softmax(logits.float() / tau.unsqueeze(-1), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if rho is None:
        return nll
    return tau * nll + tau * (rho - math.log(logits.shape[-1]))


def first_rows(lengths: Sequence[int], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(index of each pair's first cache row, its target length): rows of pair i follow pair
    i-1's, and a pair's first row is the base's output at its prompt's last position."""
    counts = torch.tensor(list(lengths), device=device)
    return torch.cumsum(counts, 0) - counts, counts


@dataclass
class TempNetObjective(TokenObjective):
    """``tempnet_loss`` summed over a batch's target tokens, each pair's tokens at the
    temperature the network reads from its first cache row. ``rho`` as in ``tempnet_loss``."""

    rho: float | None = None
    per_token: bool = False

    def __post_init__(self):
        if self.cache is None:
            raise ValueError("TempNetObjective reads the base's outputs from a BaseOutputCache: pass cache=...")
        super().__post_init__()

    def check_model(self, model: TempNet) -> None:
        width, vocab = model.project[0].in_features, self.cache.vocab_size
        if width != vocab:
            raise ValueError(f"TempNet reads {width} logits per token but the base scores {vocab} tokens: "
                             "make it with make_tempnet(base.vocab_size, ...).")

    def batch(self, indices, device: torch.device) -> dict:
        chosen = [self.pairs[i] for i in indices]
        # The row for target token t of a pair is the base's output just before it.
        targets = torch.tensor([t for p in chosen for t in p.input_ids[p.prompt_length :]], device=device)
        first, counts = first_rows([p.target_length for p in chosen], device)
        return {"base": self.cache.get(indices).to(device).float(), "targets": targets, "first": first,
                "counts": counts}

    def batch_nll(self, model: TempNet, batch: dict):
        base = batch["base"]
        if self.per_token:
            tau = model(base)  # each target token at the temperature of the row before it
        else:
            tau = model(base[batch["first"]]).repeat_interleave(batch["counts"])
        return tempnet_loss(base, batch["targets"], tau, self.rho).sum(), batch["targets"].numel()


@torch.no_grad()
def cache_temperatures(model: TempNet, cache: BaseOutputCache, batch_size: int = 64) -> torch.Tensor:
    """The temperature the network gives each pair of a base-output cache (eval mode)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    first = [int(i) for i in cache.offsets[:-1]]
    out = []
    for start in range(0, len(first), batch_size):
        rows = cache.get_rows(first[start : start + batch_size])  # a copy, memory-mapped or not
        out.append(model(rows.to(device)).cpu())
    model.train(was_training)
    return torch.cat(out)


class TempNetLogitsProcessor(LogitsProcessor):
    """Inside ``generate``: each row's temperature comes from the base's scores, at every step
    (``per_token``) or at the first one (the prompt's last position) for the whole output; every
    step applies the repetition penalty, then divides by that temperature times ``temperature``
    (the generation config's own). ``temperatures``: per row, the mean of its steps'."""

    def __init__(self, model: TempNet, repetition_penalty: float | None, *, per_token: bool = False,
                 temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"The generation temperature must be positive, got {temperature}.")
        self.model = model.eval()
        self.repetition_penalty = repetition_penalty
        self.per_token, self.temperature = per_token, temperature
        self._tau: torch.Tensor | None = None
        self._sum: torch.Tensor | None = None
        self._steps = 0
        self._penalty = None

    @property
    def temperatures(self) -> torch.Tensor | None:
        return None if self._sum is None else self._sum / self._steps

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._tau is None or self.per_token:
            device = next(self.model.parameters()).device
            self._tau = self.model(scores.to(device)).to(scores.device)
        if self._penalty is None:
            self._penalty = repetition_penalty_processor(self.repetition_penalty, input_ids.shape[1]) or (lambda i, s: s)
        self._sum = self._tau.float() if self._sum is None else self._sum + self._tau.float()
        self._steps += 1
        return temperature_log_probs(self._penalty(input_ids, scores), self._tau * self.temperature)


def tempnet_generate(
    base: BlackBoxLM,
    prompts: Sequence[str],
    model: TempNet,
    *,
    seed: int,
    do_sample: bool = True,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    repetition_penalty: float | None = None,
    max_prompt_tokens: int | None = None,
    per_token: bool = False,
    temperature: float = 1.0,
    progress: bool = True,
) -> tuple[list[str], list[float]]:
    """(texts, temperatures) for ``prompts``: each sampled from the base's penalised logits
    divided by TempNet's temperature (per token or per input) times ``temperature``, after
    top-k and top-p (``do_sample`` False: greedy). Temperatures: each output's mean of TempNet's.

    Batch b (prompts ``b * batch_size`` on) samples with torch's generator seeded by
    ``seed`` and b, so a seed gives the same texts on every call.
    """
    tokenizer = base.tokenizer
    texts: list[str] = []
    temperatures: list[float] = []
    starts = range(0, len(prompts), batch_size)
    for start in tqdm(starts, desc="generate", disable=not progress or len(starts) < 2):
        enc = tokenizer(
            list(prompts[start : start + batch_size]),
            return_tensors="pt",
            padding=True,
            truncation=max_prompt_tokens is not None,
            max_length=max_prompt_tokens,
        )
        processor = TempNetLogitsProcessor(model, repetition_penalty, per_token=per_token, temperature=temperature)
        sampling = dict(do_sample=True, temperature=1.0, top_p=top_p, top_k=top_k) if do_sample else dict(do_sample=False)
        torch.manual_seed(seed * 1_000_003 + start)
        out = base.generate(
            enc.input_ids,
            enc.attention_mask,
            logits_processor=LogitsProcessorList([processor]),
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=base.eos_token_id,
            **sampling,
        )
        decoded = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        texts += [t.strip() for t in decoded]
        temperatures += processor.temperatures.float().cpu().tolist()
    return texts, temperatures
