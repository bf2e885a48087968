"""The optimizer, and which weights train from where: what a run's loop steps with (its
schedule is `bytemtp.training.schedule`'s).

`build_optimizer` builds, over the parameters that train, AdamW (fused on CUDA) with decoupled
weight decay on matrices only, or for train.optimizer=muon a `Mixed` optimizer: torch's Muon on the
2-D matrices of the trunk and the heads (attention and feed-forward; Newton-Schulz orthogonalises
each whole update, so FSDP2's sharded matrices are refused in the configuration) and AdamW on the
rest (the embedding, the norms and the unembeddings, which are not hidden matrices), each at its
own peak learning rate; `set_lr` sets each at the schedule's fraction of its peak.
`set_trainable` freezes all but the draft heads for
train.trainable=draft-heads, and `start_from` loads train.init's weights into a new run's model
(the same model settings or an error naming those that differ).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bytemtp.config import TrainConfig
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import load_model, resolve_checkpoint


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
    differ = [f"{k}={getattr(cfg.model, k)!r}" for k in vars(cfg.model)
              if getattr(cfg.model, k) != getattr(model.config, k) and k != "draft"]
    if differ:
        raise ValueError(f"train.init {ckpt} is a model of other settings (its {', '.join(differ)}); "
                         "a run starts from a checkpoint of the same model.* settings")
    if cfg.model.draft == model.config.draft:
        model.load_state_dict(source.state_dict())
    else:  # draft heads added (or others in their place): everything else the source's, the drafts head 1's copies
        state = {k: v for k, v in source.state_dict().items() if not k.startswith("drafter.")}
        missing, _ = model.load_state_dict(state, strict=False)
        assert all(k.startswith("drafter.") for k in missing), missing
        model.init_drafts()
    return ckpt


def build_optimizer(model: ByteMTP, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer | Mixed:
    """train.optimizer over the parameters that train: AdamW with weight decay on matrices only
    (fused on CUDA), or `Mixed` Muon on the trunk's and heads' matrices and AdamW on the rest."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [p for n, p in named if cfg.optimizer == "muon" and p.dim() == 2 and n.startswith(("trunk.", "heads."))]
    chosen = {id(p) for p in hidden}
    rest = [p for _, p in named if id(p) not in chosen]
    groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                              fused=device.type == "cuda")
    if not hidden:
        return adamw
    muon = torch.optim.Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                            weight_decay=cfg.muon_weight_decay)
    return Mixed(adamw=adamw, muon=muon)


def set_lr(optimizer: torch.optim.Optimizer | Mixed, scale: float, cfg: TrainConfig) -> None:
    """Every parameter group at `scale` times its optimizer's peak (train.lr, train.muon_lr)."""
    parts = optimizer.optimizers if isinstance(optimizer, Mixed) else {"adamw": optimizer}
    peaks = {"adamw": cfg.lr, "muon": cfg.muon_lr}
    for name, opt in parts.items():
        for group in opt.param_groups:
            group["lr"] = peaks[name] * scale


class Mixed:
    """Two optimizers over disjoint parameters that step as one: the loop, the checkpoint and
    the DDP wrapper see one optimizer (its param_groups are both's, AdamW's first). Its state dict
    holds each one's under its name, so a checkpoint of one kind does not load into the other."""

    def __init__(self, **optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"it holds the state of {', '.join(sorted(state))}, and this run steps with "
                             f"{', '.join(sorted(self.optimizers))}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])
