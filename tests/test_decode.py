import itertools
import types

import pytest
import torch
from doubles import rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import Draft
from bytemtp.vocab import EOS, PAD, TextStream


def _greedy_without_cache(model, prompt: bytes, max_bytes: int) -> bytes:
    """Greedy decoding that runs the whole context again for every byte, the context starting
    where the window rule puts it (past seq_len it keeps the newest half)."""
    ids, start = [EOS, *prompt], 0
    out = bytearray()
    while len(out) < max_bytes:
        start = decode.window_start(len(ids), start, model.config.seq_len)
        logits = model.logits(torch.tensor([ids[start:]]), heads=1)[0, -1, 0]
        byte = decode.next_byte(logits, decode.Sampling())
        if byte == EOS:
            break
        out.append(byte)
        ids.append(byte)
    return bytes(out)


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
@pytest.mark.parametrize("prompt", [b"", b"d", b"def main():\n    "])
def test_cached_greedy_equals_full_recompute(head_type, prompt):
    model = rare_eos_model(head_type=head_type)
    got = decode.generate(model, prompt, max_bytes=30)
    assert got.output == _greedy_without_cache(model, prompt, 30)
    eos = got.stats.stopped_by == "eos"
    assert got.stats.forward_passes == len(got.output) + eos


def test_limits_and_stops():
    model = rare_eos_model()
    full = decode.generate(model, b"x", max_bytes=40).output
    assert decode.generate(model, b"x", max_bytes=0).output == b""
    assert decode.generate(model, b"x", max_bytes=1).output == full[:1]
    stop = full[5:7]
    cut = decode.generate(model, b"x", max_bytes=40, stop=(stop,))
    assert cut.output.endswith(stop) and cut.stats.stopped_by == "stop"
    assert full.startswith(cut.output)
    # no context wall: a prompt near or past the context of 64 slides the window (twice here);
    # weights large enough that each byte depends on the whole window, not on the last few bytes
    model = rare_eos_model(init_std=0.3)
    for prompt in (b"y" * 60, b"y" * 100):
        long = decode.generate(model, prompt, max_bytes=40)
        assert long.output == _greedy_without_cache(model, prompt, 40) and len(long.output) == 40
        assert long.stats.forward_passes == 40 and long.stats.stopped_by == "max_bytes"


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
    model = rare_eos_model()
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
    model = rare_eos_model()
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


def _clock(seconds):
    """A stand-in for the `time` module whose perf_counter, read at the start and the end of each
    timed call, makes the calls last `seconds` in turn."""
    reads = iter(itertools.accumulate(x for s in seconds for x in (0.0, s)))
    return types.SimpleNamespace(perf_counter=lambda: next(reads))


def test_compare_decoding_measures_plain_against_speculative(monkeypatch):
    from bytemtp.decoding import speed

    # the modes take turns, plain first, once a round: plain takes 0.2 s then 0.6 s, speculative
    # 0.25 s then 0.4 s, so the speedup is 0.8 / 0.65 (total over total; the mean of the ratios
    # 0.8 and 1.5 would be 1.15)
    monkeypatch.setattr(speed, "time", _clock([0.2, 0.25, 0.6, 0.4]))
    model = rare_eos_model(n_future=4)
    draft = Draft(4, "chain")  # four heads every pass: no choice that a timing could sway
    res = speed.compare_decoding(decode.Decoder(model, compile="off"), "def ", max_bytes=24, draft=draft, rounds=2)
    plain = decode.generate(model, b"def ", max_bytes=24)
    spec = decode.generate_batch(model, [b"def "], max_bytes=24, draft=draft)[0]
    assert res["identical"] and res["output"] == plain.output == spec.output and not res["compiled"]
    assert res["speedup"] == pytest.approx(0.8 / 0.65)
    assert res["speedup_runs"] == pytest.approx([0.8, 1.5])
    assert (res["speedup_min"], res["speedup_max"]) == pytest.approx((0.8, 1.5))
    n = len(plain.output)
    assert (res["plain_bytes_s"], res["spec_bytes_s"]) == pytest.approx((2 * n / 0.8, 2 * n / 0.65))
    assert res["bytes_per_forward"] == pytest.approx(n / spec.stats.forward_passes)
    assert res["pass_cost"] == pytest.approx((0.65 / spec.stats.forward_passes) / (0.8 / plain.stats.forward_passes))
    assert res["degenerate"] == (len(set(plain.output)) == 1)
