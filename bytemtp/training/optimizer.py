"""The optimizer and its schedule, and which weights train from where: what a run's loop steps with.

AdamW (fused on CUDA) with decoupled weight decay on matrices only, over the parameters that
train (`build_optimizer`); linear warmup then cosine decay to a fraction of the peak (`lr_at`), a
function of the step alone so that a resumed run follows the same schedule, over a horizon set by
train.schedule_steps, train.steps or train.max_bytes (`schedule_horizon`; a run stopped by time
alone decays nothing after warmup). `set_trainable` freezes all but the draft heads for
train.trainable=draft-heads, and `start_from` loads train.init's weights into a new run's model
(the same model settings or an error naming those that differ).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from bytemtp.config import TrainConfig
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import load_model, resolve_checkpoint


def schedule_horizon(cfg: TrainConfig, bytes_per_step: int) -> int:
    """Steps over which warmup plus cosine decay run (0: no decay after warmup)."""
    if cfg.schedule_steps:
        return cfg.schedule_steps
    if cfg.steps:
        return cfg.steps
    if cfg.max_bytes:
        return -(-cfg.max_bytes // bytes_per_step)
    return 0


def lr_at(step: int, cfg: TrainConfig, horizon: int) -> float:
    """Linear warmup to the peak, then cosine decay to min_lr_ratio x peak at `horizon`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if horizon <= cfg.warmup_steps:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / (horizon - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def set_trainable(model: ByteMTP, trainable: str) -> None:
    """train.trainable: everything, or only what heads 2..n use (the embedding, the trunk and
    head 1 frozen, so the next-byte predictions stay exactly as they were)."""
    if trainable == "all":
        return
    if model.config.n_future < 2:
        raise ValueError("train.trainable=draft-heads needs draft heads: this model has model.n_future=1")
    model.requires_grad_(False)
    for module in model.draft_heads():
        module.requires_grad_(True)


def start_from(model: ByteMTP, init: str, device: torch.device) -> Path:
    """Load the weights of train.init (a checkpoint, or a run's newest) into a new run's model."""
    ckpt = resolve_checkpoint(init)
    source, cfg = load_model(ckpt, device=device)
    if cfg.model != model.config:
        differ = [f"{k}={getattr(cfg.model, k)!r}" for k in vars(cfg.model) if getattr(cfg.model, k) !=
                  getattr(model.config, k)]
        raise ValueError(f"train.init {ckpt} is a model of other settings (its {', '.join(differ)}); "
                         "a run starts from a checkpoint of the same model.* settings")
    model.load_state_dict(source.state_dict())
    return ckpt


def build_optimizer(model: ByteMTP, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only, over the parameters that train; fused on CUDA."""
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type == "cuda")
