"""Speed measurement of decoding (bytemtp.decoding.speed), timed by a scripted clock."""

import itertools
import types

import pytest
from doubles import rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import Draft


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
