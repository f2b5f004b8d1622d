"""MasterAdamW against independent references: torch's single-tensor AdamW after torch's
``clip_grad_norm_`` on fp32 copies of the gradients; the tensor-parallel counting rule; DeepSpeed's
unfused bf16 optimizer's state-dict layout, both ways; no host synchronization in a step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kerple.measure.host_work import count_host_work
from kerple.training.master_adamw import MasterAdamW
from tiny_run import parallel  # noqa: F401  (fixture)

HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def groups(module: nn.Module) -> list[dict]:
    params = list(module.parameters())
    return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]


def set_grads(module: nn.Module, seed: int, scale: float) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    grads = []
    for p in module.parameters():
        p.grad = (torch.randn(p.shape, generator=generator) * scale).to(p.dtype)
        grads.append(p.grad.float())
    return grads


def reference_steps(start: nn.Module, grads_per_step: list[list[torch.Tensor]], max_norm: float) -> tuple[nn.Module, list[float]]:
    """torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW (single-tensor), on fp32 parameters."""
    reference = copy.deepcopy(start).float()
    optimizer = torch.optim.AdamW(groups(reference), foreach=False, **HYPER)
    norms = []
    for grads in grads_per_step:
        for p, g in zip(reference.parameters(), grads):
            p.grad = g.clone()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(reference.parameters()), max_norm, foreach=False)))
        optimizer.step()
    return reference, norms


@pytest.mark.parametrize("max_norm", [0.05, 100.0])  # clipping active / inactive
def test_fp32_steps_equal_clip_then_adamw(max_norm: float) -> None:
    start, trained = model(), model()
    optimizer = MasterAdamW(groups(trained), max_norm=max_norm, **HYPER)
    steps = [set_grads(trained, seed, 0.3) for seed in range(3)]
    norms = []
    for grads in steps:
        for p, g in zip(trained.parameters(), grads):
            p.grad = g.clone()
        optimizer.step()
        norms.append(float(optimizer._global_grad_norm))
    reference, reference_norms = reference_steps(start, steps, max_norm)
    assert norms == pytest.approx(reference_norms, rel=1e-6)
    for p, q in zip(trained.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_bf16_keeps_fp32_masters_and_rounds_them_into_the_model() -> None:
    start, trained = model(), model()
    optimizer = MasterAdamW(groups(trained), dtype=torch.bfloat16, max_norm=0.05, **HYPER)
    assert all(p.dtype == torch.bfloat16 for p in trained.parameters())
    masters = [m for group in optimizer.param_groups for m in group["params"]]
    assert all(m.dtype == torch.float32 for m in masters)
    assert all(torch.equal(m, p) for m, p in zip(masters, start.parameters()))  # exact fp32 start
    steps = [set_grads(trained, seed, 0.3) for seed in range(2)]  # bf16 gradients, kept in fp32 for the reference
    for grads in steps:
        for p, g in zip(trained.parameters(), grads):
            p.grad = g.to(torch.bfloat16)
        optimizer.step()
        assert all(m.grad is None for m in masters)  # the fp32 gradients are not kept into the next forward
    reference, _ = reference_steps(start, steps, 0.05)
    for p, m, q in zip(trained.parameters(), masters, reference.parameters()):
        torch.testing.assert_close(m, q, rtol=1e-6, atol=1e-7)
        assert torch.equal(p, m.to(torch.bfloat16))


def test_replicated_parameters_count_on_the_first_tensor_parallel_rank_only() -> None:
    norms = {}
    for rank in (0, 1):
        trained = model()
        trained[0].weight.tensor_model_parallel = True  # what megatron-core marks on a split weight
        grads = set_grads(trained, 0, 1.0)
        optimizer = MasterAdamW(groups(trained), model_parallel_rank=rank, **HYPER)
        optimizer.step()
        norms[rank] = optimizer._global_grad_norm
    torch.testing.assert_close(norms[1], grads[0].norm())  # the split weight alone
    torch.testing.assert_close(norms[0], torch.cat([g.flatten() for g in grads]).norm())


def test_state_dict_is_deepspeeds_unfused_bf16_layout_both_ways(parallel) -> None:  # noqa: F811
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    ours_model = model()
    ours = MasterAdamW(groups(ours_model), dtype=torch.bfloat16, **HYPER)
    set_grads(ours_model, 1, 0.3)
    ours.step()
    saved = ours.state_dict()
    assert {"optimizer_state_dict", "fp32_groups", "cur_scale", "dynamic_loss_scale"} <= set(saved)

    theirs_model = model(seed=5).to(torch.bfloat16)
    theirs = FP16_UnfusedOptimizer(torch.optim.AdamW(groups(theirs_model), **HYPER), low_precision_dtype=torch.bfloat16)
    theirs.load_state_dict(copy.deepcopy(saved))
    for ours_group, their_group in zip(ours.param_groups, theirs.fp32_groups):
        assert all(torch.equal(m, t) for m, t in zip(ours_group["params"], their_group))

    again_model = model(seed=7)
    again = MasterAdamW(groups(again_model), dtype=torch.bfloat16, **HYPER)
    again.load_state_dict(theirs.state_dict())
    for p, q in zip(again_model.parameters(), ours_model.parameters()):
        assert torch.equal(p, q)  # masters restored and rounded into the model
    assert again.state_dict()["optimizer_state_dict"]["state"][0]["step"] == 1


def test_a_step_waits_for_nothing() -> None:
    from torch.profiler import ProfilerActivity, profile

    trained = model()
    optimizer = MasterAdamW(groups(trained), dtype=torch.bfloat16, max_norm=0.05, **HYPER)
    set_grads(trained, 0, 1.0)
    optimizer.step()  # the first step allocates the moments and the masters' gradients
    set_grads(trained, 1, 1.0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        optimizer.step()
    counts = count_host_work(prof.events(), steps=1)
    assert counts.syncs == 0
    assert counts.ops < 20  # a handful of foreach/fused kernels, not a dozen per parameter


def test_a_model_moved_after_the_masters_were_made_is_refused() -> None:
    """The masters are made where the parameters are; the trainer moves the model first. A model
    moved later (here to the meta device, as ``module.to("cuda")`` moves a parameter: the same
    object, elsewhere) would be updated elsewhere: the first step says so."""
    trained = model()
    optimizer = MasterAdamW(groups(trained), dtype=torch.bfloat16, **HYPER)
    for parameter in trained.parameters():
        torch.utils.swap_tensors(parameter, nn.Parameter(parameter.detach().to("meta")))
    with pytest.raises(ValueError, match="move the model to its device before building MasterAdamW"):
        optimizer.step()
