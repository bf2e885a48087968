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
