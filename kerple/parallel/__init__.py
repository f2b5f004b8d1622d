"""Process groups passed explicitly (no module-level state): see :mod:`kerple.parallel.groups`.

:func:`~kerple.parallel.groups.init_distributed` returns a
:class:`~kerple.parallel.groups.ParallelState` (ranks, device, data/tensor-parallel groups, and
DeepSpeed's ``mpu`` interface); :func:`~kerple.parallel.groups.teardown` ends it.
:func:`~kerple.parallel.tensor_parallel.parallelize` turns a built model into this rank's
tensor-parallel part (megatron-core layers) and
:func:`~kerple.parallel.tensor_parallel.vocab_parallel_loss` is its loss.
:func:`~kerple.parallel.pipeline.build_pipeline` turns a built model into this rank's stages of a
DeepSpeed ``PipelineModule`` (reference pipeline indices, the shared positional parameters tied
across stages); import it after ``init_distributed``.
"""
