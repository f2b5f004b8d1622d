"""The model hands FlexAttention the embedding's closed form (or its tables), and the fused CPU
kernel (compiled, forward only) computes the same logits as eager with either."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from kerple.model import flex_base
from model_helpers import VOCAB, tiny_model


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm())


def _kinds_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    kinds: list[str] = []
    attend = flex_base.FlexKernel.attend

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kinds.append(kwargs.get("kind", args[6] if len(args) > 6 else "none"))
        return attend(self, *args, **kwargs)

    monkeypatch.setattr(flex_base.FlexKernel, "attend", spy)
    return kinds


@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "sandwich_smoothed", "rpe"])
def test_closed_form_and_table_paths_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(4))
    kinds = _kinds_seen(monkeypatch)
    outputs = {}
    for closed_form in (True, False):
        model = tiny_model(name, impl="flex", window=6).eval()
        model._flex.closed_form = closed_form
        model.set_temperature(1.3)
        with torch.no_grad():
            outputs[closed_form] = model(tokens)
    expected = ["distance_table"] * 4 if name == "rpe" else ["closed_form"] * 2 + ["distance_table"] * 2
    assert kinds == expected  # two layers per forward
    assert _relative_error(outputs[True], outputs[False]) <= 1e-6


@pytest.mark.slow  # inductor compiles FlexAttention's CPU kernel twice: about 18 s on 2 cold cores
def test_compiled_closed_form_with_temperature_and_compiled_table_agree_with_eager() -> None:
    """The fused CPU kernel evaluates the closed form (``kerple_log3``: a learnable exponent through
    ``distance_power``) and the table gather (``rpe``), at τ = 1 and τ = 1.5."""
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    for name in ("kerple_log3", "rpe"):
        flex = tiny_model(name, impl="flex", window=None, flex_compile=True).eval()
        eager = tiny_model(name, impl="eager").eval()
        for temperature in (1.0, 1.5):
            flex.set_temperature(temperature)
            eager.set_temperature(temperature)
            with torch.no_grad():
                assert _relative_error(flex(tokens), eager(tokens)) <= 1e-5, (name, temperature)


def test_kernel_copies_keep_their_settings_and_start_empty() -> None:
    model = tiny_model("kerple_log", impl="flex")
    model._flex.closed_form = False
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long))
    assert model._flex._block_masks
    for clone in (copy.deepcopy(model._flex), pickle.loads(pickle.dumps(model._flex))):
        assert clone.closed_form is False and clone.compiled is False and not clone._block_masks


@pytest.mark.parametrize(("q_len", "k_len", "window"), [(40, 40, None), (1, 57, None), (33, 200, 16), (128, 128, None)])
def test_compiled_cpu_kernel_runs_on_whole_blocks(q_len: int, k_len: int, window: int | None) -> None:
    """Compiled on a CPU, the kernel pads queries and keys to whole 128-row blocks (Inductor's CPU
    kernel returned wrong values for other lengths on an AVX2 machine) and returns the real rows,
    equal to the unfused FlexAttention on the unpadded inputs, for prefill, decoding and windows."""
    from kerple.model.flex import FlexAttentionKernel
    from kerple.positional.logit_term import distance_table_term

    seen: list[tuple[int, int]] = []
    kernel, reference = FlexAttentionKernel(compile=True), FlexAttentionKernel(compile=False)

    def recording(query, key, value, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((query.shape[-2], key.shape[-2]))
        return flex_base.flex_attention(query, key, value, **kwargs)  # the unfused path, on the padded inputs

    kernel._compiled_attention = recording
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 3, q_len, 8, generator=generator)
    key, value = (torch.randn(2, 3, k_len, 8, generator=generator) for _ in range(2))
    term = distance_table_term(-torch.rand(3, 1, generator=generator) * torch.arange(k_len).float(), None, torch.float32)
    output = kernel(query, key, value, term, window)
    assert seen == [(-(-q_len // 128) * 128, -(-k_len // 128) * 128)]
    torch.testing.assert_close(output, reference(query, key, value, term, window), rtol=1e-5, atol=1e-6)
