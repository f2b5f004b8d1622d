"""The jobs that run other jobs, as child processes through :mod:`.process` (progress read from the runs'
``metrics.jsonl``: :mod:`.progress`): ``make demo``, ``demo-extension`` and ``analysis-demo`` (what they share:
:mod:`.demo_runs`), ``make gpu-check`` (:mod:`.gpu_check`) and ``make gpu-reproduce`` (:mod:`kerple.reproduce`).
The scripts under ``tools/`` are thin entry points to these modules."""
