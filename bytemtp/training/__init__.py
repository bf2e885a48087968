"""Floor 6, training: one optimisation step (`step`), the model's own continuations for
head tuning (`rollout`), run directories and plans (`runs`), the training loop (`train`) and
figures of a run (`plot`).
"""
