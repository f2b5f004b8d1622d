"""Compile a Triton kernel for an NVIDIA GPU on a machine without one, and read what it costs there.

Triton's wheel carries NVIDIA's ``ptxas``, so a kernel goes through every stage of a GPU compilation
here (Triton's passes, LLVM, PTX, ``ptxas``) without a device: a kernel that fails to compile for a
GPU fails here too (Triton 3.6 refuses 8 x 8 ``tl.dot`` tiles for sm_90 here as it did on an H200),
and ``ptxas -v`` reports the registers per thread, the bytes spilled to local memory and the shared
memory of each launch configuration; the PTX tells whether a loop's loads were pipelined (``cp.async``
copies, issued stages ahead of the compute that reads them) and which tensor-core instructions the
``tl.dot`` calls became. Spills and register counts decide occupancy; run time still needs a GPU.

Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run kernels on a CPU) replaces every
``@triton.jit`` function at import, so :func:`kernel_resources` compiles in a child process without
it; ``python -m kerple.measure.triton_offline`` reads the requests as JSON on stdin.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one launch configuration costs an NVIDIA GPU, from ``ptxas -v``; ``error``: why it did not
    compile (the other fields are then 0)."""

    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared_bytes: int = 0
    async_copies: int = 0  # cp.async instructions: > 0 when Triton's pipeliner overlapped a loop's loads
    tensor_cores: str = ""  # "wgmma" (Hopper's), "mma" (Ampere's, mma.sync) or "" (none: fp32 FMA)
    error: str | None = None


def compile_here(kernel: str, signature: dict[str, str], constexprs: dict[str, Any], num_warps: int,
                 arch: int = 90, num_stages: int | None = None) -> Resources:
    """Compile ``kernel`` (``"module:function"``, a ``@triton.jit`` function) for ``sm_<arch>`` in this
    process, which must not run Triton's interpreter. ``signature`` maps every parameter that is not in
    ``constexprs`` to a Triton type (``"*bf16"``, ``"i32"``, ``"fp32"``); ``num_stages``: the software
    pipeline's depth (``None``: Triton's default, 3 on NVIDIA GPUs)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = kernel.split(":")
    function = getattr(importlib.import_module(module), name)
    params = list(function.arg_names)
    types = {param: "constexpr" if param in constexprs else signature[param] for param in params}
    source = ASTSource(fn=function, signature=types,
                       constexprs={(params.index(key),): value for key, value in constexprs.items()})
    try:
        options = {"num_warps": num_warps, **({"num_stages": num_stages} if num_stages else {})}
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as error:  # Triton's pass failures are RuntimeErrors with the pass in the log
        return Resources(error=f"{type(error).__name__}: {str(error)[:200]}")
    suffix = "a" if arch == 90 else ""  # Hopper's tensor-core instructions need sm_90a
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        report = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{arch}{suffix}", str(ptx), "-o", str(ptx) + ".cubin"],
                                capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    registers = re.search(r"Used (\d+) registers", report)
    if spills is None or registers is None:
        raise RuntimeError(f"ptxas -v printed no register line:\n{report}")
    ptx_text = compiled.asm["ptx"]
    copies = len(re.findall(r"^\s*cp\.async\.c[ag]\.", ptx_text, flags=re.MULTILINE))
    cores = "wgmma" if "wgmma.mma_async" in ptx_text else "mma" if "mma.sync" in ptx_text else ""
    return Resources(int(registers.group(1)), int(spills.group(1)), int(spills.group(2)), int(compiled.metadata.shared),
                     copies, cores)


def kernel_resources(requests: list[dict[str, Any]], timeout: float = 900.0) -> list[Resources]:
    """:func:`compile_here` for each request (its keyword arguments) in one child process without
    Triton's interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(requests), env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"compiling offline failed:\n{done.stderr[-2000:]}")
    return [Resources(**row) for row in json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> int:
    requests = json.loads(sys.stdin.read())
    print(json.dumps([dataclasses.asdict(compile_here(**request)) for request in requests]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
