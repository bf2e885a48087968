"""Model FLOPs of a training step, the peak of the device it runs on, and model FLOP utilisation (MFU)."""

from __future__ import annotations

import torch

from bytemtp.model.model import ByteMTP

# dense bf16 peak of GPUs we know, for model FLOP utilisation: the first name that the device's
# name holds wins, so a PCIe or NVL card (a lower clock and power) comes before its SXM form
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H200": 989e12, "H100": 989e12,
                   "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def step_flops(model: ByteMTP, tokens: int, seq_len: int) -> float:
    """FLOPs of forward + backward: 6 per matmul weight per token, plus causal attention. The
    matmul weights are the 2-D parameters but the embedding (a lookup); a shared unembedding
    counts once per head, since every head multiplies by it, and the norms' weights not at all."""
    cfg = model.config
    weights = sum(p.numel() for p in model.parameters() if p.dim() == 2) - model.embed.weight.numel()
    weights += (cfg.n_future - len(model.unembed)) * model.unembed[0].weight.numel()  # shared: K uses
    attention = 6 * cfg.total_layers * seq_len * cfg.d_model  # QK^T and AV, causal half, fwd + bwd
    return tokens * (6 * weights + attention)


def peak_flops(device: torch.device, configured: float = 0.0) -> float | None:
    """The peak FLOP/s that model FLOP utilisation is a share of: `configured` (train.peak_flops)
    when set, else the dense bf16 peak of the GPU behind `device` when it is one we know; None
    otherwise (a CPU's peak depends on its cores, clock and vector units: state it to see MFU)."""
    if configured:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def utilisation(flops_per_step: float, step_s: float, peak: float | None, *, devices: int = 1) -> float | None:
    """Model FLOP utilisation of a step: its model FLOPs a second over the peak of `devices`
    devices (None where the peak is not known)."""
    return flops_per_step / step_s / (peak * devices) if peak and step_s > 0 else None
