import errno
import math
import os
import shutil

import numpy as np
import pytest
import torch

from plugin_lib.core.loss import plugin_loss
from plugin_lib.core.reweighter import make_reweighter, reweighter_logits
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import collate, encode_pairs
from plugin_lib.core.train import TokenObjective, TrainConfig, fit, small_model_log_probs

from conftest import killed_at_validation

PROMPTS = [f"Describe item {i}: colour {c}, size {s}." for i, (c, s) in
           enumerate([("red", "small"), ("blue", "large"), ("green", "medium"), ("black", "tiny")] * 3)]
TARGETS = [f"A {s} {c} item, number {i}." for i, (c, s) in
           enumerate([("red", "small"), ("blue", "large"), ("green", "medium"), ("black", "tiny")] * 3)]


@pytest.fixture
def pairs(tokenizer):
    return encode_pairs(tokenizer, PROMPTS, TARGETS)


def test_encoding_truncates_and_appends_eos(tokenizer):
    long_prompt = "word " * 300
    long_target = "token " * 300
    (pair,) = encode_pairs(tokenizer, [long_prompt + "END"], [long_target], max_prompt_tokens=128, max_target_tokens=127)
    assert pair.prompt_length == 128 and pair.target_length == 128
    assert pair.input_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(pair.input_ids[:128]).endswith("END")  # the prompt keeps its end
    with pytest.raises(ValueError):
        encode_pairs(tokenizer, ["a"], ["b", "c"])


def test_collate_left_pads_and_masks_everything_but_targets(tokenizer, pairs):
    batch = collate(pairs[:2], tokenizer.pad_token_id)
    for row, pair in enumerate(pairs[:2]):
        n, pad = len(pair.input_ids), batch["input_ids"].shape[1] - len(pair.input_ids)
        assert batch["attention_mask"][row].tolist() == [0] * pad + [1] * n
        labels = batch["labels"][row].tolist()
        assert labels[: pad + pair.prompt_length] == [-100] * (pad + pair.prompt_length)
        assert labels[pad + pair.prompt_length :] == list(pair.input_ids[pair.prompt_length :])


def test_cached_base_outputs_give_the_recomputed_loss(tiny_base, small_reweighter, tokenizer, pairs):
    rw = small_reweighter("llama")
    cache = BaseOutputCache.build(tiny_base, pairs, batch_size=5, progress=False)
    assert cache.rows.shape == (sum(p.target_length for p in pairs), tiny_base.vocab_size)
    objective = TokenObjective(pairs, tokenizer.pad_token_id, cache=cache)
    idx = [3, 0, 7]
    with torch.no_grad():
        loss_sum, n = objective.nll(rw, idx)
        batch = collate([pairs[i] for i in idx], tokenizer.pad_token_id)
        base = tiny_base.logits(batch["input_ids"], batch["attention_mask"])
        small = reweighter_logits(rw, batch["input_ids"], batch["attention_mask"])
        recomputed = plugin_loss(base, small, batch["labels"])
    assert n == sum(pairs[i].target_length for i in idx)
    torch.testing.assert_close(loss_sum / n, recomputed, rtol=1e-5, atol=1e-6)


def test_disk_cache_is_reused_and_memory_is_bounded(tiny_base, pairs, tmp_path, monkeypatch):
    built = BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, progress=False)
    assert isinstance(built.rows, np.memmap) or isinstance(built.rows, np.ndarray)
    assert len(list(tmp_path.glob("base-*.npy"))) == 1 and not list(tmp_path.glob(".*partial"))
    in_memory = BaseOutputCache.build(tiny_base, pairs, progress=False)
    torch.testing.assert_close(built.get([2, 5]), in_memory.get([2, 5]))

    def no_base_calls(*args, **kwargs):
        raise AssertionError("the base model ran although its outputs were on disk")

    monkeypatch.setattr(tiny_base, "logits", no_base_calls)
    reused = BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, progress=False)
    torch.testing.assert_close(reused.get([1]), in_memory.get([1]))
    with pytest.raises(MemoryError, match="directory="):
        BaseOutputCache.build(tiny_base, pairs, max_memory_gb=1e-6, progress=False)



def _no_base_calls(*args, **kwargs):
    raise AssertionError("the base ran although the cache could not be stored")


def test_a_full_disk_fails_before_the_cache_is_written_and_leaves_nothing(tiny_base, pairs, tmp_path, monkeypatch):
    # On a full disk, writes into the memory-mapped file would kill the process (SIGBUS).
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    monkeypatch.setattr(tiny_base, "logits", _no_base_calls)
    advice = rf"(?s)MiB on disk in {tmp_path} .*No space left.*MiB free.*PLUGIN_RESULTS_DIR"
    with pytest.raises(OSError, match=advice) as info:
        BaseOutputCache.build(tiny_base, pairs, directory=tmp_path, progress=False)
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # no .partial orphan, no final file


@pytest.mark.parametrize("fallocate", ["unsupported", "absent"])
def test_without_fallocate_the_free_space_is_checked(tiny_base, pairs, tmp_path, monkeypatch, fallocate):
    if fallocate == "absent":
        monkeypatch.delattr(os, "posix_fallocate", raising=False)
    else:
        def unsupported(fd, offset, length):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")

        monkeypatch.setattr(os, "posix_fallocate", unsupported, raising=False)
    reference = BaseOutputCache.build(tiny_base, pairs, progress=False)
    built = BaseOutputCache.build(tiny_base, pairs, directory=tmp_path / "roomy", progress=False)
    torch.testing.assert_close(built.get([0, 3]), reference.get([0, 3]))

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    monkeypatch.setattr(tiny_base, "logits", _no_base_calls)
    with pytest.raises(OSError, match=r"not enough free space; 0\.0 MiB free"):
        BaseOutputCache.build(tiny_base, pairs, directory=tmp_path / "full", progress=False)
    assert list((tmp_path / "full").iterdir()) == []

def _objectives(tiny_base, tokenizer, pairs):
    train, val = pairs[:8], pairs[8:]
    return tuple(
        TokenObjective(part, tokenizer.pad_token_id, cache=BaseOutputCache.build(tiny_base, part, progress=False))
        for part in (train, val)
    )


def test_fit_trains_only_the_reweighting_model(tiny_base, small_reweighter, tokenizer, pairs):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    rw = small_reweighter("llama")
    before_rw = {k: v.clone() for k, v in rw.state_dict().items()}
    before_base = {k: v.clone() for k, v in tiny_base._model.state_dict().items()}
    start_loss = val.mean_nll(rw)
    result = fit(rw, train, val, TrainConfig(lr=5e-3, max_epochs=4, patience=10, batch_size=4), progress=False)
    assert result.best_val_loss < start_loss
    assert any(not torch.equal(before_rw[k], v) for k, v in rw.state_dict().items())
    assert all(torch.equal(before_base[k], v) for k, v in tiny_base._model.state_dict().items())
    assert all(p.grad is None for p in tiny_base._model.parameters())


def test_fit_is_deterministic_and_restores_the_best_epoch(tiny_base, small_reweighter, tokenizer, pairs):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    cfg = TrainConfig(lr=2e-2, max_epochs=6, patience=2, batch_size=4, seed=5)
    runs = []
    for _ in range(2):
        rw = small_reweighter("llama", seed=1)
        runs.append((fit(rw, train, val, cfg, progress=False), rw.state_dict()))
    (a, state_a), (b, state_b) = runs
    assert a.history == b.history
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    losses = [h["val_loss"] for h in a.history]
    assert a.best_epoch == 1 + int(np.argmin(losses)) and a.best_val_loss == min(losses)
    rw = small_reweighter("llama", seed=1)
    rw.load_state_dict(state_a)
    assert math.isclose(val.mean_nll(rw), a.best_val_loss, rel_tol=1e-6)
    assert a.epochs_run <= cfg.max_epochs


def test_learning_rate_schedule_is_counted_in_optimizer_steps(tiny_base, small_reweighter, tokenizer, pairs):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    cfg = TrainConfig(lr=1e-3, max_epochs=10, patience=100, batch_size=4, warmup_ratio=0.1)
    result = fit(small_reweighter("linear"), train, val, cfg, progress=False)
    # 8 pairs / batch 4 = 2 steps per epoch, 20 steps in all, 2 warmup steps: the peak is reached
    # after epoch 1, then the rate decays linearly to 0 at step 20.
    assert result.optimizer_steps == 20
    lrs = [h["lr"] for h in result.history]
    assert lrs[0] == pytest.approx(1e-3)
    assert lrs[1] == pytest.approx(1e-3 * 16 / 18)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_new_model_objective_needs_no_base(small_reweighter, tokenizer, pairs):
    objective = TokenObjective(pairs, tokenizer.pad_token_id, log_probs=small_model_log_probs)
    loss, n = objective.nll(small_reweighter("llama"), [0, 1])
    assert torch.isfinite(loss) and n == pairs[0].target_length + pairs[1].target_length


def test_fit_checks_the_vocabulary_before_training(tiny_base, tokenizer, pairs):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    cfg = TrainConfig(max_epochs=1)
    with pytest.raises(ValueError, match=r"Vocabulary mismatch.*plugin_lib\.make_reweighter"):
        fit(make_reweighter("linear", 64, hidden_size=8), train, val, cfg, progress=False)
    # Without a base (NewModel), the model must still cover every token id of the pairs.
    alone = [TokenObjective(part, tokenizer.pad_token_id, log_probs=small_model_log_probs)
             for part in (pairs[:8], pairs[8:])]
    largest = max(max(p.input_ids) for p in pairs)
    with pytest.raises(ValueError, match=rf"Token id {largest} is outside .* 64 tokens.*plugin_lib\.make_reweighter"):
        fit(make_reweighter("linear", 64, hidden_size=8), *alone, cfg, progress=False)


class Killed(Exception):
    """Stands for a process killed mid-training."""


def _dropout_reweighter(small_reweighter):
    model = small_reweighter("llama", seed=1)
    for layer in model.model.layers:  # dropout draws from the global generator: its state must come back too
        layer.self_attn.attention_dropout = 0.3
    return model


def test_an_interrupted_fit_resumes_from_its_checkpoint_to_the_same_model(
        tiny_base, small_reweighter, tokenizer, pairs, tmp_path):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    cfg = TrainConfig(lr=2e-2, max_epochs=6, patience=10, batch_size=4, seed=5)
    whole_model = _dropout_reweighter(small_reweighter)
    whole = fit(whole_model, train, val, cfg, progress=False)
    path = tmp_path / "partial" / "fit.pt"
    with killed_at_validation(4, Killed), pytest.raises(Killed):
        fit(_dropout_reweighter(small_reweighter), train, val, cfg, progress=False, checkpoint=path,
            checkpoint_every_s=0)
    assert path.exists()  # written after epochs 1-3
    torch.manual_seed(12345)  # a new process: the global generator is elsewhere
    resumed_model = _dropout_reweighter(small_reweighter)
    resumed = fit(resumed_model, train, val, cfg, progress=False, checkpoint=path, checkpoint_every_s=0)
    assert resumed.history == whole.history and len(whole.history) == 6
    assert (resumed.best_epoch, resumed.best_val_loss, resumed.optimizer_steps) == (
        whole.best_epoch, whole.best_val_loss, whole.optimizer_steps)
    assert all(torch.equal(v, whole_model.state_dict()[k]) for k, v in resumed_model.state_dict().items())
    assert not path.exists()  # removed once training ends


class ScriptedValidation:
    """A validation objective whose losses follow ``losses[start:]``; it raises ``Killed`` at
    the validation number ``kill_at`` (1-based, counted from ``start``)."""

    def __init__(self, real: TokenObjective, losses, start: int = 0, kill_at: int | None = None):
        self.real, self.losses, self.next, self.kill_at, self.calls = real, list(losses), start, kill_at, 0

    def __len__(self):
        return len(self.real)

    def check_model(self, model):
        self.real.check_model(model)

    def mean_nll(self, model):
        self.calls += 1
        if self.calls == self.kill_at:
            raise Killed
        self.next += 1
        return self.losses[self.next - 1]


def test_a_resumed_fit_keeps_the_best_epoch_and_the_patience_count_of_before_the_kill(
        tiny_base, small_reweighter, tokenizer, pairs, tmp_path):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    losses = [3.0, 2.0, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0]  # the best at epoch 2, then worse: stops after epoch 5
    cfg = TrainConfig(lr=2e-2, max_epochs=8, patience=3, batch_size=4, seed=5)
    whole_model = small_reweighter("llama", seed=1)
    whole = fit(whole_model, train, ScriptedValidation(val, losses), cfg, progress=False)
    assert (whole.best_epoch, whole.epochs_run) == (2, 5)
    path = tmp_path / "fit.pt"
    with pytest.raises(Killed):  # killed in epoch 4: the checkpoint holds epochs 1-3 (best 2, one stale)
        fit(small_reweighter("llama", seed=1), train, ScriptedValidation(val, losses, kill_at=4), cfg,
            progress=False, checkpoint=path, checkpoint_every_s=0)
    resumed_model = small_reweighter("llama", seed=1)
    resumed = fit(resumed_model, train, ScriptedValidation(val, losses, start=3), cfg, progress=False,
                  checkpoint=path, checkpoint_every_s=0)
    assert (resumed.best_epoch, resumed.best_val_loss, resumed.epochs_run) == (2, 2.0, 5)
    assert resumed.history == whole.history
    assert all(torch.equal(v, whole_model.state_dict()[k]) for k, v in resumed_model.state_dict().items())


def test_a_kept_checkpoint_returns_the_finished_training_without_training_again(
        tiny_base, small_reweighter, tokenizer, pairs, tmp_path, monkeypatch):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    cfg = TrainConfig(lr=2e-2, max_epochs=3, patience=10, batch_size=4, seed=5)
    path = tmp_path / "fit.pt"
    first_model = small_reweighter("llama", seed=1)
    first = fit(first_model, train, val, cfg, progress=False, checkpoint=path, keep_checkpoint=True)
    assert path.exists()  # the finished result, until the caller has stored its own
    monkeypatch.setattr(TokenObjective, "nll", lambda *a, **k: pytest.fail("trained again"))
    again_model = small_reweighter("llama", seed=2)
    again = fit(again_model, train, val, cfg, progress=False, checkpoint=path)
    assert again == first
    assert all(torch.equal(v, first_model.state_dict()[k]) for k, v in again_model.state_dict().items())


def test_a_checkpoint_of_another_configuration_or_a_damaged_one_is_not_resumed(
        tiny_base, small_reweighter, tokenizer, pairs, tmp_path):
    train, val = _objectives(tiny_base, tokenizer, pairs)
    path = tmp_path / "fit.pt"
    other = TrainConfig(lr=5e-3, max_epochs=3, patience=10, batch_size=4, seed=5)
    fit(small_reweighter("llama", seed=1), train, val, other, progress=False, checkpoint=path, keep_checkpoint=True)
    cfg = TrainConfig(lr=2e-2, max_epochs=3, patience=10, batch_size=4, seed=5)
    fresh = fit(small_reweighter("llama", seed=1), train, val, cfg, progress=False)
    assert fit(small_reweighter("llama", seed=1), train, val, cfg, progress=False, checkpoint=path).history == fresh.history
    path.write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="cannot be read"):
        again = fit(small_reweighter("llama", seed=1), train, val, cfg, progress=False, checkpoint=path)
    assert again.history == fresh.history and not path.exists()
