"""Self-speculative greedy decoding against plain greedy decoding, its slow reference."""

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytemtp import config as C
from bytemtp import decode
from bytemtp.model import ByteMTP
from bytemtp.vocab import EOS, VOCAB_SIZE


class ScriptedModel:
    """Knows a text: head 1 always predicts its next byte; head j > 1 predicts the byte j ahead
    when `right(j)` says so, else a wrong byte. Positions count from the leading EOS."""

    def __init__(self, text: bytes, right, n_future: int = 8):
        self.config = dataclasses.replace(C.tiny().model, n_future=n_future, seq_len=128)
        self.embed = torch.nn.Embedding(1, 1)  # only its device is read
        self.stream = [EOS, *text, EOS]
        self.right = right
        self.calls = 0

    def _byte(self, position: int) -> int:
        return self.stream[position] if position < len(self.stream) else EOS

    def logits(self, ids, cache, n_heads=None):
        self.calls += 1
        K = n_heads or self.config.n_future
        T = ids.shape[1]
        out = torch.zeros(1, T, K, VOCAB_SIZE)
        for t in range(T):
            pos = cache.length + t
            for j in range(K):
                target = self._byte(pos + j + 1)
                if j > 0 and not self.right(j + 1):
                    target = (target + 1) % 256
                out[0, t, j, target] = 10.0
        cache.advance(T)
        return out


TEXT = b"def main():\n    return 42\n"


@pytest.mark.parametrize("name,right,per_forward", [
    ("never", lambda j: False, 1.0),
    ("always", lambda j: True, None),
    ("partial", lambda j: j <= 3, 3.0),
])
def test_scripted_acceptance(name, right, per_forward):
    plain = decode.generate(ScriptedModel(TEXT, right), b"", max_bytes=100)
    model = ScriptedModel(TEXT, right)
    spec = decode.generate_speculative(model, b"", max_bytes=100)
    assert plain.output == spec.output == TEXT
    stats = spec.stats
    if name == "never":
        assert stats.acceptance == [0.0] * 7 and stats.bytes_per_forward <= 1.0
    elif name == "always":
        assert all(rate == 1.0 for rate in stats.acceptance[:5])
        assert stats.forward_passes <= -(-len(TEXT) // 8) + 2
    else:
        assert stats.acceptance[:2] == [1.0, 1.0] and stats.acceptance[2] == 0.0
        assert stats.bytes_per_forward == pytest.approx(per_forward, abs=0.5)
    assert stats.forward_passes == model.calls


def test_eos_inside_an_accepted_draft_stops_there():
    model = ScriptedModel(b"abc", lambda j: True)
    got = decode.generate_speculative(model, b"", max_bytes=50)
    assert got.output == b"abc" and got.stats.stopped_by == "eos"


@pytest.mark.parametrize("max_bytes", [0, 1, 7, 8, 9])
def test_max_bytes_edges(max_bytes):
    model = ScriptedModel(TEXT, lambda j: True)
    got = decode.generate_speculative(model, b"", max_bytes=max_bytes, heads=8)
    assert got.output == TEXT[:max_bytes]
    assert got.stats.stopped_by == "max_bytes"


def test_stop_string_inside_accepted_drafts():
    model = ScriptedModel(TEXT, lambda j: True)
    got = decode.generate_speculative(model, b"", max_bytes=50, stop=(b"():",))
    assert got.output == b"def main():" and got.stats.stopped_by == "stop"


def test_streamed_pieces_equal_the_output():
    pieces = []
    model = ScriptedModel(TEXT, lambda j: j % 2 == 0)
    got = decode.generate_speculative(model, b"", max_bytes=50, on_bytes=pieces.append)
    assert b"".join(pieces) == got.output == TEXT


def test_heads_must_exist():
    with pytest.raises(ValueError, match="heads=9"):
        decode.generate_speculative(ScriptedModel(TEXT, lambda j: True), b"", max_bytes=5, heads=9)


_MODELS = {}
_SONGS = [b"one two three four five six seven eight\n", b"la la la, la la lo\n", b"0123456789abcdef"]


def _fitted_model(seed: int, head_type: str) -> ByteMTP:
    """A tiny model fitted for a few seconds to repetitive text, so that its heads' drafts are
    often, but not always, accepted (an untrained model's drafts never are)."""
    key = (seed, head_type)
    if key not in _MODELS:
        from bytemtp.step import forward_backward

        cfg = dataclasses.replace(C.tiny().model, head_type=head_type)
        model = ByteMTP(cfg)
        model.init_weights(generator=torch.Generator().manual_seed(seed))
        text = list(b"".join(_SONGS[(seed + i) % 3] for i in range(12)))
        windows = torch.tensor([text[i:i + cfg.seq_len + cfg.n_future] for i in range(0, 120, 15)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(60 + 20 * seed):
            forward_backward(model, windows, loss_cfg=C.LossConfig())
            opt.step()
            opt.zero_grad()
        _MODELS[key] = model.double().eval()  # float64: chunked and single-step logits tie-free
    return _MODELS[key]


def test_fitted_models_accept_some_drafts_but_not_all():
    rates = []
    for head_type in ("transformer", "causal", "linear"):
        got = decode.generate_speculative(_fitted_model(0, head_type), b"one t", max_bytes=40)
        rates += got.stats.acceptance
    assert 0.1 < sum(rates) / len(rates) < 1.0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2), head_type=st.sampled_from(["transformer", "causal", "linear"]),
       prompt=st.one_of(st.just(b""), st.binary(min_size=1, max_size=1), st.binary(max_size=40),
                        st.sampled_from(_SONGS), st.binary(min_size=55, max_size=60)),
       k=st.integers(1, 8), max_bytes=st.integers(0, 20))
def test_speculative_greedy_equals_plain_greedy(seed, head_type, prompt, k, max_bytes):
    model = _fitted_model(seed, head_type)
    max_bytes = min(max_bytes, model.config.seq_len - len(prompt) - 1)  # near the context end too
    plain = decode.generate(model, prompt, max_bytes=max_bytes)
    spec = decode.generate_speculative(model, prompt, max_bytes=max_bytes, heads=k)
    assert spec.output == plain.output
    assert spec.stats.stopped_by == plain.stats.stopped_by
    assert spec.stats.forward_passes <= plain.stats.forward_passes
