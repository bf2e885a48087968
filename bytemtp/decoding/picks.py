"""What a pass's logits say, brought to the host in one transfer.

A decoding pass needs, at every node of every row, head 1's choice there and the heads' drafts
after it; nothing else of the logits (B, T, K, V) leaves the device. `greedy_picks` computes them
for greedy rows (head 1's masked argmax, each draft head's `TREE_RANKS` best ids), inside the
compiled step where one runs; `sampled_picks` overwrites the rows that sample with the Gumbel-max
picks by output position (`sampling.pick`'s rule, on the device: head 1's pick at node t is the
byte at position at + t, head k's draft there the byte at at + t + k - 1); `confident_depths` adds,
where the decoder's confidence is on, how many leading depths of each node's top chain are sure
enough. `Picks.read` then takes the whole table to the host with one `tolist`: the pass's one
device-to-host transfer, counted in each row's statistics (`host_reads`), so that a GPU waits for
its queued work once a pass, not once a row or a head.

Layout of a node's entry: [pick, head 2's ranks..., head 3's ranks..., ..., (sure)], ids as int64;
a sampled row repeats its one draft over the ranks; -1 marks a pick over a distribution with a NaN.

Legend: B rows, T nodes, K heads, V vocabulary, R ranks (`TREE_RANKS`).
"""

from __future__ import annotations

import torch

from bytemtp.decoding.drafting import TREE_RANKS
from bytemtp.decoding.sampling import allowed_count, allowed_mask, gumbel_at, scaled_probs
from bytemtp.model.transfer import to_device
from bytemtp.vocab import BYTES


def greedy_picks(logits_BTKV: torch.Tensor, allowed_V: torch.Tensor) -> torch.Tensor:
    """(B, T, 1 + (K - 1) R) ids: head 1's masked argmax at each node, then each draft head's
    `TREE_RANKS` best ids (masked: never BOS, PAD or padding ids). Traceable: the compiled step
    runs it in its graph."""
    masked = logits_BTKV.float().masked_fill(~allowed_V, float("-inf"))
    picks = masked[:, :, 0].argmax(-1)[..., None]
    if masked.shape[2] == 1:
        return picks
    cands = masked[:, :, 1:].topk(TREE_RANKS, dim=-1).indices
    return torch.cat([picks, cands.flatten(2)], dim=-1)


def confident_depths(logits_BTKV: torch.Tensor, allowed_V: torch.Tensor, confidence: float) -> torch.Tensor:
    """(B, T, 1): at each node, the leading depths of the draft heads' top chain whose
    probabilities multiply to at least `confidence` (`Decoder.confidence`)."""
    masked = logits_BTKV[:, :, 1:].float().masked_fill(~allowed_V, float("-inf"))
    if masked.shape[2] == 0:
        return torch.zeros(*logits_BTKV.shape[:2], 1, dtype=torch.long, device=logits_BTKV.device)
    top = masked.max(-1).values - masked.logsumexp(-1)
    return (top.cumsum(-1).exp() >= confidence).sum(-1, keepdim=True)


def sampled_picks(logits_BTKV: torch.Tensor, sampling, *, keys: list[int], ats: list[int],
                  vocab_size: int = BYTES.size) -> torch.Tensor:
    """(B, T, 1 + (K - 1) R) ids of rows that sample alike (one `Sampling`): the Gumbel-max picks of
    each head at each node by output position (row b, node t, head k: position ats[b] + t + k - 1,
    drawn with keys[b]), each draft repeated over the ranks; -1 where the distribution holds a NaN.
    The rows run together, value for value as `sampling.pick` draws each alone."""
    B, T, K, V = logits_BTKV.shape
    device = logits_BTKV.device
    top_k = min(sampling.top_k, allowed_count(logits_BTKV, vocab_size)) if sampling.top_k else 0
    probs = scaled_probs(logits_BTKV, allowed_mask(logits_BTKV, vocab_size), sampling.temperature, top_k=top_k,
                         top_p=sampling.top_p if sampling.top_p < 1.0 else None)  # (B, T, K, V)
    positions = (to_device(ats, device)[:, None, None] + torch.arange(T, device=device)[:, None]
                 + torch.arange(K, device=device))  # (B, T, K)
    keys_t = to_device(keys, device)[:, None, None, None]
    support = max(1, int((probs > 0).sum(-1).max())) if device.type == "cpu" else V  # a sync elsewhere: all ids
    if 2 * support <= V:  # noise for the ids that can win only: an id of p = 0 never does
        ids = probs.topk(support, dim=-1).indices.sort(dim=-1).values  # in id order: ties go as argmax's
        scores = probs.gather(-1, ids).double().log() + gumbel_at(keys_t, positions, ids=ids)
        picks = ids.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
    else:
        picks = (probs.double().log() + gumbel_at(keys_t, positions, V)).argmax(-1)
    picks = picks.masked_fill(torch.isnan(probs).any(-1), -1)
    if K == 1:
        return picks
    return torch.cat([picks[..., :1], picks[..., 1:, None].expand(B, T, K - 1, TREE_RANKS).flatten(2)], dim=-1)


class Picks:
    """One pass's picks on the host (`read`): `pick(b, t)` head 1's id at row b's node t,
    `cands(b, t)` the heads' ranked ids there ([depth - 1][rank]), `sure(b, t)` the confident
    depths (with confidence on)."""

    def __init__(self, table: list, heads: int, confident: bool):
        self.table, self.heads, self.confident = table, heads, confident

    @classmethod
    def read(cls, picks_BTW: torch.Tensor, rows, *, heads: int, confident: bool = False) -> Picks:
        """The table on the host: the pass's one device-to-host transfer, counted in the
        statistics of each of `rows`."""
        table = picks_BTW.tolist()
        for row in rows:
            row.stats.host_reads += 1
        return cls(table, heads, confident)

    def pick(self, b: int, t: int) -> int:
        pick = self.table[b][t][0]
        if pick < 0:  # as torch.multinomial refuses it
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return pick

    def cands(self, b: int, t: int) -> list[list[int]]:
        entry = self.table[b][t]
        return [entry[1 + d * TREE_RANKS:1 + (d + 1) * TREE_RANKS] for d in range(self.heads - 1)]

    def sure(self, b: int, t: int) -> int:
        return self.table[b][t][-1]


def pass_picks(logits_BTKV: torch.Tensor, rows, ats: list[int], allowed_V: torch.Tensor, *,
               confidence: float = 0.0, greedy_BTW: torch.Tensor | None = None,
               vocab_size: int = BYTES.size) -> torch.Tensor:
    """The picks of a pass (B, T, W) on the device: the greedy ones (`greedy_BTW` where the
    compiled step made them), the sampled rows' in their place (each at its output position
    `ats[b]`, the position of head 1's pick at node 0), and the confident depths if asked.
    `allowed_V` is `sampling.allowed_mask` for the model's `vocab_size`."""
    picks = greedy_picks(logits_BTKV, allowed_V) if greedy_BTW is None else greedy_BTW
    groups: dict[tuple, list[int]] = {}  # rows that sample alike run together
    for b, row in enumerate(rows):
        if not row.sampling.greedy and not row.pad:
            s = row.sampling
            groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(b)
    if groups:
        picks = picks.clone()
    for bs in groups.values():
        index = to_device(bs, picks.device)
        logits = logits_BTKV[index] if logits_BTKV.device.type != "mps" else logits_BTKV[index].cpu()  # no float64 there
        picks[index] = sampled_picks(logits, rows[bs[0]].sampling, keys=[rows[b].key for b in bs],
                                     ats=[ats[b] for b in bs], vocab_size=vocab_size).to(picks.device)
    if confidence:
        picks = torch.cat([picks, confident_depths(logits_BTKV, allowed_V, confidence)], dim=-1)
    return picks
