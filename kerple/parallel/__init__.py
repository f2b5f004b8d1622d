"""Process groups passed explicitly (no module-level state): see :mod:`kerple.parallel.groups`.

:func:`~kerple.parallel.groups.init_distributed` returns a
:class:`~kerple.parallel.groups.ParallelState` (ranks, device, data/tensor-parallel groups, and
DeepSpeed's ``mpu`` interface); :func:`~kerple.parallel.groups.teardown` ends it.
"""
