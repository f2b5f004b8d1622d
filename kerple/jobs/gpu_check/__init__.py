"""``make gpu-check``: one command that proves the trainer on a CUDA GPU and writes ``gpu-report/``.

Steps (each a module ``step_*.py`` with ``NAME`` and ``run(ctx)``; run in order, a failed step
does not stop the next ones; ``tools/gpu_check.py --steps 3,4`` runs a subset and merges it into
the existing report):

1. ``step_peak``: measured bf16 matmul peak (TFLOP/s), the denominator of MFU;
2. ``step_gpu_tests``: ``pytest -m gpu`` on pytest-xdist workers: its summary, each failure's
   assertion text, the output tail on a non-zero exit, what a stopped run left out;
3. ``step_correctness``: FlexAttention against eager at the 162M shape: logits, input-embedding
   gradients and positional-parameter gradients, bf16 then fp32, with the kernel options per case;
4. ``step_throughput``: 162M training throughput per embedding x attention implementation, with
   and without ``compile``: tokens/s, step time, MFU, peak memory, ratio to ``none``, and the
   throughput targets;
5. ``step_training``: a 300-step bf16 ``kerple_log`` run on the embedded data; loss falls, and a
   run resumed from its step-150 checkpoint repeats the uninterrupted run's losses;
6. ``step_fp16``: fp16 with dynamic loss scaling skips and counts an overflowing step;
7. ``step_evaluation``: evaluation memory and tokens/s per implementation at 2k-64k tokens;
8. ``step_profile`` (``--profile`` alone, 150 s; not part of a default run): where a 162M step's
   time goes for ``none`` and ``kerple_log``, eager then compiled: host time, GPU busy fraction,
   operators, launches and synchronizations per step, peak memory, the top CUDA kernels.

Sizes and time budgets: :mod:`kerple.jobs.gpu_check.context`. Report format:
:mod:`kerple.jobs.gpu_check.report`. Driver: :mod:`kerple.jobs.gpu_check.runner`.
"""

STEP_MODULES: dict[int, str] = {
    1: "step_peak",
    2: "step_gpu_tests",
    3: "step_correctness",
    4: "step_throughput",
    5: "step_training",
    6: "step_fp16",
    7: "step_evaluation",
    8: "step_profile",
}
