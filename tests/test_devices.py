"""Devices (bytemtp.runtime.devices): the precision a training step runs in."""

from __future__ import annotations

import contextlib

import torch

from bytemtp.runtime import devices
from bytemtp.runtime.devices import autocast

CPU = torch.device("cpu")


def _dtype_of_a_matmul(ctx) -> torch.dtype:
    with ctx:
        return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


def test_bf16_and_fp32_hold_on_every_device_and_auto_follows_native_support(monkeypatch):
    assert _dtype_of_a_matmul(autocast(CPU, "bf16")) == torch.bfloat16
    assert _dtype_of_a_matmul(autocast(CPU, "fp32")) == torch.float32
    monkeypatch.setattr(devices, "native_bf16", lambda device: True)
    assert _dtype_of_a_matmul(autocast(CPU, "auto")) == torch.bfloat16
    monkeypatch.setattr(devices, "native_bf16", lambda device: False)
    assert isinstance(autocast(CPU, "auto"), contextlib.nullcontext)
    assert isinstance(autocast(torch.device("meta"), "bf16"), contextlib.nullcontext)  # no autocast there


def test_fp32_matmuls_use_tf32_only_in_a_cuda_run_not_in_fp32_and_are_restored():
    before = torch.get_float32_matmul_precision()
    with devices.fast_fp32_matmuls(torch.device("cuda"), "auto"):  # setting the flag needs no GPU
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    for device, precision in ((CPU, "auto"), (torch.device("cuda"), "fp32")):
        with devices.fast_fp32_matmuls(device, precision):
            assert torch.get_float32_matmul_precision() == before


class _Batch:
    """A stand-in for a host batch that records how it was moved."""

    def __init__(self):
        self.calls = []

    def pin_memory(self):
        self.calls.append("pin_memory")
        return self

    def to(self, device, non_blocking=False):
        self.calls.append(("to", device.type, non_blocking))
        return self


def test_a_batch_goes_to_cuda_from_pinned_memory_without_waiting_and_to_the_cpu_as_it_is():
    batch = _Batch()
    devices.batch_to_device(batch, torch.device("cuda"))
    assert batch.calls == ["pin_memory", ("to", "cuda", True)]
    ids = torch.arange(6).reshape(2, 3)
    assert devices.batch_to_device(ids, CPU) is ids
