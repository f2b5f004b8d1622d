"""The jobs that run other jobs: each runs the project's entry points as child processes.

* :mod:`.process`: the one child-process runner (deadlines, stop requests and kill grace, Ctrl-C,
  one-line failures) and the children's environment;
* :mod:`.progress`: where a training stands, read from its ``metrics.jsonl``;
* :mod:`.demo`, :mod:`.demo_extension`, :mod:`.analysis_demo`: ``make demo``, ``make demo-extension``,
  ``make analysis-demo``; :mod:`.demo_runs` holds what they share (the demo's config, data and runs,
  the evaluate command);
* :mod:`.gpu_check`: ``make gpu-check`` (:mod:`.gpu_check.runner` and its steps);
* the GPU reproduction (``make gpu-reproduce``) runs its stages through :mod:`.process` and
  :mod:`.progress` (its plan, stages and report: :mod:`kerple.reproduce`).

The scripts under ``tools/`` are thin entry points to these modules.
"""
