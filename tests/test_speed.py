"""Speed measurement of decoding (bytemtp.decoding.speed), timed by a scripted clock; the figures
of a comparison and their JSON form (what `bench decode --json` writes in each case)."""

import itertools
import types

import pytest
from doubles import rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.generation import DecodeStats, Generation, SpeculativeStats
from bytemtp.decoding.speed import SpeedFigures, speed_figures
from bytemtp.decoding.strategy import Draft


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
    assert res.identical and res.output == plain.output == spec.output and not res.compiled
    assert res.figures.speedup == pytest.approx(0.8 / 0.65)
    assert res.figures.speedup_runs == pytest.approx([0.8, 1.5])
    assert (res.figures.speedup_min, res.figures.speedup_max) == pytest.approx((0.8, 1.5))
    n = len(plain.output)
    assert (res.figures.plain_bytes_s, res.figures.spec_bytes_s) == pytest.approx((2 * n / 0.8, 2 * n / 0.65))
    assert res.figures.bytes_per_forward == pytest.approx(n / spec.stats.forward_passes)
    assert res.figures.pass_cost == pytest.approx((0.65 / spec.stats.forward_passes) / (0.8 / plain.stats.forward_passes))
    assert res.degenerate == (len(set(plain.output)) == 1)


def test_speed_figures_and_their_json_form():
    plain = [[Generation(b"abcd", DecodeStats(bytes_out=4, forward_passes=4))]]
    spec = [[Generation(b"abcd", SpeculativeStats(bytes_out=4, forward_passes=2, heads_used={3: 2},
                                                    shapes={"chain-3": 2}))]]
    took = {"plain": [[0.4], [0.6]], "spec": [[0.25], [0.25]]}
    got = speed_figures(took, {"plain": plain, "spec": spec}, "spec")
    assert isinstance(got, SpeedFigures) and got.identical and got.speedup == 1.0 / 0.5
    assert list(got.to_json().items()) == [
        ("mode", "spec"), ("speedup", 2.0), ("speedup_min", 0.4 / 0.25), ("speedup_max", 0.6 / 0.25),
        ("speedup_runs", [0.4 / 0.25, 0.6 / 0.25]), ("bytes_per_forward", 2.0),
        ("pass_cost", (0.5 / 2) / (1.0 / 4)), ("plain_bytes_s", 8 / 1.0), ("spec_bytes_s", 8 / 0.5),
        ("identical", True), ("heads_used", {3: 2}), ("shapes", {"chain-3": 2})]
