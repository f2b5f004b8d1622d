"""Training on DeepSpeed: the trainer, NeoX's LR schedule; checkpoints through :mod:`kerple.checkpoint`.

Public API:

* :func:`kerple.training.trainer.run_training` ``(cfg, *, config_files=None) -> TrainResult``
  and :class:`kerple.training.trainer.Trainer` ``(cfg, parallel, *, config_files=None)``;
* :mod:`kerple.training.resume` - resuming a run from ``checkpointing.load``;
* :class:`kerple.training.lock.SaveLock` - one training per ``save`` folder;
* :class:`kerple.training.schedule.AnnealingLR`, :func:`kerple.training.schedule.annealing_lr`;
* :func:`kerple.training.optimizer.build_optimizer`, :func:`kerple.training.ds_config.deepspeed_config`;
* :class:`kerple.training.master_adamw.MasterAdamW` - the optimizer at ZeRO stage 0 (fp32 masters, clipping);
* :class:`kerple.training.errors.TrainingError`, :class:`kerple.training.errors.TrainingDivergedError`.

Submodules are imported lazily by their users so that ``import kerple.training`` does not import
DeepSpeed.
"""
