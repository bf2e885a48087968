"""Devices: which torch device a setting names, waiting for one, its random number state, and
whether an error says that its memory ran out.

`resolve_device` turns a device setting (auto, cpu, cuda, cuda:N, mps) into a torch device, with
one clear error where the machine has no such device; every command that runs a model goes
through it. `synchronize` waits for a device's queued work (timing a GPU needs it). `rng_state`
and `set_rng_state` capture and restore the torch random state a device draws from (the CPU
generator, and the CUDA one on a GPU): the training step replays it to recompute a head with the
same dropout, and checkpoints save it so that a resumed run draws what an uninterrupted one would.
`autocast` is the context a training step and its validation run in, after train.precision:
bf16 autocast (matmuls in bf16, weights and optimizer state in fp32) on CUDA, and on a CPU that
does bf16 natively (AVX512-BF16 or AMX, where oneDNN's bf16 matmuls run about 1.5x faster than
fp32 ones), else fp32; an explicit bf16 or fp32 holds on every device. `out_of_memory` tells an
allocation that failed (torch.OutOfMemoryError on CUDA, a RuntimeError
from the CPU allocator) from other errors, so that training can say what to lower.
`fast_fp32_matmuls` lets a CUDA run's float32 matmuls use TF32 for its duration.
"""

from __future__ import annotations

import contextlib

import torch

from bytemtp import config as config_lib


def resolve_device(name: str) -> torch.device:
    """The torch device a device setting names (auto: CUDA when available, else the CPU)."""
    config_lib.check_device("device", name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name in ("standin", "standin:0"):
        if torch._C._get_privateuse1_backend_name() != "standin" or not torch.accelerator.is_available():
            raise ValueError("device 'standin' is the stand-in accelerator that tests run commands on "
                             "(bytemtp.runtime.standin.StandIn); use auto, cpu or cuda")
        return torch.device("standin", 0)
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asks for CUDA but no CUDA device is available; use auto or cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} "
                         f"CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether the device multiplies bf16 matrices natively (CUDA; a CPU with AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def autocast(device: torch.device, precision: str):
    """The context of a training step and its validation for train.precision (auto, bf16, fp32)."""
    bf16 = precision == "bf16" or (precision == "auto" and native_bf16(device))
    if not bf16 or device.type not in ("cuda", "cpu"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


@contextlib.contextmanager
def fast_fp32_matmuls(device: torch.device, precision: str):
    """For a run on CUDA whose train.precision is not fp32: float32 matmuls on TF32 tensor cores
    (torch's "high" matmul precision; bf16 autocast leaves a few in float32), restored after. A
    run in fp32, or off CUDA, keeps full float32 (the setting is process-wide: it is held only
    while the run lasts)."""
    if device.type != "cuda" or precision == "fp32":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timing a GPU needs it; the CPU runs in order)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The random state that draws on `device` use: {"cpu": ..., "cuda": ... on a GPU}."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore what `rng_state` captured."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


_NO_MEMORY = ("can't allocate memory", "could not allocate", "out of memory", "cannot allocate memory")


def out_of_memory(error: BaseException) -> bool:
    """Whether an error is a failed allocation: torch.OutOfMemoryError (CUDA), or the RuntimeError
    of the CPU allocator ("DefaultCPUAllocator: can't allocate memory") and of MPS ("out of memory")."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(words in str(error).lower() for words in _NO_MEMORY)
