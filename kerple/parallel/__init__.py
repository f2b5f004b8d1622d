"""Process groups passed explicitly (no module-level state): see :mod:`kerple.parallel.groups`.

:func:`~kerple.parallel.groups.init_distributed` returns a
:class:`~kerple.parallel.groups.ParallelState` (ranks, device, data/tensor-parallel groups, and
DeepSpeed's ``mpu`` interface); :func:`~kerple.parallel.groups.teardown` ends it.
:func:`~kerple.parallel.tensor_parallel.parallelize` turns a built model into this rank's
tensor-parallel part (megatron-core layers) and
:func:`~kerple.parallel.tensor_parallel.vocab_parallel_loss` is its loss. Pipeline parallelism is
not implemented yet (the trainer refuses ``pipe_parallel_size > 1``).
"""
