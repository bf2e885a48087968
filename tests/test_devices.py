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


def test_a_batch_goes_to_an_accelerator_from_pinned_memory_without_waiting_and_to_the_cpu_as_it_is():
    from bytemtp.model.transfer import batch_to_device
    from bytemtp.runtime.host import HostTransfers
    from bytemtp.runtime.standin import StandIn

    ids = torch.arange(6).reshape(2, 3)
    with StandIn() as device, HostTransfers() as transfers:
        moved = batch_to_device(ids, device)
        plain = ids.to(device)  # the copy it avoids: from pageable memory, the host waits
    assert moved.device == device and transfers.copies == 1, transfers.sites
    assert [s for s in transfers.sites if "copie" in s] == [next(s for s in transfers.sites if "test_devices" in s)]
    assert batch_to_device(ids, CPU) is ids
