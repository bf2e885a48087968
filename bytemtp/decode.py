"""Decoding: prefill, then one byte per forward pass (the reference that faster decoders match).

A stack of small functions in the manner of gpt-fast: `prefill` runs the prompt through the
model into a preallocated `KVCache`; `next_byte` picks a byte from the next-byte head's logits
(greedy, or sampling with temperature, top-k and top-p through a seeded `torch.Generator`);
`generate` loops until EOS, a stop string or `max_bytes`.

Generation starts a new document: the prompt is preceded by EOS, as every document is in the
packed training stream. The model never emits BOS, PAD or the padding ids above them; EOS ends
the output and is not part of it. Prompt plus output must fit in the context (model.seq_len):
a longer request is a clear error, not a silent truncation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from bytemtp.model import ByteMTP, KVCache
from bytemtp.vocab import EOS, VOCAB_SIZE

# ids that generation may emit: the 256 bytes and EOS
_ALLOWED = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
_ALLOWED[:256] = True
_ALLOWED[EOS] = True


@dataclass
class Sampling:
    """How a byte is chosen from the next-byte distribution; temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: all
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is not allowed; expected >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is not allowed; expected >= 0 (0 = all)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} is not allowed; expected 0 < top_p <= 1")


@dataclass
class DecodeStats:
    bytes_out: int = 0
    forward_passes: int = 0
    wall_s: float = 0.0
    stopped_by: str = ""  # eos, stop, max_bytes

    @property
    def bytes_per_forward(self) -> float:
        return self.bytes_out / max(1, self.forward_passes)


@dataclass
class Generation:
    output: bytes
    stats: DecodeStats = field(default_factory=DecodeStats)


def distribution(logits_V: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Probabilities over the vocabulary after masking, temperature, top-k and top-p."""
    logits = logits_V.float().masked_fill(~_ALLOWED.to(logits_V.device), float("-inf"))
    logits = logits / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, int(_ALLOWED.sum()))).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, dim=-1)
        outside = sorted_p.cumsum(-1) - sorted_p >= sampling.top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _greedy(logits_TV: torch.Tensor) -> list[int]:
    """Masked argmax at each position: what plain greedy decoding would pick."""
    masked = logits_TV.float().masked_fill(~_ALLOWED.to(logits_TV.device), float("-inf"))
    return masked.argmax(dim=-1).tolist()


def next_byte(logits_V: torch.Tensor, sampling: Sampling) -> int:
    """One id from the next-byte head's logits (V,)."""
    if sampling.temperature == 0:
        return _greedy(logits_V[None])[0]
    probs = distribution(logits_V, sampling)
    gen = sampling.generator
    return int(torch.multinomial(probs.cpu() if gen is not None and gen.device.type == "cpu" else probs,
                                 1, generator=gen))


def check_fits(model: ByteMTP, prompt: bytes, max_bytes: int) -> None:
    need = len(prompt) + 1 + max_bytes  # the leading EOS
    if need > model.config.seq_len:
        raise ValueError(f"prompt of {len(prompt)} bytes plus max_bytes={max_bytes} needs {need} positions, "
                         f"more than the model's context of {model.config.seq_len} bytes; shorten the "
                         f"prompt or lower --max-bytes to {max(0, model.config.seq_len - len(prompt) - 1)}")


@torch.inference_mode()
def prefill(model: ByteMTP, prompt: bytes, cache: KVCache) -> torch.Tensor:
    """Run EOS + prompt through the model; the next-byte logits (V,) at the last position."""
    device = model.embed.weight.device
    ids = torch.tensor([[EOS, *prompt]], dtype=torch.long, device=device)
    return model.logits(ids, cache, n_heads=1)[0, -1, 0]


class _Output:
    """The bytes generated so far and the rules that end generation (EOS, stop strings, max_bytes)."""

    def __init__(self, stats: DecodeStats, *, max_bytes: int, stop: tuple[bytes, ...],
                 on_bytes: Callable[[bytes], None] | None):
        self.data, self.stats, self.max_bytes = bytearray(), stats, max_bytes
        self.stop, self.on_bytes = stop, on_bytes

    def emit(self, byte: int) -> bool:
        """Append one generated id; True when generation must stop."""
        if byte == EOS:
            self.stats.stopped_by = "eos"
            return True
        self.data.append(byte)
        if self.on_bytes is not None:
            self.on_bytes(bytes([byte]))
        if any(s and self.data.endswith(s) for s in self.stop):
            self.stats.stopped_by = "stop"
            return True
        if len(self.data) >= self.max_bytes:
            self.stats.stopped_by = "max_bytes"
            return True
        return False

    def result(self, t0: float) -> Generation:
        self.stats.bytes_out = len(self.data)
        self.stats.wall_s = time.perf_counter() - t0
        return Generation(bytes(self.data), self.stats)


@torch.inference_mode()
def generate(model: ByteMTP, prompt: bytes, *, max_bytes: int, sampling: Sampling | None = None,
             stop: tuple[bytes, ...] = (), on_bytes: Callable[[bytes], None] | None = None) -> Generation:
    """Plain decoding, one byte per forward pass, until EOS, a stop string or max_bytes."""
    sampling = sampling or Sampling()
    check_fits(model, prompt, max_bytes)
    t0 = time.perf_counter()
    out = _Output(DecodeStats(), max_bytes=max_bytes, stop=stop, on_bytes=on_bytes)
    if max_bytes == 0:
        out.stats.stopped_by = "max_bytes"
        return out.result(t0)
    cache = KVCache.for_model(model, batch_size=1)
    logits = prefill(model, prompt, cache)
    out.stats.forward_passes = 1
    while not out.emit(byte := next_byte(logits, sampling)):
        ids = torch.tensor([[byte]], device=logits.device)
        logits = model.logits(ids, cache, n_heads=1)[0, -1, 0]
        out.stats.forward_passes += 1
    return out.result(t0)


@dataclass
class SpeculativeStats(DecodeStats):
    drafted: list[int] = field(default_factory=list)  # per draft position 2..k: times offered
    accepted: list[int] = field(default_factory=list)  # ... and times accepted

    @property
    def acceptance(self) -> list[float]:
        """Acceptance rate at each draft position (head 2, 3, ..., k)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)]


@torch.inference_mode()
def generate_speculative(model: ByteMTP, prompt: bytes, *, max_bytes: int, heads: int | None = None,
                         stop: tuple[bytes, ...] = (),
                         on_bytes: Callable[[bytes], None] | None = None) -> Generation:
    """Self-speculative greedy decoding (blockwise parallel decoding, Stern et al. 2018).

    At the newest position head 1 gives the next byte, which plain greedy would emit too, and
    heads 2..k draft the k-1 bytes after it. One forward pass over [next byte, drafts] verifies
    them: a draft is accepted while head 1, run on everything before it, picks it; the cache
    rewinds past the rejected ones, and the same pass yields head 1's next byte and new drafts at
    the last accepted position. The output equals plain greedy decoding byte for byte (up to
    float ties between chunked and one-at-a-time attention).
    """
    k = heads or model.config.n_future
    if not 1 <= k <= model.config.n_future:
        raise ValueError(f"heads={k} is not allowed; the model has {model.config.n_future} heads (1..)")
    check_fits(model, prompt, max_bytes)
    t0 = time.perf_counter()
    out = _Output(SpeculativeStats(drafted=[0] * (k - 1), accepted=[0] * (k - 1)),
                  max_bytes=max_bytes, stop=stop, on_bytes=on_bytes)
    stats = out.stats
    if max_bytes == 0:
        stats.stopped_by = "max_bytes"
        return out.result(t0)
    device = model.embed.weight.device
    cache = KVCache.for_model(model, batch_size=1)
    logits = model.logits(torch.tensor([[EOS, *prompt]], device=device), cache, n_heads=k)[0, -1]
    stats.forward_passes = 1
    nxt, drafts = _greedy(logits[0:1])[0], _greedy(logits[1:])  # (K, V) at the newest position
    while not out.emit(nxt):
        offered = drafts[:max_bytes - len(out.data)]  # a draft only counts if it may become output
        fed = torch.tensor([[nxt, *offered]], device=device)
        logits = model.logits(fed, cache, n_heads=k)[0]  # (1 + len(offered), K, V)
        stats.forward_passes += 1
        verdict = _greedy(logits[:, 0])  # head 1's pick after each fed byte
        n_ok = 0
        while n_ok < len(offered) and offered[n_ok] == verdict[n_ok]:
            n_ok += 1
        for j in range(len(offered)):
            stats.drafted[j] += 1
            stats.accepted[j] += j < n_ok
        cache.rewind(len(offered) - n_ok)
        if any(out.emit(byte) for byte in offered[:n_ok]):
            break
        nxt, drafts = verdict[n_ok], _greedy(logits[n_ok, 1:])
    return out.result(t0)
