"""Decoding: plain one-byte-per-pass decoding (the reference) and self-speculative decoding.

A stack of small functions in the manner of gpt-fast: `prefill` runs the prompt through the
model into a preallocated `KVCache`; `next_byte` picks a byte from the next-byte head's logits
(greedy, or sampling with temperature, top-k and top-p through a seeded `torch.Generator`);
`generate` loops until EOS, a stop string or `max_bytes`. It is the reference that the fast
path, `generate_batch`, is tested against: many prompts at once, heads 2..k drafting and the
next-byte head verifying (greedy: identical output; sampling: the speculative sampling rule,
identical distribution), each row accepting its own number of bytes per pass.

Generation starts a new document: the prompt is preceded by EOS, as every document is in the
packed training stream. The model never emits BOS, PAD or the padding ids above them; EOS ends
the output and is not part of it. Prompt plus output must fit in the context (model.seq_len):
a longer request is a clear error, not a silent truncation.
"""

from __future__ import annotations

import json
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


def _greedy(logits_TV: torch.Tensor) -> list:
    """Masked argmax over the last dim (nested lists for more dims): what greedy decoding picks."""
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


def _sample(probs_NV: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    return torch.multinomial(probs_NV, 1, generator=generator)[:, 0].tolist()


def verify_sampled(p_TV: torch.Tensor, q_DV: torch.Tensor, drafts: list[int],
                   generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023): how many drafts to accept and the byte after.

    Draft j was drawn from q[j]; p[j] is the target (head 1 after everything before draft j),
    with p[len(drafts)] the one after the last draft. Draft j is accepted with probability
    min(1, p[j][d] / q[j][d]); at the first rejection the next byte comes from
    norm(max(0, p[j] - q[j])), and when all are accepted from p[len(drafts)] (the bonus byte).
    Every emitted byte then has exactly the target distribution.
    """
    for j, d in enumerate(drafts):
        ratio = float(p_TV[j, d]) / float(q_DV[j, d])
        u = torch.rand((), generator=generator, device=generator.device if generator is not None else "cpu")
        if float(u) < min(1.0, ratio):
            continue
        residual = (p_TV[j] - q_DV[j]).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: rejection had probability ~0
            residual = p_TV[j]
        return j, _sample((residual / residual.sum())[None], generator)[0]
    return len(drafts), _sample(p_TV[len(drafts)][None], generator)[0]


class _Row:
    """One prompt's decoding: its output rules, the byte due next and the drafts after it."""

    def __init__(self, out: _Output, k: int):
        self.out, self.k = out, k
        self.nxt, self.drafts, self.q = 0, [], None

    def propose(self, logits_KV: torch.Tensor | list[int], sampling: Sampling, nxt: int | None = None) -> None:
        """Take head 1's next byte (unless already chosen) and heads 2..k's drafts at one position:
        from the heads' greedy picks (a list), or by sampling their logits (K, V)."""
        if isinstance(logits_KV, list):
            self.nxt = logits_KV[0] if nxt is None else nxt
            self.drafts = logits_KV[1:]
            return
        probs = distribution(logits_KV, sampling)
        self.nxt = _sample(probs[:1], sampling.generator)[0] if nxt is None else nxt
        self.q = probs[1:]
        self.drafts = _sample(self.q, sampling.generator) if self.k > 1 else []


def _picks(logits: torch.Tensor, sampling: Sampling):
    """Greedy: the masked argmax of every head at every position, as nested lists (one transfer).
    Sampling: the logits as float32 on the CPU, where the generator draws."""
    if sampling.temperature == 0:
        return _greedy(logits)
    gen = sampling.generator
    return logits.float() if gen is not None and gen.device == logits.device else logits.float().cpu()


@torch.inference_mode()
def generate_batch(model: ByteMTP, prompts: list[bytes], *, max_bytes: int, heads: int | None = None,
                   speculative: bool = True, sampling: Sampling | None = None, stop: tuple[bytes, ...] = (),
                   on_bytes: Callable[[int, bytes], None] | None = None,
                   stacked: bool = True) -> list[Generation]:
    """Decode many prompts at once; self-speculative unless `speculative` is False.

    At each row's newest position head 1 gives the next byte and heads 2..k draft the k-1
    bytes after it. One forward pass over [next byte, drafts] of every row verifies the drafts
    with head 1: greedy accepts a draft while head 1, run on everything before it, picks it;
    sampling accepts by the rule of `verify_sampled`. Each row's cache rewinds past its own
    rejected drafts, and the same pass gives its next byte and new drafts. Greedy output equals
    plain greedy decoding byte for byte (up to float ties between chunked and one-at-a-time
    attention), and every row equals that row decoded alone; sampled output has exactly the
    model's distribution. Rows leave the batch as they finish. With `speculative` False the same
    loop emits one byte per row per pass (k = 1). `on_bytes(row, piece)` streams each row's
    output. The heads run as one stacked layer (`ByteMTP.stack_heads`) unless `stacked` is False.
    """
    sampling = sampling or Sampling()
    k = (heads or model.config.n_future) if speculative else 1
    if not 1 <= k <= model.config.n_future:
        raise ValueError(f"heads={k} is not allowed; the model has {model.config.n_future} heads (1..)")
    if not prompts:
        return []
    for prompt in prompts:
        check_fits(model, prompt, max_bytes)
    t0 = time.perf_counter()
    rows = [_Row(_Output(SpeculativeStats(drafted=[0] * (k - 1), accepted=[0] * (k - 1)),
                         max_bytes=max_bytes, stop=stop,
                         on_bytes=None if on_bytes is None else (lambda piece, r=r: on_bytes(r, piece))), k)
            for r in range(len(prompts))]
    if max_bytes == 0:
        for row in rows:
            row.out.stats.stopped_by = "max_bytes"
        return [row.out.result(t0) for row in rows]
    device = model.embed.weight.device
    heads_fast = model.stack_heads(k) if stacked and k > 1 else None
    cache = KVCache.for_model(model, batch_size=len(prompts))
    # prefill, right-padded: each row then rewinds to its own length
    lengths = [1 + len(p) for p in prompts]
    ids = torch.full((len(prompts), max(lengths)), EOS, dtype=torch.long)
    for r, prompt in enumerate(prompts):
        ids[r, 1:lengths[r]] = torch.tensor(list(prompt), dtype=torch.long)
    logits = model.logits(ids.to(device), cache, n_heads=k, stacked=heads_fast)
    longest = max(lengths)
    cache.rewind([longest - n for n in lengths])
    last = _picks(logits[torch.arange(len(prompts)), torch.tensor(lengths) - 1], sampling)  # (B, K, ...)
    for r, row in enumerate(rows):
        row.propose(last[r], sampling)
        row.out.stats.forward_passes = 1
    active = list(rows)
    seq_len = model.config.seq_len
    while True:
        active = _drop_finished(cache, active, [row.out.emit(row.nxt) for row in active])
        if not active:
            break
        # every row feeds T ids; row i offers its first n_off[i] drafts, the rest count as rejected
        T = 1 + min(k - 1, seq_len - max(cache.lengths) - 1)
        n_off = [min(T - 1, max_bytes - len(row.out.data)) for row in active]
        fed = torch.tensor([[row.nxt, *row.drafts[:T - 1]] for row in active], device=device)
        picks = _picks(model.logits(fed, cache, n_heads=k, stacked=heads_fast), sampling)  # (B, T, K, ...)
        kept, done = [], []
        for i, row in enumerate(active):
            stats = row.out.stats
            stats.forward_passes += 1
            offered = row.drafts[:n_off[i]]
            if sampling.temperature == 0:
                n_ok = 0
                while n_ok < len(offered) and offered[n_ok] == picks[i][n_ok][0]:
                    n_ok += 1
                nxt = picks[i][n_ok][0]
            else:
                p = distribution(picks[i, :n_off[i] + 1, 0], sampling)
                n_ok, nxt = verify_sampled(p, row.q, offered, sampling.generator)
            for j in range(len(offered)):
                stats.drafted[j] += 1
                stats.accepted[j] += j < n_ok
            kept.append(T - 1 - n_ok)
            done.append(any(row.out.emit(byte) for byte in offered[:n_ok]))
            row.propose(picks[i][n_ok], sampling, nxt=nxt)
        cache.rewind(kept)
        active = _drop_finished(cache, active, done)
    return [row.out.result(t0) for row in rows]


def _drop_finished(cache: KVCache, active: list[_Row], finished: list[bool]) -> list[_Row]:
    if not any(finished):
        return active
    keep = [i for i, f in enumerate(finished) if not f]
    if keep:
        cache.keep(keep)
    return [active[i] for i in keep]


def generate_speculative(model: ByteMTP, prompt: bytes, *, max_bytes: int, heads: int | None = None,
                         sampling: Sampling | None = None, stop: tuple[bytes, ...] = (),
                         on_bytes: Callable[[bytes], None] | None = None,
                         stacked: bool = True) -> Generation:
    """Self-speculative decoding of one prompt (see `generate_batch`)."""
    return generate_batch(model, [prompt], max_bytes=max_bytes, heads=heads, sampling=sampling, stop=stop,
                          on_bytes=None if on_bytes is None else (lambda _, piece: on_bytes(piece)),
                          stacked=stacked)[0]


def load_prompts(path, field: str = "prompt") -> list[bytes]:
    """Prompts from a JSONL file, one object a line with the prompt text in `field`; blank lines
    are skipped. A bad line is an error naming the file and the line."""
    prompts = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{number} is not JSON ({e}); expected {{\"{field}\": \"...\"}} "
                                 "on each line") from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise ValueError(f"{path}:{number} has no string field {field!r}; expected "
                                 f"{{\"{field}\": \"...\"}} on each line")
            prompts.append(record[field].encode("utf-8", "surrogatepass"))
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts
