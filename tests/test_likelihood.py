"""Byte log-likelihoods (bytemtp.evaluation.likelihood), held against references: a full forward pass position
by position, and `bytemtp eval`'s sums over the same bytes."""


import json

import pytest
import torch
from doubles import tiny_model

from bytemtp.decoding.decode import generate
from bytemtp.evaluation.evaluate import evaluate
from bytemtp.evaluation.likelihood import loglikelihoods, n_windows, rolling_loglikelihoods, windows
from bytemtp.model.layout import build_layout
from bytemtp.model.loss import LN2
from bytemtp.vocab import BOS, EOS, PAD, VOCAB_SIZE


def _model(seq_len=32, n_future=4, seed=0):
    return tiny_model(seed, n_future=n_future, seq_len=seq_len).eval()


def _reference(model, context: bytes, continuation: bytes) -> tuple[float, bool]:
    """log p(continuation | EOS + context) from one full forward pass (the sequence fits the context)."""
    ids = torch.tensor([[EOS, *context, *continuation]])
    with torch.no_grad():
        logits = model.logits(ids[:, :-1], heads=1, layout=build_layout(model, ids[:, :-1]))[0, :, 0].float()
    start = len(context)  # position of the last context id: it predicts the continuation's first byte
    logp = torch.log_softmax(logits, -1)[start:]
    targets = ids[0, start + 1:]
    emitted = logits[start:, [*range(256), EOS]]  # the ids decoding may write: bytes, then EOS at 256
    return float(logp[torch.arange(len(targets)), targets].double().sum()), bool((emitted.argmax(-1) == targets).all())


@pytest.mark.parametrize("n_context,n_cont", [(0, 1), (0, 40), (5, 3), (40, 5), (70, 70), (31, 33), (0, 64)])
def test_windows_predict_every_byte_once_from_the_bytes_before_it(n_context, n_cont):
    S = 32
    context, cont = bytes(range(1, n_context + 1)), bytes(range(100, 100 + n_cont))
    ids = (EOS, *context, *cont)
    wins = windows(context, cont, seq_len=S)
    pos = 1 + n_context  # the next byte to score
    for w in wins:
        end = pos + len(w.targets)
        assert w.targets == ids[pos:end]  # in order, each once
        assert 1 <= len(w.inputs) <= S and w.first + len(w.targets) == len(w.inputs)
        assert w.inputs == ids[end - 1 - len(w.inputs):end - 1]  # the ids right before the last target
        assert len(w.inputs) == min(S, end - 1)  # as much context as the window holds
        pos = end
    assert pos == len(ids)
    assert n_windows([(context, cont)], seq_len=S) == len(wins) == -(-n_cont // S)


@pytest.mark.parametrize("context,continuation", [(b"", b"x"), (b"def f(x):", b"\n    return x"),
                                                  (b"\xff\x00abc", b"\xc3\xa9t\xc3\xa9")])
def test_loglikelihoods_equal_a_full_forward_pass(context, continuation):
    model = _model()
    (got, greedy), = loglikelihoods(model, [(context, continuation)])
    want, want_greedy = _reference(model, context, continuation)
    assert got == pytest.approx(want, rel=1e-5) and greedy == want_greedy


def test_batching_and_order_change_nothing():
    model = _model()
    pairs = [(b"a" * n, b"bc" * (n % 7 + 1)) for n in range(0, 90, 7)]
    one = loglikelihoods(model, pairs, batch_size=1)
    many = loglikelihoods(model, pairs, batch_size=5)
    assert [g for _, g in one] == [g for _, g in many]
    assert [lp for lp, _ in one] == pytest.approx([lp for lp, _ in many], rel=1e-5)


def test_greedy_flag_is_true_exactly_for_the_greedy_continuation():
    model = _model()
    prompt = b"hello"
    greedy = generate(model, prompt, max_bytes=6).output
    assert len(greedy) == 6  # no EOS: all six bytes are the greedy choices
    wrong = greedy[:3] + bytes([(greedy[3] + 1) % 256]) + greedy[4:]
    (_, is_greedy), (_, not_greedy) = loglikelihoods(model, [(prompt, greedy), (prompt, wrong)])
    assert is_greedy and not not_greedy


@pytest.mark.parametrize("special", [BOS, PAD, VOCAB_SIZE - 1])
def test_greedy_flag_follows_decoding_past_ids_it_never_emits(special):
    """A model that ranks an id decoding never writes (BOS, PAD, a padding row) first everywhere:
    greedy decoding writes the best byte instead, and the flag says so."""
    model = _model()
    plain = model.logits

    def ranked_first(*args, **kwargs):
        logits = plain(*args, **kwargs).clone()
        logits[..., special] = logits.amax(-1) + 10.0
        return logits

    model.logits = ranked_first  # generate and the likelihood both ask the model through it
    prompt = b"hello"
    greedy = generate(model, prompt, max_bytes=6).output
    assert len(greedy) == 6
    wrong = greedy[:2] + bytes([(greedy[2] + 1) % 256]) + greedy[3:]
    (_, is_greedy), (_, not_greedy) = loglikelihoods(model, [(prompt, greedy), (prompt, wrong)])
    assert is_greedy and not not_greedy


def test_rolling_loglikelihood_equals_eval_sums_over_the_same_bytes(tmp_path):
    """A text of 3 full windows, preceded by an empty document (so the stream starts with EOS as
    a rolling sequence does): eval's head-1 nats are exactly the text's rolling log-likelihood."""
    model = _model(seq_len=32)
    S, n = 32, 3
    text = "".join(chr(97 + (i * 7) % 26) for i in range(n * S))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", text, "a later document"]))
    res = evaluate(model, str(corpus), split=None, batches=n, batch_size=1)
    assert res.bytes == n * S
    nats = res.bpb[0] * res.bytes * LN2
    got, = rolling_loglikelihoods(model, [text.encode()], batch_size=2)
    assert -got == pytest.approx(nats, rel=1e-5)


def test_byte_logprobs_sum_to_the_rolling_loglikelihood_and_rank_the_top_ids():
    from bytemtp.evaluation.likelihood import byte_logprobs

    model = tiny_model(seq_len=16).eval()
    texts = [b"", b"ab", bytes(range(40)), b"hello world, hello world!" * 2]
    got = byte_logprobs(model, texts, top=3, batch_size=3)
    for text, lp, total in zip(texts, got, rolling_loglikelihoods(model, texts)):
        assert len(lp.logprobs) == len(lp.top) == len(text)
        assert sum(lp.logprobs) == pytest.approx(total, abs=1e-4)
        for byte, value, best in zip(text, lp.logprobs, lp.top):
            assert len(best) == 3 and best[0][1] >= best[1][1] >= best[2][1] >= value - 1e-6 or \
                byte in [i for i, _ in best]
    # one text alone scores as it does among others
    alone = byte_logprobs(model, [texts[2]], top=0)[0]
    assert alone.logprobs == pytest.approx(got[2].logprobs, abs=1e-5) and alone.top == [[]] * 40
