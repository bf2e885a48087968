"""Host values onto a device without making the host wait.

A copy from pageable host memory to a GPU waits for all the device's queued work first: a
synchronisation per call, which a decoding pass or a training step cannot afford. So host values
(a layout's row starts, a tree's slots, a batch of ids) travel through pinned memory with
`non_blocking`, on the machine's accelerator (CUDA on a GPU; `runtime.standin`'s stand-in on the
CPU); to the CPU itself a tensor is made where it is used. `runtime.host.HostTransfers` counts any
copy that still waits.
"""

from __future__ import annotations

import torch


def pins(device: torch.device) -> bool:
    """Whether host tensors travel to `device` through pinned memory: the machine's accelerator."""
    device = torch.device(device)
    if device.type == "cpu" or not torch.accelerator.is_available():
        return False
    return device.type == torch.accelerator.current_accelerator().type


def batch_to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: on an accelerator copied into pinned memory first, so that the copy
    is asynchronous (`non_blocking`); elsewhere a plain `.to` (the CPU's tensor is the tensor itself)."""
    if pins(device):
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


def to_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A tensor of host values (nested lists of numbers) on `device`, without waiting (`batch_to_device`)."""
    if not pins(device):
        return torch.tensor(values, dtype=dtype, device=device)
    return batch_to_device(torch.tensor(values, dtype=dtype, device="cpu"), device)
