"""Log-likelihoods of byte strings under the next-byte head: what an evaluation harness asks of
a language model (`bytemtp.interop.harness` serves them to lm-evaluation-harness).

Two questions, both over bytes (no tokenizer: the text's UTF-8 bytes are the ids):

- `loglikelihoods`: for (context, continuation) pairs, log p(continuation | context) and whether
  greedy decoding from the context would write the continuation (every byte of it head 1's top
  choice among the ids decoding emits, `bytemtp.decoding.sampling.greedy_ids`, given the true
  bytes before it);
- `rolling_loglikelihoods`: log p(text) of whole texts, for perplexity and bits per byte.

Every sequence starts a document, as generation does: EOS, then the context, then what is scored
(in the packed training stream every document follows an EOS). Where a sequence is longer than
the model's context, it is scored in windows by one rule, `windows`: the scored bytes are cut
into runs of at most seq_len from their start, each run predicted by one forward pass over the
seq_len ids before its last byte. So every byte is predicted once; a run after the first (a
full seq_len) is predicted from the ids of its own window only, exactly as `bytemtp eval` scores
the windows of its packed stream (stride seq_len), so a text's rolling log-likelihood equals the
nats that eval sums over the same bytes; the last, shorter run, and a continuation that fits the
context whole, get as much context before them as the window holds (lm-evaluation-harness's
rule for rolling log-likelihoods).

Windows of all requests are batched together, longest first, and right-padded: padding after a
causal window changes nothing before it.

Legend: B batch, T time, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from bytemtp.decoding.sampling import greedy_ids, masked_logits
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.vocab import EOS


@dataclass(frozen=True)
class Window:
    """One forward pass's worth of scoring: the input ids, where in them the first scored
    prediction is (inputs[first] predicts targets[0]), the target ids, and the request it serves."""

    inputs: tuple[int, ...]
    first: int
    targets: tuple[int, ...]
    request: int


def windows(context: bytes | tuple[int, ...], continuation: bytes | tuple[int, ...], *, seq_len: int,
            request: int = 0) -> list[Window]:
    """The windows that score `continuation` after EOS + `context` (see the module docstring); both
    are ids (bytes, or tuples of a BPE baseline's token ids)."""
    ids = (EOS, *context, *continuation)
    out = []
    start = 1 + len(context)  # ids[start:] are scored
    while start < len(ids):
        end = min(start + seq_len, len(ids))  # score ids[start:end]
        lo = max(0, end - 1 - seq_len)  # the seq_len ids before the last scored one
        out.append(Window(inputs=ids[lo:end - 1], first=start - 1 - lo, targets=ids[start:end], request=request))
        start = end
    return out


def _scored(model: ByteMTP, wins: list[Window], *, batch_size: int,
            progress: Callable[[int], None] | None):
    """Each window's index in `wins` with the logits (T, V) and log-probabilities (T, V), float32,
    of its scored positions: windows batched longest first and right-padded (see the module
    docstring)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is not allowed; expected >= 1")
    device = model.embed.weight.device
    was_training = model.training
    model.eval()
    try:
        order = sorted(range(len(wins)), key=lambda i: -len(wins[i].inputs))
        for first in range(0, len(order), batch_size):
            batch = [wins[i] for i in order[first:first + batch_size]]
            ids_BT = torch.full((len(batch), len(batch[0].inputs)), EOS, dtype=torch.long, device="cpu")  # staged
            for r, w in enumerate(batch):
                ids_BT[r, :len(w.inputs)] = torch.tensor(w.inputs, device="cpu")
            ids_BT = ids_BT.to(device)
            logits_BTV = model.logits(ids_BT, heads=1, layout=build_layout(model, ids_BT))[:, :, 0].float()
            logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
            for r, w in enumerate(batch):
                scored = slice(w.first, w.first + len(w.targets))
                yield order[first + r], logits_BTV[r, scored], logp_BTV[r, scored]
            if progress is not None:
                progress(len(batch))
    finally:
        model.train(was_training)


@torch.inference_mode()
def score_windows(model: ByteMTP, wins: list[Window], n_requests: int, *, batch_size: int = 8,
                  progress: Callable[[int], None] | None = None) -> list[tuple[float, bool]]:
    """(sum of log-probabilities in nats, all greedy) of each request's targets, from its windows.

    Log-probabilities are taken over the whole padded vocabulary in float32 (as the loss and
    `bytemtp eval` take them) and summed in float64."""
    logprob = [0.0] * n_requests
    greedy = [True] * n_requests
    for i, logits_TV, logp_TV in _scored(model, wins, batch_size=batch_size, progress=progress):
        w = wins[i]
        targets = torch.tensor(w.targets, device=logp_TV.device)
        logprob[w.request] += float(logp_TV[torch.arange(len(targets), device=targets.device), targets].double().sum())
        greedy[w.request] &= bool((greedy_ids(logits_TV, vocab_size=model.config.vocab_size) == targets).all())
    return list(zip(logprob, greedy))


@dataclass(frozen=True)
class ByteLogprobs:
    """Per byte of a text: log p(byte | EOS and the bytes before it, in the window's context), in
    nats, and the `top` likeliest ids there (among those decoding may emit) with theirs."""

    logprobs: list[float]
    top: list[list[tuple[int, float]]]


@torch.inference_mode()
def byte_logprobs(model: ByteMTP, texts: list[bytes], *, top: int = 0, batch_size: int = 8) -> list[ByteLogprobs]:
    """The log-probability of every byte of each text, each a new document (after EOS), scored in
    the windows of `rolling_loglikelihoods` (whose sum over a text this is), with the `top`
    likeliest ids at each position: what an OpenAI-style `echo` + `logprobs` request asks."""
    wins = [w for i, t in enumerate(texts) for w in windows(b"", t, seq_len=model.config.seq_len, request=i)]
    scored: list = [None] * len(wins)
    for i, _, logp_TV in _scored(model, wins, batch_size=batch_size, progress=None):
        targets = torch.tensor(wins[i].targets, device=logp_TV.device)
        values = logp_TV[torch.arange(len(targets), device=targets.device), targets].tolist()
        best: list[list[tuple[int, float]]] = [[] for _ in values]
        if top:
            masked = masked_logits(logp_TV, vocab_size=model.config.vocab_size)
            lp, ids = masked.topk(min(top, logp_TV.shape[-1]), dim=-1)
            best = [list(zip(i, v)) for i, v in zip(ids.tolist(), lp.tolist())]
        scored[i] = (values, best)
    out = [ByteLogprobs([], []) for _ in texts]
    for w, (values, best) in zip(wins, scored):  # a text's windows follow each other, in order
        out[w.request].logprobs.extend(values)
        out[w.request].top.extend(best)
    return out


def loglikelihoods(model: ByteMTP, pairs: list[tuple[bytes, bytes]], *, batch_size: int = 8,
                   progress: Callable[[int], None] | None = None) -> list[tuple[float, bool]]:
    """(log p(continuation | context) in nats, whether it is the greedy continuation) per pair."""
    wins = [w for i, (ctx, cont) in enumerate(pairs)
            for w in windows(ctx, cont, seq_len=model.config.seq_len, request=i)]
    return score_windows(model, wins, len(pairs), batch_size=batch_size, progress=progress)


def rolling_loglikelihoods(model: ByteMTP, texts: list[bytes], *, batch_size: int = 8,
                           progress: Callable[[int], None] | None = None) -> list[float]:
    """log p(text) in nats per text, each a new document (after EOS), in windows of the context."""
    return [lp for lp, _ in loglikelihoods(model, [(b"", t) for t in texts], batch_size=batch_size,
                                           progress=progress)]


def n_windows(pairs: list[tuple[bytes, bytes]], *, seq_len: int) -> int:
    """How many windows `loglikelihoods` runs for these pairs (for a progress bar's total)."""
    return sum(-(-len(cont) // seq_len) for _, cont in pairs)


@dataclass(frozen=True)
class TextScore:
    """Nats that the next-byte head gives a set of texts, and the bytes they stand for (`score_texts`)."""

    nats: float
    bytes: int  # the texts' bytes plus one for each text's closing EOS
    ids: int  # positions scored: bytes for a byte model, tokens (EOS included) for a BPE baseline

    @property
    def bits_per_byte(self) -> float:
        return self.nats / max(1, self.bytes) / math.log(2)


def score_texts(model: ByteMTP, texts: list[bytes], *, batch_size: int = 8,
                progress: Callable[[int], None] | None = None) -> TextScore:
    """Every text scored whole as one document (after EOS, and its closing EOS predicted too), in
    the windows of `rolling_loglikelihoods` over the model's own ids (`model.vocab`: bytes, or a BPE
    baseline's tokens, so a window holds seq_len of them). Nats are summed over every position and
    divided by the same bytes for either vocabulary: the texts' bytes and one for each EOS (as
    `bytemtp eval` counts it), so bits per byte compare across vocabularies."""
    vocab = model.vocab
    encoded = vocab.encode_many(texts)
    wins = [w for i, ids in enumerate(encoded)
            for w in windows((), (*ids, EOS), seq_len=model.config.seq_len, request=i)]
    nats = sum(lp for lp, _ in score_windows(model, wins, len(texts), batch_size=batch_size, progress=progress))
    return TextScore(nats=-nats, bytes=sum(len(t) + 1 for t in texts), ids=sum(len(ids) + 1 for ids in encoded))
