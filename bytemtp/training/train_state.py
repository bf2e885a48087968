"""What a run resumes besides its weights and optimizer state: `TrainState`, the training loop's
counters and every rank's loader position and RNG state, with a state dict like the loader's. It is
what a checkpoint's train_state.json holds; the loop (`bytemtp.training.train`) saves it and
restores it in one place. RNG states travel as base64 text, so the file stays plain JSON.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import torch

from bytemtp.data.loader import ByteLoader, combine_stats
from bytemtp.runtime import distributed as dist_lib
from bytemtp.runtime.devices import rng_state, set_rng_state


def _encoded_rng(device: torch.device) -> dict:
    """The device's random state as text, for train_state.json."""
    return {name: base64.b64encode(t.numpy().tobytes()).decode() for name, t in rng_state(device).items()}


def _restore_rng(state: dict, device: torch.device) -> None:
    set_rng_state({name: torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
                   for name, text in state.items()}, device)


@dataclass
class TrainState:
    """What a run resumes besides its weights and optimizer state (which the checkpoint keeps in
    files of their own): the loop's counters, and every rank's loader position and RNG state.
    `state_dict` gathers the ranks' parts, so every rank calls it; `load_state_dict` takes this
    rank's part, and refuses the state of another number of processes."""

    loader: ByteLoader
    d: dist_lib.Dist
    step: int = 0
    bytes_seen: int = 0
    elapsed_s: float = 0.0  # training time over every session of the run
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient
    bad_run: int = 0  # of those, how many in a row up to now
    val_bpb: list[float] | None = None  # the last validation
    schedule_steps: int = 0  # the schedule's length where it was fitted to a time budget (0: not)
    head_schedule_steps: int = 0  # the heads' schedule's length, where the time fit's first estimate gave it

    def state_dict(self) -> dict:
        d = self.d
        return {"step": self.step, "bytes_seen": self.bytes_seen, "elapsed_s": self.elapsed_s,
                "skipped_steps": self.skipped_steps, "bad_run": self.bad_run, "val_bpb": self.val_bpb,
                "schedule_steps": self.schedule_steps, "head_schedule_steps": self.head_schedule_steps,
                "world_size": d.world_size,
                "loaders": dist_lib.gather(self.loader.state_dict(), d),
                "loader_stats": combine_stats(dist_lib.gather(self.loader.stats(), d)),
                "rngs": dist_lib.gather(_encoded_rng(d.device), d)}

    def load_state_dict(self, state: dict) -> None:
        d = self.d
        loaders = state.get("loaders", [state.get("loader")])  # (one-process runs once saved one)
        if len(loaders) != d.world_size:
            raise ValueError(f"it was saved by {len(loaders)} process(es) and this run has {d.world_size}: "
                             f"each reads its own share of the corpus, so resume with {len(loaders)} "
                             "(torchrun --nproc-per-node, --nnodes) or start a new run")
        self.loader.load_state_dict(loaders[d.rank])
        _restore_rng(state.get("rngs", [state.get("rng")])[d.rank], d.device)
        self.step, self.bytes_seen, self.elapsed_s = state["step"], state["bytes_seen"], state["elapsed_s"]
        self.skipped_steps, self.bad_run, self.val_bpb = state["skipped_steps"], state["bad_run"], state.get("val_bpb")
        self.schedule_steps = state.get("schedule_steps", 0)
        self.head_schedule_steps = state.get("head_schedule_steps", 0)
