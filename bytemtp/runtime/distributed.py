"""Training on many processes: torchrun's environment, DDP or FSDP2, and the collectives the loop needs.

`setup()` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and starts the process
group: NCCL on CUDA (one GPU per process, cuda:LOCAL_RANK), gloo on the CPU, with a timeout so
that a rank stuck in a collective ends the job with an error instead of a hang. Without torchrun
it returns a one-process `Dist` and starts nothing, so the loop is the same code either way.

`wrap_model` applies the wrapper from outside the model:

- `ddp`: `DistributedDataParallel`, which broadcasts rank 0's weights at construction.
- `fsdp`: FSDP2 `fully_shard` on each trunk block, each head, each unembedding and the
  embedding, then on the root. Each process holds a shard of every parameter; a unit's
  parameters are all-gathered for its forward and backward and its gradients reduce-scattered
  right after its backward.

Gradient reduction, once per optimizer step. The memory-efficient step (`bytemtp.training.step`) makes
n + 1 backward calls per micro-batch (one per head, then the trunk), through methods of the model
rather than one forward of the wrapper, and with gradient accumulation there are several
micro-batches per optimizer step. DDP's reducer assumes one backward per forward of the wrapper,
so under DDP the whole optimizer step runs inside `no_sync()` and `reduce_gradients` then
all-reduces the gradients once, in flat buckets, as an average: one reduction per step, the same
for the plain step, at the price of not overlapping communication with the backward. Under FSDP2
the units are cut so that each takes part in exactly one backward call per micro-batch (a head
and its unembedding in that head's backward, the trunk blocks and the embedding in the trunk's),
so its own reduce-scatter after that call is its only one; `set_requires_gradient_sync(False)`
holds it back on every micro-batch but the last. (A unit that no backward call reaches would
never reduce: the root unit is therefore left without parameters of its own. A shared
unembedding, used by every head, reduces once per head.)

Metrics are reduced as sums and then divided; checkpoints are written by rank 0 from full
(gathered) state dicts, so `model.safetensors` is the same file whatever the wrapper, and loaded
into the wrapped model on every rank (`load_weights`, `load_optimizer`: FSDP2 keeps each rank's
shard of the full state).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from bytemtp.config import PARALLEL
from bytemtp.model.model import ByteMTP

_BUCKET_BYTES = 25 << 20


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Under torchrun (a process group exists), even with one process: the same code path."""
        return dist.is_initialized()


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def restarted() -> bool:
    """Whether torchrun restarted this job after a failure (--max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def local(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: the full value of a DTensor (FSDP2's gradient norm), else the tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def setup(device: torch.device, *, timeout_s: float = 600.0) -> Dist:
    """Join the process group that torchrun describes (or stay alone without torchrun)."""
    if not launched_by_torchrun():
        return Dist(device=device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s),
                                **({"device_id": device} if device.type == "cuda" else {}))
    return Dist(rank=rank, world_size=world, local_rank=local, device=device)


def teardown(*, wait: bool = True) -> None:
    """Leave the process group, once every rank is done with it when `wait` (a rank that
    destroys its end while a peer still talks to it can abort the peer). After an error, leave
    at once: the peers may never reach the barrier."""
    if dist.is_initialized():
        try:
            if wait:
                dist.barrier()
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def process_group(device: torch.device, *, timeout_s: float = 600.0) -> Iterator[Dist]:
    """`setup` on entry and `teardown` on exit: waiting for every rank after a clean exit, at
    once after an error (the peers may never reach the barrier). The one way training and
    evaluation join and leave the process group."""
    d = setup(device, timeout_s=timeout_s)
    try:
        yield d
    except BaseException:
        teardown(wait=False)
        raise
    teardown()


def wrap_model(model: ByteMTP, d: Dist, parallel: str) -> nn.Module:
    """The model under DDP or FSDP2 (unchanged on one process)."""
    if parallel not in PARALLEL:
        raise ValueError(f"parallel={parallel!r} is not allowed; choose one of {', '.join(PARALLEL)}")
    if not d.active:
        return model
    if parallel == "ddp":
        ids = [d.device.index] if d.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    # One unit per part that the step calls as a module and that takes part in one backward call
    # per micro-batch: each trunk block, each head (its layers and final norm; the norm runs after
    # the head's forward, so the head stays gathered until its backward), each unembedding and
    # the embedding. A shared unembedding serves every head, so it reduces once per head.
    for block in model.trunk:
        fully_shard(block)
    for head in model.heads:
        fully_shard(head, reshard_after_forward=False)
    for unembed in model.unembed:
        fully_shard(unembed)
    fully_shard(model.embed)
    fully_shard(model)
    return model


def unwrap(model: nn.Module) -> ByteMTP:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, *, last: bool):
    """Around the backward passes of one micro-batch: hold the reduction back unless `last`
    (FSDP2), or always (DDP: `reduce_gradients` reduces once after the step)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def reduce_gradients(model: nn.Module, d: Dist) -> None:
    """Under DDP, average the gradients over the ranks in flat buckets (FSDP2 has reduced them)."""
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads + [None]:
        if g is not None:
            bucket.append(g)
            size += g.numel() * g.element_size()
        if bucket and (g is None or size >= _BUCKET_BYTES):
            flat = torch.cat([b.reshape(-1) for b in bucket])
            dist.all_reduce(flat)
            flat /= d.world_size
            offset = 0
            for b in bucket:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
            bucket, size = [], 0


def mean(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """The average of a tensor over the ranks (a sum, then divided)."""
    if not d.active:
        return t
    t = t.detach().clone()
    dist.all_reduce(t)
    return t / d.world_size


def any_rank(flag: bool, d: Dist, device: torch.device) -> bool:
    """True on every rank when it is true on one (a stop signal, a non-finite loss)."""
    if not d.active:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather(obj, d: Dist) -> list:
    """Every rank's object, in rank order, on every rank."""
    if not d.active:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(d: Dist) -> None:
    if d.active:
        dist.barrier()


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict | None]:
    """Full (unsharded) model and optimizer state dicts in the one-process format (the
    optimizer's keyed by parameter index, as `optimizer.state_dict()`); under FSDP2 every rank
    takes part in the gathering, and the copies are on the CPU."""
    if not _is_fsdp(model):
        core = unwrap(model)
        return core.state_dict(), optimizer.state_dict() if optimizer is not None else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    if optimizer is None:
        return weights, None
    by_name = get_optimizer_state_dict(model, optimizer, options=options)
    if not by_name:  # with cpu_offload only rank 0 receives the full state
        return weights, None
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    optim = {"state": {index[name]: value for name, value in by_name["state"].items()},
             "param_groups": [{**g, "params": [index[name] for name in g["params"]]}
                              for g in by_name["param_groups"]]}
    return weights, optim


def load_weights(model: nn.Module):
    """How to load full (one-process) weights into this model: None (the model's own
    load_state_dict) unless it is sharded by FSDP2, where each rank keeps its shard of them."""
    if not _is_fsdp(model):
        return None

    def load(model: nn.Module, weights: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))

    return load


def load_optimizer(model: nn.Module):
    """How to load a saved (one-process format) optimizer state into this model's optimizer."""
    if not _is_fsdp(model):
        return None

    def load(optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(model, optimizer)
        if len(state["state"]) > len(names) or any(not 0 <= int(i) < len(names) for i in state["state"]):
            raise ValueError(f"the saved optimizer state has {len(state['state'])} parameters, "
                             f"this model {len(names)}")
        by_name = {"state": {names[int(i)]: value for i, value in state["state"].items()},
                   "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                    for g in state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))

    return load


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in the optimizer's order."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _is_fsdp(model: nn.Module) -> bool:
    return hasattr(model, "set_requires_gradient_sync") and not isinstance(
        model, nn.parallel.DistributedDataParallel)
