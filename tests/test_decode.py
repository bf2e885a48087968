import dataclasses

import pytest
import torch

from bytemtp import config as C
from bytemtp import decode
from bytemtp.drafting import Draft
from bytemtp.model import ByteMTP
from bytemtp.vocab import EOS, PAD, TextStream


def _model(seed=0, **kw):
    model = ByteMTP(dataclasses.replace(C.tiny().model, **kw)).eval()
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # make EOS rare so outputs run long
        for unembed in model.unembed:
            unembed.weight[EOS] = 0.0  # EOS logit 0 against random others: rare
    return model


def _greedy_without_cache(model, prompt: bytes, max_bytes: int) -> bytes:
    ids = [EOS, *prompt]
    out = bytearray()
    while len(out) < max_bytes:
        logits = model.logits(torch.tensor([ids]), heads=1)[0, -1, 0]
        byte = decode.next_byte(logits, decode.Sampling())
        if byte == EOS:
            break
        out.append(byte)
        ids.append(byte)
    return bytes(out)


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
@pytest.mark.parametrize("prompt", [b"", b"d", b"def main():\n    "])
def test_cached_greedy_equals_full_recompute(head_type, prompt):
    model = _model(head_type=head_type)
    got = decode.generate(model, prompt, max_bytes=30)
    assert got.output == _greedy_without_cache(model, prompt, 30)
    eos = got.stats.stopped_by == "eos"
    assert got.stats.forward_passes == len(got.output) + eos


def test_limits_and_stops():
    model = _model()
    full = decode.generate(model, b"x", max_bytes=40).output
    assert decode.generate(model, b"x", max_bytes=0).output == b""
    assert decode.generate(model, b"x", max_bytes=1).output == full[:1]
    stop = full[5:7]
    cut = decode.generate(model, b"x", max_bytes=40, stop=(stop,))
    assert cut.output.endswith(stop) and cut.stats.stopped_by == "stop"
    assert full.startswith(cut.output)
    # no context wall: a prompt near or past the context of 64 slides the window
    long = decode.generate(model, b"y" * 60, max_bytes=10)
    assert long.stats.bytes_out == 10 or long.stats.stopped_by == "eos"
    assert decode.generate(model, b"y" * 100, max_bytes=5).stats.forward_passes >= 1


def test_never_emits_pad_or_special_ids():
    logits = torch.zeros(264)
    logits[PAD] = 100.0
    logits[256] = 99.0
    logits[260] = 98.0
    logits[65] = 1.0
    assert decode.next_byte(logits, decode.Sampling()) == 65
    probs = decode.distribution(logits, decode.Sampling(temperature=1.0))
    assert probs[PAD] == 0 and probs[256] == 0 and probs[259:].sum() == 0


def test_sampling_is_seeded_and_truncated():
    model = _model()
    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        return decode.generate(model, b"a", max_bytes=30,
                               sampling=decode.Sampling(temperature=1.0, generator=gen)).output
    assert run(1) == run(1)
    assert run(1) != run(2)
    logits = torch.arange(264, dtype=torch.float32) / 10
    top2 = decode.distribution(logits, decode.Sampling(temperature=1.0, top_k=2))
    assert (top2 > 0).sum() == 2 and top2[EOS] > 0
    nucleus = decode.distribution(logits, decode.Sampling(temperature=1.0, top_p=0.3))
    kept = nucleus > 0
    full = decode.distribution(logits, decode.Sampling(temperature=1.0))
    assert full[kept].sum() >= 0.3 and full[kept].sum() - full[kept].min() < 0.3
    with pytest.raises(ValueError, match="top_p"):
        decode.Sampling(top_p=0.0)


def test_text_stream_keeps_characters_whole():
    data = "naïve ☃ 🎉".encode() + b"\xff" + "ok".encode()
    stream = TextStream()
    pieces = [stream.feed(data[i:i + 1]) for i in range(len(data))] + [stream.finish()]
    assert "".join(pieces) == data.decode("utf-8", errors="replace")
    assert all("\ufffd" not in p for p in pieces[: len(data) - 3])


def test_the_python_api_takes_str_prompts_as_utf8():
    model = _model()
    want = decode.generate_batch(model, [b"def parse(", "é".encode()], max_bytes=12, draft=Draft(4))
    got = decode.generate_batch(model, ["def parse(", "é"], max_bytes=12, draft=Draft(4), stop=())
    assert [g.output for g in got] == [w.output for w in want]
    assert decode.generate(model, "def parse(", max_bytes=12).output == want[0].output
    assert decode.generate_speculative(model, "é", max_bytes=12, draft=Draft(4)).output == want[1].output
    with pytest.raises(TypeError, match=r"for one prompt pass \[prompt\]"):
        decode.generate_batch(model, "def parse(", max_bytes=4)
    with pytest.raises(TypeError, match="a prompt is bytes or str, not int"):
        decode.generate_batch(model, [7], max_bytes=4)
    with pytest.raises(ValueError, match=r"^heads=9 is not allowed") as error:
        decode.generate_batch(model, ["x"], max_bytes=4, draft=Draft(9))
    assert "--" not in str(error.value)  # library errors name arguments, not the CLI's flags


def test_context_left_is_what_the_window_slides_by():
    seq_len = 8
    assert decode.context_left(5, 0, seq_len) == 3 and decode.context_left(8, 0, seq_len) == 0
    for n in range(1, 40):
        start = decode.window_start(n, 0, seq_len)
        assert decode.context_left(n, start, seq_len) >= 0  # after a slide the context fits again
        assert (start == 0) == (decode.context_left(n, 0, seq_len) >= 0)


def test_compare_decoding_measures_plain_against_speculative():
    from bytemtp.speed import compare_decoding

    model = _model(n_future=4)
    decoder = decode.Decoder(model)
    res = compare_decoding(decoder, "def ", max_bytes=24, draft=Draft(4, "chain"), rounds=2)
    assert res["identical"] and res["output"] == decode.generate(model, b"def ", max_bytes=24).output
    assert len(res["speedup_runs"]) == 2 and res["speedup_min"] <= res["speedup"] * 1.5
    assert res["bytes_per_forward"] >= 1.0 and res["degenerate"] == (len(set(res["output"])) == 1)
