"""The training step's host work: no synchronization per step, bf16 through MasterAdamW (the model
in bf16, fp32 masters in the optimizer) with exact resume, the logged gradient norm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kerple.checkpoint import safe_torch_load
from kerple.measure.host_work import count_host_work, counted_device_waits
from kerple.training.master_adamw import MasterAdamW
from kerple.training.trainer import Trainer
from tiny_run import corpus, parallel, tiny_config, train  # noqa: F401  (fixtures)

BF16 = {"bf16": {"enabled": True}}


def profiled_step(trainer: Trainer):
    """One step under the profiler, with the device synchronizations that DeepSpeed asks its accelerator
    for counted (on a CPU they are no-ops the profiler cannot see; on a GPU each drains the queue)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # the optimizer's moments exist from here on; DeepSpeed times from its second step
        trainer.train_step()
    with profile(activities=[ProfilerActivity.CPU]) as prof, counted_device_waits() as waits:
        loss = trainer.train_step()
    return loss, count_host_work(prof.events(), steps=1), len(waits)


def test_a_step_does_not_wait_for_the_device(parallel, corpus: Path) -> None:  # noqa: F811
    """fp32 and bf16, ZeRO 0, with gradient clipping and two micro-batches: the loss comes back as a
    device tensor, nothing in the step reads a tensor on the host, and DeepSpeed synchronizes no device
    (its throughput timer did, twice per micro-batch)."""
    for precision in ({}, BF16):
        cfg = tiny_config(corpus, train_iters=4, gradient_accumulation_steps=2, **precision).resolve_batch(1)
        trainer = Trainer(cfg, parallel)
        try:
            loss, counts, waits = profiled_step(trainer)
        finally:
            trainer.close()
        assert isinstance(loss, torch.Tensor) and loss.shape == () and loss.dtype == torch.float32
        assert counts.syncs == 0, (precision, [op for op, _ in counts.top])
        assert waits == 0, precision


def test_bf16_trains_fp32_masters_and_resumes_exactly(parallel, corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    common = dict(lr_decay_iters=8, **BF16)
    cfg = tiny_config(corpus, train_iters=1, **common).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    try:
        assert isinstance(trainer.optimizer, MasterAdamW)
        assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
        assert {m.dtype for group in trainer.optimizer.param_groups for m in group["params"]} == {torch.float32}
    finally:
        trainer.close()

    straight = train(tiny_config(corpus, train_iters=8, **common), parallel)
    save = tmp_path / "ck"
    first = train(tiny_config(corpus, train_iters=4, save=str(save), **common), parallel)
    second = train(tiny_config(corpus, train_iters=8, save=str(save), load=str(save), **common), parallel)
    assert [loss for _, loss in first.losses + second.losses] == [loss for _, loss in straight.losses]
    assert straight.losses[-1][1] < straight.losses[0][1]

    step4 = save / "global_step4"
    layer = safe_torch_load(step4 / "layer_02-model_00-model_states.pt")
    assert layer["attention.query_key_value.weight"].dtype == torch.bfloat16  # the layer files stay bf16
    optimizer = safe_torch_load(step4 / "mp_rank_00_model_states.pt")["optimizer"]
    masters = [m for group in optimizer["fp32_groups"] for m in group]
    assert {m.dtype for m in masters} == {torch.float32}
    rounded = [m for m in masters if m.shape == layer["attention.query_key_value.weight"].shape]
    assert any(torch.equal(m.to(torch.bfloat16), layer["attention.query_key_value.weight"]) for m in rounded)


def test_logged_gradient_norm_is_the_clipping_norm(parallel, corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    """The metrics' grad_norm is the global norm of the step's gradients before clipping, computed
    here independently from the gradients a hook sees."""
    cfg = tiny_config(corpus, train_iters=2, log_interval=1, log_dir=str(tmp_path / "logs")).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    seen: list[torch.Tensor] = []
    step = trainer.optimizer.step

    def recording_step(closure=None):
        seen.append(torch.cat([p.grad.flatten() for group in trainer.optimizer.param_groups
                               for p in group["params"] if p.grad is not None]).norm())
        return step(closure)

    trainer.optimizer.step = recording_step
    try:
        trainer.train()
    finally:
        trainer.close()
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    norms = [record["train/grad_norm"] for record in logged if "train/grad_norm" in record]
    assert norms == pytest.approx([float(value) for value in seen], rel=1e-6) and len(norms) == 2


def test_a_step_walks_the_modules_only_to_leave_evaluation_mode(parallel, corpus: Path,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``train()`` visits every module (a quarter of a millisecond of host time per step at 162M's depth): a step calls
    it only when validation left the model in evaluation mode, and then every module trains again."""
    cfg = tiny_config(corpus, train_iters=4).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    try:
        calls = []
        original = type(trainer.engine).train
        monkeypatch.setattr(type(trainer.engine), "train", lambda self, mode=True: calls.append(mode) or original(self, mode))
        trainer.train_step()
        trainer.train_step()
        assert calls == [] or calls == [True]  # the engine may start in evaluation mode once
        calls.clear()
        trainer.engine.eval()
        trainer.train_step()
        assert calls == [True] and all(module.training for module in trainer.engine.modules())
    finally:
        trainer.close()


def test_a_cuda_batch_is_copied_from_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy from pageable memory may wait for the device's queue (CUDA's rules for cudaMemcpyAsync):
    the feed pins the batch and queues the copy. Seen on a CPU through stand-ins for the two calls."""
    from kerple.training.batches import to_device

    seen: list[tuple[str, object]] = []

    class Pinned:
        def to(self, device: torch.device, non_blocking: bool = False) -> str:
            seen.append(("to", (device.type, non_blocking)))
            return "on the device"

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: seen.append(("pin", tuple(self.shape))) or Pinned())
    host = torch.arange(6).reshape(2, 3)
    assert to_device(host, torch.device("cuda")) == "on the device"
    assert seen == [("pin", (2, 3)), ("to", ("cuda", True))]
    assert to_device(host, torch.device("cpu")) is host and len(seen) == 2  # nothing to pin on a CPU


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_feed_gives_next_token_labels_with_eod_masked(device: str) -> None:
    """Labels are the tokens shifted by one; with ``eod_mask_loss`` the label after an EOD (id 9) is
    ignored (-100), as in the reference; the same on a CUDA device, where the batch is pinned first."""
    from kerple.training.batches import BatchFeed

    samples = [{"text": [1, 2, 9, 3, 4]}, {"text": [5, 9, 6, 7, 8]}]
    feed = BatchFeed(samples, micro_batch_size=2, accumulation_steps=1, data_parallel_size=1, data_parallel_rank=0,
                     device=torch.device(device), eod_token=9)
    tokens, labels = feed.micro_batch(0, 0)
    assert tokens.device.type == device and tokens.dtype == labels.dtype == torch.int64
    assert tokens.tolist() == [[1, 2, 9, 3], [5, 9, 6, 7]]
    assert labels.tolist() == [[2, 9, -100, 4], [9, -100, 7, 8]]


def test_host_milliseconds_is_the_median_of_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step times of 5, 1 and 2 ms (a fake clock) give 2 ms: the median, not the mean (2.67) or the first."""
    from kerple.measure import host_work

    clock = iter([0.0, 0.005, 1.0, 1.001, 2.0, 2.002])
    monkeypatch.setattr(host_work.time, "perf_counter", lambda: next(clock))

    class Stepper:
        calls = 0

        def train_step(self) -> None:
            self.calls += 1

    stepper = Stepper()
    assert host_work.host_milliseconds(stepper, 3) == pytest.approx(2.0) and stepper.calls == 3
