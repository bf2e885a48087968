"""Choosing bytes from the next-byte head: greedy picks, sampling (temperature, top-k, top-p), and
the speculative sampling rule. The ids generation may emit (the bytes, EOS and a BPE baseline's
merged tokens) are named once, in `bytemtp.vocab.emitted`, and masked here; the
likelihood's greedy flag asks `greedy_ids` too, so it says what greedy decoding would write. The
mask follows the model's vocabulary size (`vocab_size`, bytes by default), not the logits' width:
a BPE's table has padding rows past its ids.

Sampling draws by position, so that a seed repeats a sample whatever drafts the passes made. A
sampled row takes one key from its `Sampling.generator` when it starts (`Sampling.draw_key`), and
the byte at output position i is the Gumbel-max pick `argmax_x(log p_i(x) + g(key, i, x))`, where
g is Gumbel noise that a counter-based hash makes from (key, i, x) alone (`gumbel`). Gumbel-max
draws x with probability exactly p_i(x) (the noise of different positions is independent), and
which byte comes out at position i is a function of the key, the position and the model's
distribution there, not of how many passes, drafts or rows came before it. Speculative sampling
then draws each head's draft with the noise of the position it drafts (`pick` over q) and accepts a
draft while it equals that pick over p (`verify_sampled`): the output is the output of plain
sampling with the same key, exactly as speculative greedy output is plain greedy output, and its
distribution is the model's whatever the drafts were. This is the drafter-invariant coupling of
Daliri, Musco and Suresh (2024, "Coupling without communication and drafter-invariant
speculative decoding"): a draft is accepted with probability P(argmax(log p + g) = argmax(log q +
g)) >= (1 - TV(p, q)) / (1 + TV(p, q)), somewhat below Leviathan et al.'s rule (1 - TV), whose
draws depend on the drafts; the drafts' own distribution never matters for exactness.

Legend: N rows (any leading dimensions), T positions, D drafts, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from bytemtp.model.transfer import to_device
from bytemtp.vocab import BYTES, emitted

_MASKS: dict[tuple[int, torch.device], torch.Tensor] = {}
_COUNTS: dict[tuple[int, torch.device], int] = {}  # how many ids each mask allows


def allowed_mask(logits: torch.Tensor, vocab_size: int = BYTES.size) -> torch.Tensor:
    """The mask of ids generation may emit (`vocab.emitted`) for a model of `vocab_size` ids
    (`ModelConfig.vocab_size`), on the logits' device."""
    key = (vocab_size, logits.device)
    mask = _MASKS.get(key)
    if mask is None:
        ids = emitted(vocab_size)
        mask = _MASKS[key] = to_device(ids, logits.device, torch.bool)
        _COUNTS[key] = sum(ids)  # counted on the host: no read of the device, at every top-k or once
    assert mask.shape[-1] == logits.shape[-1], f"logits of {logits.shape[-1]} ids for a vocabulary of {vocab_size}"
    return mask


SEED_RANGE = (-2 ** 63, 2 ** 64 - 1)  # the seeds a torch.Generator takes


@dataclass
class Sampling:
    """How a byte is chosen from the next-byte distribution; a temperature below `GREEDY_BELOW`
    (0 included) is greedy, and is made 0 when the value is made, so that every reader of
    `temperature` (the batched picks group rows by it) sees greedy decoding as 0: dividing the
    logits by a temperature that small overflows, and its distribution is the greedy pick anyway."""

    GREEDY_BELOW: ClassVar[float] = 1e-5  # a smaller temperature decodes greedily (as vLLM does)

    temperature: float = 0.0
    top_k: int = 0  # 0: all
    top_p: float = 1.0
    generator: torch.Generator | None = None  # where each sampled row draws its key (`draw_key`)

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is not allowed; expected a finite number >= 0 (0 = greedy)")
        self.temperature = self.effective_temperature(self.temperature)
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is not allowed; expected >= 0 (0 = all)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} is not allowed; expected 0 < top_p <= 1")

    @classmethod
    def effective_temperature(cls, temperature: float) -> float:
        """The temperature that decodes as `temperature` does: 0 below `GREEDY_BELOW`, else itself."""
        return 0.0 if temperature < cls.GREEDY_BELOW else temperature

    @property
    def greedy(self) -> bool:
        return self.temperature < self.GREEDY_BELOW

    def draw_key(self) -> int:
        """A sampled row's key (63 bits), drawn from the generator when the row starts: every byte
        the row samples is then a function of the key and its position (`pick`)."""
        device = self.generator.device if self.generator is not None else "cpu"
        return int(torch.randint(0, 1 << 62, (), generator=self.generator, device=device))


def allowed_count(logits: torch.Tensor, vocab_size: int = BYTES.size) -> int:
    """How many ids `allowed_mask` allows for a vocabulary of `vocab_size` ids (counted once, when
    the mask is made)."""
    allowed_mask(logits, vocab_size)
    return _COUNTS[vocab_size, logits.device]


def distribution(logits_V: torch.Tensor, sampling: Sampling, *, vocab_size: int = BYTES.size) -> torch.Tensor:
    """Probabilities over the vocabulary after masking, temperature, top-k and top-p."""
    allowed = allowed_mask(logits_V, vocab_size)
    top_k = min(sampling.top_k, allowed_count(logits_V, vocab_size)) if sampling.top_k else 0
    return scaled_probs(logits_V, allowed, sampling.temperature, top_k=top_k,
                        top_p=sampling.top_p if sampling.top_p < 1.0 else None)


def scaled_probs(logits: torch.Tensor, allowed: torch.Tensor, temperature: float | torch.Tensor, *,
                 top_k: int = 0, top_p: float | torch.Tensor | None = None) -> torch.Tensor:
    """`distribution`'s arithmetic: the allowed ids' logits over the temperature, the top k kept
    (0: all), softmax, the smallest set reaching top_p kept (None: all) and renormalised; the
    temperature and top_p a number, or tensors that broadcast (one a row: the compiled picks)."""
    logits = logits.float().masked_fill(~allowed, float("-inf")) / temperature
    if top_k:
        kth = torch.topk(logits, top_k).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        sorted_p, order = torch.sort(probs, descending=True, dim=-1)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def masked_logits(logits: torch.Tensor, *, vocab_size: int = BYTES.size) -> torch.Tensor:
    """The logits (..., V) in float32 with every id generation never emits (BOS, PAD, the padding
    ids) at -inf: what greedy choices and draft candidates rank."""
    return logits.float().masked_fill(~allowed_mask(logits, vocab_size), float("-inf"))


# splitmix64 (Steele, Lea and Flood 2014) in wrapping int64 arithmetic: its increment and multipliers
_GAMMA, _M1, _M2 = (c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(z: torch.Tensor, s: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """z >> s as an unsigned 64-bit shift (torch shifts int64 arithmetically), into `out` if given."""
    out = torch.bitwise_right_shift(z, s, out=out) if out is not None else z >> s
    return out.bitwise_and_((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer, in place on z (a tensor of the caller's own): every output bit
    depends on every input bit. In place with one buffer: over a pass's (rows, nodes, heads,
    vocabulary) its temporaries had made sampled picks a third of a sampled pass's time."""
    t = torch.empty_like(z)
    for s, multiplier in ((30, _M1), (27, _M2), (31, None)):
        z ^= _shr(z, s, out=t)
        if multiplier is not None:
            z *= multiplier
    return z


def gumbel(key: int, positions: list[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gumbel noise (len(positions), vocab), each value a function of (key, position, id) alone: a
    hash of the three (splitmix64 over the key's stream of positions, then over the position's stream
    of ids) gives 53 bits of a uniform u in (0, 1), and the noise is -log(-log u). The same on every
    device that computes float64 (CPU, CUDA), and in any batch of positions."""
    return gumbel_at(key & ((1 << 63) - 1), to_device(positions, device), vocab)


def gumbel_at(keys: int | torch.Tensor, positions: torch.Tensor, vocab: int = 0, *,
              ids: torch.Tensor | None = None) -> torch.Tensor:
    """`gumbel` over positions of any shape (...,), keys (below 2^63) broadcast against them (one,
    or a tensor of one a row): noise (..., vocab), value for value the same as `gumbel`'s; or, with
    `ids` (..., m), the noise of those ids alone at each position, each value the one `gumbel` gives
    that id there."""
    pos = positions[..., None]
    if ids is None:
        ids = torch.arange(vocab, dtype=torch.int64, device=positions.device)
    stream = _mix(keys + (pos + 1) * _GAMMA)  # the position's own seed
    z = _mix(stream + (ids + 1) * _GAMMA)
    u = _shr(z, 11, out=z).double().add_(0.5).mul_(2.0 ** -53)
    return u.log_().neg_().log_().neg_()


def pick(probs_NV: torch.Tensor, key: int, positions: list[int]) -> list[int]:
    """The Gumbel-max pick of each row of probabilities (N, V), row n at output position
    positions[n]: argmax(log p + gumbel(key, position)), a draw from p that the key and the
    position decide (see the module docstring)."""
    if probs_NV.device.type == "mps":  # no float64 there
        probs_NV = probs_NV.cpu()
    noise = gumbel(key, positions, probs_NV.shape[-1], probs_NV.device)
    picks = (probs_NV.double().log() + noise).argmax(-1)
    if torch.isnan(probs_NV).any():  # a NaN would win the argmax: refuse, as torch.multinomial does
        raise RuntimeError("probability tensor contains either inf, nan or element < 0")
    return picks.tolist()


def greedy_ids(logits_NV: torch.Tensor, *, vocab_size: int = BYTES.size) -> torch.Tensor:
    """The greedy choice in each row of logits (..., V): the argmax over the ids that generation
    may emit (the bytes and EOS; never BOS, PAD or the padding ids), as (...,) ids."""
    return masked_logits(logits_NV, vocab_size=vocab_size).argmax(dim=-1)


def next_byte(logits_V: torch.Tensor, sampling: Sampling, *, key: int | None = None, at: int = 0,
              vocab_size: int = BYTES.size) -> int:
    """One id from the next-byte head's logits (V,) of a model of `vocab_size` ids: greedy, or
    sampled as the byte at output position `at` of the row whose key is `key` (`pick`; without a
    key, one drawn now)."""
    if sampling.greedy:
        return int(greedy_ids(logits_V, vocab_size=vocab_size))
    key = sampling.draw_key() if key is None else key
    return pick(distribution(logits_V, sampling, vocab_size=vocab_size)[None], key, [at])[0]


def verify_sampled(p_TV: torch.Tensor, drafts: list[int], *, key: int, at: int) -> tuple[int, int]:
    """Speculative sampling by position (see the module docstring): how many drafts to accept and
    the byte after them.

    Draft j is the draft for output position at + j; p[j] is the target there (head 1 after
    everything before draft j), with p[len(drafts)] the one after the last draft. The target's own
    pick at each position (`pick`, the byte plain sampling writes there with this key) decides:
    draft j is accepted while it equals the pick, and the byte after the accepted drafts is the pick
    at the first position that differs (or after the last draft, the bonus byte). The picks of all
    positions are drawn at once and come back in one transfer.
    """
    n = len(drafts)
    return accept_drafts(pick(p_TV[:n + 1], key, list(range(at, at + n + 1))), drafts)


def accept_drafts(picks: list[int], drafts: list[int]) -> tuple[int, int]:
    """The rule of `verify_sampled` on the picks (head 1's pick at each draft's position, then one
    after the last): drafts are accepted while each equals the pick at its position; the byte
    after them is the pick at the first that differs (or the bonus pick after the last)."""
    n = len(drafts)
    n_ok = next((j for j, d in enumerate(drafts) if d != picks[j]), n)
    return n_ok, picks[n_ok]
