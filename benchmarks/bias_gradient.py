"""What a learnable bias's gradient costs in attention, per path, in one run (ratios to ``none``).

    python benchmarks/bias_gradient.py                                   # CUDA: 162M's attention, bf16
    python benchmarks/bias_gradient.py --shape 4,4,512,32 --threads 1    # CPU, fp32
    python benchmarks/bias_gradient.py --pe rpe --shape 1,12,8192,64     # another embedding, a long sequence

One attention forward + backward of causal ``[batch, heads, length, head_dim]`` inputs with the
embedding's term (``--pe``, default ``kerple_log``), each variant timed in the same rounds (rotated
order, median; CUDA synchronised around each call):

* ``none``: ``scaled_dot_product_attention(is_causal=True)``;
* ``sdpa, dense bias`` (a bias without a logit scale): the ``[H, L, L]`` mask from the distance
  tables, its gradient through sdpa
  (on a CPU: the fused flash forward and the blockwise backward that sums the mask's gradient along
  its diagonals, ``kerple/model/sdpa_cpu.py``; what ``auto`` trains a bias with on a CPU and on CUDA
  below 8,192 tokens);
* CPU ``flash + reduction``: the same flash forward with the mask detached, PyTorch's fused flash
  backward for ``dq``/``dk``/``dv``, and the distance tables' gradient from the separate reduction
  (``kerple/model/bias_gradient.py``, torch on a CPU), carried by autograd to the parameters;
* CUDA ``flex, captured gradient``: compiled FlexAttention with the closed form, its backward scattering
  the parameters' gradient with atomic adds (``separate_gradient=False``);
* CUDA ``sdpa (cuDNN), dense bias``: the same mask through the cuDNN backend, where it takes one and
  returns its gradient (else left out with a note);
* CUDA ``flex, detached``: the same kernel with the term detached and no parameter gradient (the
  floor of the next row);
* CUDA ``flex + reduction``: the model's path: detached term, log-sum-exp, and the Triton reduction
  (the diagonal sums of ``dS``: the tables' gradient);
* ``reduction alone``: the reduction on saved inputs, with the tables built from the parameters and the
  gradient carried back to them.
* CUDA ``reduction alone, gathered per tile``: the same with the Triton kernel summing each tile along its
  diagonals as it comes instead of once per program (``GATHER_EACH_TILE``).
* CUDA ``reduction alone, not pipelined``: the same with one pipeline stage (``STAGES`` 1): the kernel's
  loads are not issued ahead of the compute.
* CUDA ``triton, fused``: ``attention_impl: triton`` (``kerple/model/triton_attention.py``), one
  FlashAttention-2 kernel with the tables in its logits whose backward also sums the tables' gradient from
  its ``dS`` tiles. Before timing, a line compares its output, ``dq`` and the tables' gradient with
  ``flex + reduction``'s on the same inputs (the tests run it only in Triton's CPU interpreter); ``not pipelined``:
  the same with one pipeline stage (``PIPELINED`` off): its loads are not issued ahead; ``partial rows shared``:
  the key-side backward's programs share key blocks and add into shared rows of its partial buffer
  (``PARTIALS_BYTES`` 0: as few programs as :func:`~kerple.model.triton_attention_kernels.key_programs` allows,
  as beyond 256 MB of partials at long lengths); ``64-wide tiles``
  (head_dim above 64): tiles of 64 where the kernels choose 32 (Hopper's wgmma in 16 bits instead of
  mma.sync; compiled offline the key-side backward then spills 56 B a thread).

The distance tables are built in every call that needs them (the model builds them once per forward
for all layers). Printed: milliseconds and the ratio to ``none``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from typing import Any, Callable

from kerple.errors import entry_point
from kerple.flags import AT_LEAST_1, check_flags, heavy_imports, shape_flag


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="bias_gradient.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", help="batch,heads,length,head_dim (default: 32,12,512,64 on CUDA, 4,4,512,32 "
                                        "on a CPU)")
    parser.add_argument("--pe", default="kerple_log", help="a distance-based learnable embedding")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's)")
    parser.add_argument("--no-captured", action="store_true",
                        help="leave out 'flex, captured gradient' (about 0.7 s a call at 1 x 12 x 8192 x 64 on an "
                             "H200: eleven rounds outlast a short lease's step)")
    args = parser.parse_args(argv)
    check_flags(args, {"--rounds": AT_LEAST_1, "--threads": AT_LEAST_1})
    if args.shape is not None:
        shape_flag("--shape", args.shape, ("batch", "heads", "length", "head_dim"))
    return args


with heavy_imports("bias_gradient.py", parse_args if __name__ == "__main__" else None):
    import torch
    import torch.nn.functional as F

    from kerple import positional
    from kerple.model import sdpa_cpu
    from kerple.measure.training import check_embeddings
    from kerple.model.bias_gradient import table_gradients, with_table_gradient
    from kerple.positional.base import diagonal_gather
    from kerple.positional.logit_term import LogitTerm, distance_table_term

Variant = Callable[[], object]  # one timed call; what it returns is not used


def _inputs(shape: list[int], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(shape, device=device, dtype=dtype, generator=generator) for _ in range(4)]


def _diagonals(table: torch.Tensor, length: int) -> torch.Tensor:
    """The causal mask's value per diagonal (``sdpa_cpu``'s layout): ``-inf`` above the diagonal."""
    return torch.cat([table.new_full((table.shape[0], length - 1), float("-inf")), table], dim=-1)


def common_variants(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor]) -> dict[str, Variant]:
    """``none``, ``sdpa, dense bias`` and ``reduction alone``, on either device."""
    q, k, v, upstream = tensors
    length, device = q.shape[-2], q.device

    def leaves() -> list[torch.Tensor]:
        return [t.detach().requires_grad_() for t in (q, k, v)]

    def none() -> None:
        F.scaled_dot_product_attention(*leaves(), is_causal=True).backward(upstream)

    with torch.no_grad():
        output = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool, device=device).triu(1), float("-inf"))
        lse = torch.logsumexp(scores, -1)
        del scores

    def reduction() -> None:
        tables = embedding.distance_tables(length, device)
        gradients = table_gradients(q, k, v, output, lse, upstream, *tables, None)
        pairs = [(table, gradient) for table, gradient in zip(tables, gradients) if table is not None]
        torch.autograd.backward([table for table, _ in pairs], [gradient for _, gradient in pairs])

    def reduction_with(setting: str, value: Any) -> Variant:  # the Triton kernel with one module setting changed
        def run() -> None:
            from kerple.model import bias_gradient_triton

            before = getattr(bias_gradient_triton, setting)
            setattr(bias_gradient_triton, setting, value)
            try:
                reduction()
            finally:
                setattr(bias_gradient_triton, setting, before)
        return run

    bias, scale = embedding.distance_tables(length, device)
    sdpa_serves = bias is not None and scale is None  # sdpa cannot scale the logits
    dense_row = {"sdpa, dense bias": _dense_bias(embedding, tensors)} if sdpa_serves else {}
    triton_rows = {"reduction alone, gathered per tile": reduction_with("GATHER_EACH_TILE", True),
                   "reduction alone, not pipelined": reduction_with("STAGES", 1)} if device.type == "cuda" else {}
    return {"none": none, **dense_row, "reduction alone": reduction, **triton_rows}


def cpu_variants(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor]) -> dict[str, Variant]:
    """The CPU's alternative to ``sdpa_cpu``'s combined backward: PyTorch's flash backward plus the reduction."""
    q, k, v, upstream = tensors
    length = q.shape[-2]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def flash_and_reduction() -> None:
        query, key, value = (t.detach().requires_grad_() for t in (q, k, v))
        bias = embedding.distance_tables(length, q.device)[0]
        mask = diagonal_gather(_diagonals(bias.detach(), length), length, length)[None]
        output, lse = flash(query, key, value, 0.0, True, attn_mask=mask)
        with_table_gradient(output, query, key, value, lse, bias, None, None).backward(upstream)

    return {"flash + reduction": flash_and_reduction}


def cuda_variants(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor],
                  captured: bool = True) -> dict[str, Variant]:
    """FlexAttention with the parameters' gradient captured (unless ``captured`` is false), detached, and
    from the reduction."""
    from kerple.model.flex import FlexAttentionKernel

    q, k, v, upstream = tensors
    length = q.shape[-2]
    kernels = {separate: FlexAttentionKernel(compile=True, separate_gradient=separate) for separate in (True, False)}

    def flex(separate: bool, detached: bool) -> Variant:
        def run() -> None:
            query, key, value = (t.detach().requires_grad_() for t in (q, k, v))
            term = embedding.logit_term()
            term = term if term is not None else _table_term(embedding, length, q.dtype)
            tables = embedding.distance_tables(length, q.device) if separate else None
            term = term.detached() if detached else term
            kernels[separate](query, key, value, term, None, tables).backward(upstream)
        return run

    variants = {"flex, captured gradient": flex(False, False)} if captured else {}
    return {**variants, **_cudnn_dense(embedding, tensors), "flex, detached": flex(False, True),
            "flex + reduction": flex(True, False), **_fused_row(embedding, tensors, kernels[True])}


def _fused_row(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor], flex: Any) -> dict[str, Variant]:
    """``triton, fused`` after its comparison with ``flex + reduction``; left out, with a note, where the kernel
    fails on this GPU (not yet run on one), so that the other rows still come out."""
    try:
        _compare_fused(embedding, tensors, flex)
    except Exception as error:  # noqa: BLE001 -- any failure of the untimed kernel: the other rows still count
        print(f"triton, fused: left out ({type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]})")
        return {}
    wide = {"triton, fused, 64-wide tiles": _fused(embedding, tensors, block=64)} if tensors[0].shape[-1] > 64 else {}
    return {"triton, fused": _fused(embedding, tensors),
            "triton, fused, not pipelined": _fused(embedding, tensors, PIPELINED=False),
            "triton, fused, partial rows shared": _fused(embedding, tensors, PARTIALS_BYTES=0), **wide}


def _fused(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor], block: int = 0,
           **settings: Any) -> Callable[[], list[torch.Tensor]]:
    """One forward + backward through ``attention_impl: triton``'s kernel (``block``: the tile width, 0 the
    kernels' choice; ``settings``: module settings of ``triton_attention_kernels``, or of the
    ``bias_gradient_triton`` it shares them with, changed for the call); returns the output, ``dq`` and the
    present tables' gradients."""
    from kerple.model import bias_gradient_triton, triton_attention_kernels
    from kerple.model.triton_attention import fused_attention

    owners = {name: triton_attention_kernels if hasattr(triton_attention_kernels, name) else bias_gradient_triton
              for name in settings}

    q, k, v, upstream = tensors
    length = q.shape[-2]

    def run() -> list[torch.Tensor]:
        query, key, value = (t.detach().requires_grad_() for t in (q, k, v))
        tables = [None if t is None else t.detach().requires_grad_()
                  for t in embedding.distance_tables(length, q.device)]
        before = {name: getattr(owners[name], name) for name in settings}
        for name, setting in settings.items():
            setattr(owners[name], name, setting)
        try:
            output, _ = fused_attention(query, key, value, *tables, None, block)
            output.backward(upstream)
        finally:
            for name, setting in before.items():
                setattr(owners[name], name, setting)
        return [output, query.grad, *(t.grad for t in tables if t is not None)]

    return run


def _compare_fused(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor], flex: Any) -> None:
    """Print how far ``triton, fused`` lies from ``flex + reduction`` (relative to the largest entry)."""
    q, k, v, upstream = tensors
    length = q.shape[-2]
    query, key, value = (t.detach().requires_grad_() for t in (q, k, v))
    tables = [None if t is None else t.detach().requires_grad_() for t in embedding.distance_tables(length, q.device)]
    term = embedding.logit_term()
    term = term if term is not None else _table_term(embedding, length, q.dtype)
    output = flex(query, key, value, term, None, tables)  # with tables it detaches the term itself
    output.backward(upstream)
    expected = [output, query.grad, *(t.grad for t in tables if t is not None)]
    names = ["output", "dq", *(name for name, t in zip(("dbias", "dscale"), tables) if t is not None)]
    errors = [((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
              for got, want in zip(_fused(embedding, tensors)(), expected)]
    print("triton, fused vs flex + reduction (max |difference| / max |flex|): "
          + ", ".join(f"{name} {error:.1e}" for name, error in zip(names, errors)))


def _dense_bias(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor],
                backends: list[Any] | None = None) -> Callable[[], torch.Tensor | None]:
    """One forward + backward through the dense ``[1, H, L, L]`` mask of the bias table, returning the
    table's gradient: sdpa with ``backends`` allowed (``None``: PyTorch's choice, and on a CPU the fused
    path of ``sdpa_cpu``, which sums the mask's gradient along its diagonals)."""
    from torch.nn.attention import sdpa_kernel

    q, k, v, upstream = tensors
    length = q.shape[-2]

    def run() -> torch.Tensor | None:
        query, key, value = (t.detach().requires_grad_() for t in (q, k, v))
        table = embedding.distance_tables(length, q.device)[0]
        table.retain_grad()
        diagonals = _diagonals(table, length)
        mask = diagonal_gather(diagonals, length, length)[None]
        if backends is None and sdpa_cpu.supported(query, 0.0):
            output = sdpa_cpu.masked_attention(query, key, value, mask.detach(), diagonals)
        else:
            with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask.to(q.dtype))
        output.backward(upstream)
        return table.grad

    return run


def _cudnn_dense(embedding: positional.PositionalEmbedding, tensors: list[torch.Tensor]) -> dict[str, Variant]:
    """``sdpa (cuDNN), dense bias``: the dense mask through PyTorch's cuDNN attention backend (``none``'s
    kernel on an H100/H200, where ``auto``'s dense bias gets the slower memory-efficient one), kept
    only where that backend takes the mask and returns the tables a gradient (a note says otherwise)."""
    from torch.nn.attention import SDPBackend

    bias, scale = embedding.distance_tables(tensors[0].shape[-2], tensors[0].device)
    if bias is None or scale is not None:
        return {}
    run = _dense_bias(embedding, tensors, [SDPBackend.CUDNN_ATTENTION])
    try:
        gradient = run()
    except RuntimeError as error:
        print(f"sdpa (cuDNN), dense bias: left out ({str(error).splitlines()[0][:160]})")
        return {}
    if gradient is None or not bool(gradient.ne(0).any()):
        print("sdpa (cuDNN), dense bias: left out (the backend gave the bias no gradient)")
        return {}
    return {"sdpa (cuDNN), dense bias": run}


def _table_term(embedding: positional.PositionalEmbedding, length: int, dtype: torch.dtype) -> LogitTerm | None:
    bias, scale = embedding.distance_tables(length)
    return distance_table_term(bias, scale, dtype)


def timed(variants: dict[str, Variant], rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds per variant over ``rounds`` rotated rounds after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds + 1):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            variants[name]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_index:
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


@entry_point("bias_gradient.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_embeddings("--pe", [args.pe])
    cuda = torch.cuda.is_available()
    args.shape = args.shape or ("32,12,512,64" if cuda else "4,4,512,32")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = [int(part) for part in args.shape.split(",")]
    embedding = positional.build(args.pe, num_heads=shape[1], head_dim=shape[3], hidden_size=shape[1] * shape[3],
                                 max_positions=shape[2]).to(device)
    if not any(t is not None and t.requires_grad for t in embedding.distance_tables(2, device)):
        print(f"bias_gradient.py: {args.pe} has no learnable distance tables; choose a distance-based learnable "
              "embedding (kerple_*, gauss_*, rpe)", file=sys.stderr)
        return 2
    if not cuda and embedding.distance_tables(2)[1] is not None:
        print(f"bias_gradient.py: on a CPU every path here is sdpa's, which cannot scale the logits as {args.pe} "
              "does; choose a bias (kerple_log, kerple_power, kerple_log3, gauss_bias2, gauss_bias3, rpe)",
              file=sys.stderr)
        return 2
    tensors = _inputs(shape, device, dtype)
    variants = common_variants(embedding, tensors)
    variants.update(cuda_variants(embedding, tensors, not args.no_captured) if cuda else cpu_variants(embedding, tensors))
    medians = timed(variants, args.rounds, device)
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; torch {torch.__version__}; {args.pe}; shape {shape}, {str(dtype).removeprefix('torch.')}; "
          f"forward + backward, median of {args.rounds} rotated rounds\n")
    print("| variant | ms | vs none |\n|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {seconds / medians['none']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
