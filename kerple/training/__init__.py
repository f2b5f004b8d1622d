"""Training on DeepSpeed: the trainer, NeoX's LR schedule, reference-layout checkpoints.

Public API:

* :func:`kerple.training.trainer.run_training` ``(cfg, *, config_files=None) -> TrainResult``
  and :class:`kerple.training.trainer.Trainer` ``(cfg, parallel, *, config_files=None)``;
* :func:`kerple.training.checkpoint.load_model_weights` ``(model, load_dir, iteration=None, *, cfg=None,
  trust=False) -> int`` (delegates to :func:`kerple.checkpoint.load_model_weights`);
* :class:`kerple.training.schedule.AnnealingLR`, :func:`kerple.training.schedule.annealing_lr`;
* :func:`kerple.training.optimizer.build_optimizer`, :func:`kerple.training.ds_config.deepspeed_config`;
* :class:`kerple.training.errors.TrainingError`, :class:`kerple.training.errors.TrainingDivergedError`.

Submodules are imported lazily by their users so that ``import kerple.training`` does not import
DeepSpeed.
"""
