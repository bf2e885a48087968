"""Choosing bytes from the next-byte head: greedy picks, sampling (temperature, top-k, top-p
through a seeded `torch.Generator`, on the logits' device), and the speculative sampling rule.
The ids generation may emit (the bytes, EOS and a BPE baseline's merged tokens) are named once,
in `bytemtp.model.draft.emitted_ids`, and masked here; the likelihood's greedy flag asks
`greedy_ids` too, so it says what greedy decoding would write.

Legend: N rows (any leading dimensions), T positions, D drafts, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bytemtp.model.draft import emitted_ids

_MASKS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _allowed(logits: torch.Tensor) -> torch.Tensor:
    """The mask of ids generation may emit (`emitted_ids`) for logits of this width, on their device."""
    key = (logits.shape[-1], logits.device)
    mask = _MASKS.get(key)
    if mask is None:
        mask = _MASKS[key] = emitted_ids(logits.shape[-1]).to(logits.device)
    return mask


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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def distribution(logits_V: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Probabilities over the vocabulary after masking, temperature, top-k and top-p."""
    allowed = _allowed(logits_V)
    logits = logits_V.float().masked_fill(~allowed, float("-inf"))
    logits = logits / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, int(allowed.sum()))).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, dim=-1)
        outside = sorted_p.cumsum(-1) - sorted_p >= sampling.top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def masked_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits (..., V) in float32 with every id generation never emits (BOS, PAD, the padding
    ids) at -inf: what greedy choices and draft candidates rank."""
    return logits.float().masked_fill(~_allowed(logits), float("-inf"))


def _sample(probs_NV: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    if generator is not None and generator.device != probs_NV.device:
        probs_NV = probs_NV.to(generator.device)
    return torch.multinomial(probs_NV, 1, generator=generator)[:, 0].tolist()


def greedy_ids(logits_NV: torch.Tensor) -> torch.Tensor:
    """The greedy choice in each row of logits (..., V): the argmax over the ids that generation
    may emit (the bytes and EOS; never BOS, PAD or the padding ids), as (...,) ids."""
    return masked_logits(logits_NV).argmax(dim=-1)


def next_byte(logits_V: torch.Tensor, sampling: Sampling) -> int:
    """One id from the next-byte head's logits (V,)."""
    if sampling.greedy:
        return int(greedy_ids(logits_V))
    return _sample(distribution(logits_V, sampling)[None], sampling.generator)[0]


def verify_sampled(p_TV: torch.Tensor, q_DV: torch.Tensor, drafts: list[int],
                   generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023): how many drafts to accept and the byte after.

    Draft j was drawn from q[j]; p[j] is the target (head 1 after everything before draft j),
    with p[len(drafts)] the one after the last draft. Draft j is accepted with probability
    min(1, p[j][d] / q[j][d]); at the first rejection the next byte comes from
    norm(max(0, p[j] - q[j])), and when all are accepted from p[len(drafts)] (the bonus byte).
    Every emitted byte then has exactly the target distribution. One uniform per draft is drawn
    at once, and one transfer says where the first rejection is.
    """
    n = len(drafts)
    if n:
        idx = torch.tensor(drafts, device=p_TV.device)
        rows = torch.arange(n, device=p_TV.device)
        ratio = p_TV[rows, idx] / q_DV[rows, idx]
        u = torch.rand(n, generator=generator, device=generator.device if generator is not None else "cpu")
        rejected = (u.to(ratio.device) >= ratio.clamp(max=1.0)).tolist()
        for j, bad in enumerate(rejected):
            if bad:
                residual = (p_TV[j] - q_DV[j]).clamp(min=0.0)
                if float(residual.sum()) <= 0.0:  # p == q up to rounding: rejection had probability ~0
                    residual = p_TV[j]
                return j, _sample((residual / residual.sum())[None], generator)[0]
    return n, _sample(p_TV[n][None], generator)[0]
