"""Floor 6, training: one optimisation step (`step`), the model's own continuations for
head tuning (`rollout`), the optimizer and its schedule (`optimizer`), run directories and plans
(`runs`), the training loop (`train`), what a step measured (`figures`), non-finite steps
(`faults`), TensorBoard and W&B beside its metrics (`tracking`) and
figures of a run (`plot`).
"""
