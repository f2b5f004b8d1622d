"""kerple.measure.peak_memory against hand-counted allocations: the peak of an event sequence and
what held it, the CPU profiler's events named by kerple's frame and operator, the CUDA history's
format, and the bytes a step starts with."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from kerple.measure.peak_memory import cpu_events, cuda_events, live_at_peak, resident_bytes

MIB = 2**20


def test_the_peak_is_the_most_held_at_once_and_names_its_holders() -> None:
    events = [(1, 4 * MIB, "a"), (2, 2 * MIB, "b"), (1, -4 * MIB, ""), (3, 3 * MIB, "a"), (4, 2 * MIB, "c"),
              (9, -7 * MIB, ""),  # freed, but allocated before the events began: not the step's
              (2, -2 * MIB, ""), (5, 6 * MIB, "d")]
    peak = live_at_peak(events)
    assert peak.bytes == 11 * MIB  # d 6 + a 3 + c 2; subtracting the unknown free would have left 7 (a, b, c)
    assert peak.holders == [("d", 6 * MIB, 1), ("a", 3 * MIB, 1), ("c", 2 * MIB, 1)]


def test_a_later_higher_peak_replaces_an_earlier_one() -> None:
    events = [(1, 5 * MIB, "x"), (1, -5 * MIB, ""), (2, 1 * MIB, "y"), (3, 1 * MIB, "y"), (4, 4 * MIB, "z")]
    peak = live_at_peak(events)
    assert peak.bytes == 6 * MIB
    assert peak.holders == [("z", 4 * MIB, 1), ("y", 2 * MIB, 2)]


def test_the_cpu_profile_names_kerples_frame_and_the_operator_it_called() -> None:
    """One chunk of the fused loss (``chunk_terms``) in bf16: its peak is the fp32 copy of the logits
    (``.float()``) beside the bf16 gradient (``.to``), 6 bytes per logit, both made by that function."""
    from kerple.model.lm_loss import chunk_terms

    logits = torch.randn(64, 1000).to(torch.bfloat16)
    target, share = torch.zeros(64, 1, dtype=torch.long), torch.full((64, 1), 1 / 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as profiler:
        chunk_terms(logits, target, share)
    peak = live_at_peak(cpu_events(profiler))
    where, size, count = peak.holders[0]
    assert where.startswith("model/lm_loss.py:") and where.endswith("chunk_terms aten::to")
    assert (size, count) == (6 * 64 * 1000, 2)


def test_the_cuda_history_gives_allocations_and_completed_frees_named_by_kerples_frame() -> None:
    """The entries of ``torch.cuda.memory._snapshot()['device_traces']`` (innermost frame first)."""
    frames = [{"filename": "/x/torch/nn/functional.py", "line": 9, "name": "linear"},
              {"filename": "/repo/kerple/model/mlp.py", "line": 30, "name": "forward"},
              {"filename": "/repo/kerple/training/trainer.py", "line": 200, "name": "train_step"}]
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "addr": 0, "size": 2 * MIB, "frames": frames},
        {"action": "alloc", "addr": 16, "size": MIB, "frames": frames},
        {"action": "free_requested", "addr": 16, "size": MIB, "frames": frames},
        {"action": "free_completed", "addr": 16, "size": MIB, "frames": frames},
        {"action": "alloc", "addr": 32, "size": 8, "frames": frames[:1]},
    ]]}
    assert list(cuda_events(snapshot)) == [(16, MIB, "model/mlp.py:30 forward"), (16, -MIB, ""), (32, 8, "?")]


def test_resident_bytes_count_parameters_gradients_and_optimizer_state_once() -> None:
    model = torch.nn.Linear(10, 5)  # 55 parameters
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 10)).sum().backward()
    assert resident_bytes(model, None) == 2 * 55 * 4  # parameters and gradients
    optimizer.step()
    steps = 2 * optimizer.state[model.weight]["step"].untyped_storage().nbytes()  # one step count per parameter
    assert resident_bytes(model, optimizer) == 4 * 55 * 4 + steps  # and exp_avg, exp_avg_sq
