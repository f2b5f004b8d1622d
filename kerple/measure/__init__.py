"""Measurement pieces shared by the benchmarks under ``benchmarks/`` and the GPU check's steps
(:mod:`kerple.jobs.gpu_check`), one module per concern:

* :mod:`kerple.measure.device`: device synchronization, peak memory, releasing memory between
  cases, the measured matmul peak (the denominator of MFU);
* :mod:`kerple.measure.training`: a real ``Trainer`` on a synthetic corpus, one timed training step,
  FLOPs per token;
* :mod:`kerple.measure.host_work`: operators, kernel launches and host synchronizations per
  training step, read from ``torch.profiler``;
* :mod:`kerple.measure.eval_memory` and its subprocess :mod:`kerple.measure.eval_worker`: peak
  memory and tokens/s of a no-grad evaluation per attention implementation and length.
* :mod:`kerple.measure.triton_offline`: a Triton kernel compiled for an NVIDIA GPU on any machine,
  its registers, spills and shared memory from ``ptxas -v``.

Nothing here imports the scripts that use it; the modules import nothing at package level, so
``python -m kerple.measure.eval_worker`` loads only what it needs.
"""
