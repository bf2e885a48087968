"""`step_flops` (the model FLOPs behind the MFU figure) against FLOPs counted by hand."""

import dataclasses

import pytest

from bytemtp import config_io
from bytemtp.model.flops import step_flops
from bytemtp.model.model import ByteMTP


@pytest.mark.parametrize("unembed", ["replicated", "shared"])
def test_step_flops_equal_a_count_by_hand(unembed):
    cfg = dataclasses.replace(config_io.tiny().model, unembed=unembed)
    D, F, V, T = 32, 128, 264, 64  # width, SwiGLU hidden width (8/3 x 32 rounded up to 64), vocabulary, context
    assert (cfg.d_model, cfg.ffn_dim, cfg.seq_len, cfg.n_future, cfg.total_layers) == (D, F, T, 8, 10)
    # forward FLOPs a token, 2 per multiply-add:
    projections = 2 * (D * 3 * D + D * D)  # qkv and out:  8 D^2 = 8,192
    mlp = 2 * (D * 2 * F + F * D)  # SwiGLU up (gate and value) and down:  6 D F = 24,576
    attention = 2 * (T // 2) * D * 2  # QK^T and AV over T / 2 keys on average (causal):  2 T D = 4,096
    blocks = 10 * (projections + mlp + attention)  # 2 trunk layers and 8 one-layer heads:  368,640
    unembedding = 8 * 2 * D * V  # every head unembeds, through its own matrix or the shared one:  135,168
    per_token = 3 * (blocks + unembedding)  # forward, and backward at twice the forward
    assert per_token == 1_511_424
    model = ByteMTP(cfg)
    assert step_flops(model, 2 * T, T) == 2 * T * per_token


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12),
                                       ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200 NVL", 835e12),
                                       ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA GeForce RTX 4090", None)])
def test_the_peak_of_a_gpu_is_its_dense_bf16_peak_by_its_name(monkeypatch, name, peak):
    import torch

    from bytemtp.model.flops import peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    assert peak_flops(torch.device("cuda")) == peak
    assert peak_flops(torch.device("cpu")) is None and peak_flops(torch.device("cpu"), 1e12) == 1e12
