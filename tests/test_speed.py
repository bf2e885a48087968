"""Speed measurement of decoding (bytemtp.decoding.speed), timed by a scripted clock; the figures
of a comparison, the repetition of the text they were measured on, and their JSON form (what
`bench decode --json` writes in each case)."""

import dataclasses
import itertools
import json
import types

import pytest
from doubles import generate_batch, rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.generation import DecodeStats, Generation, SpeculativeStats
from bytemtp.decoding.repetition import measure_repetition, repetition_figures
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
    spec = generate_batch(model, [b"def "], max_bytes=24, draft=draft)[0]
    assert res.identical and res.output == plain.output == spec.output and not res.compiled
    assert res.figures.speedup.mid == pytest.approx(0.8 / 0.65)
    assert list(res.figures.speedup.runs) == pytest.approx([0.8, 1.5])
    assert (res.figures.speedup.low, res.figures.speedup.high) == pytest.approx((0.8, 1.5))
    n = len(plain.output)
    assert (res.figures.plain_bytes_s, res.figures.spec_bytes_s) == pytest.approx((2 * n / 0.8, 2 * n / 0.65))
    assert res.figures.bytes_per_forward == pytest.approx(n / spec.stats.forward_passes)
    assert res.figures.pass_cost == pytest.approx((0.65 / spec.stats.forward_passes) / (0.8 / plain.stats.forward_passes))
    assert res.degenerate == (len(set(plain.output)) == 1)
    assert res.figures.repetition == measure_repetition([plain.output])  # no real continuation given


def test_speed_figures_and_their_json_form():
    out = b"abcdabcdabcdabcd"  # 16 bytes, 9 8-grams of which 4 are distinct
    plain = [[Generation(out, DecodeStats(bytes_out=16, forward_passes=16))]]
    spec = [[Generation(out, SpeculativeStats(bytes_out=16, forward_passes=8, heads_used={3: 8},
                                              shapes={"chain-3": 8}, host_reads=8, step_s=0.2))]]
    took = {"plain": [[0.4], [0.6]], "spec": [[0.25], [0.25]]}
    real = b"def f(x):\n    return x + 1\n"  # the real continuation: cut to the 16 bytes decoded
    got = speed_figures(took, {"plain": plain, "spec": spec}, "spec", real=[real])
    assert isinstance(got, SpeedFigures) and got.identical and got.speedup.mid == 1.0 / 0.5
    assert got.repetition == measure_repetition([out], [real])
    decoded, cut = repetition_figures([out]), repetition_figures([real[:16]])
    assert decoded.distinct_8grams == 4 / 9 and cut.distinct_8grams == 1.0 and cut.bytes == 16
    assert list(got.to_json().items()) == [
        ("mode", "spec"), ("speedup", 2.0), ("speedup_min", 0.4 / 0.25), ("speedup_max", 0.6 / 0.25),
        ("speedup_runs", [0.4 / 0.25, 0.6 / 0.25]), ("bytes_per_forward", 2.0),
        ("pass_cost", (0.5 / 8) / (1.0 / 16)), ("plain_bytes_s", 32 / 1.0), ("spec_bytes_s", 32 / 0.5),
        ("identical", True), ("heads_used", {3: 8}), ("shapes", {"chain-3": 8}),
        ("repetition", {"decoded": dataclasses.asdict(decoded), "real": dataclasses.asdict(cut),
                        "zstd_ratio_over_real": decoded.zstd_ratio / cut.zstd_ratio}),
        ("host_transfers_per_pass", 1.0), ("outside_step_share", 0.2)]  # the last round: 0.2 of its 0.25 s in the step
    assert SpeedFigures.from_json(json.loads(json.dumps(got.to_json()))) == got
    # prompts without a real continuation (a prompts file): the decoded figures alone
    alone = speed_figures(took, {"plain": plain, "spec": spec}, "spec").to_json()["repetition"]
    assert alone == {"decoded": dataclasses.asdict(decoded), "real": None, "zstd_ratio_over_real": None}


def test_a_speedup_above_bytes_per_pass_is_refused_where_both_did_the_same_work_only():
    """Greedy modes decode the same bytes, so a speedup above bytes per pass is a bad measurement;
    modes whose outputs differ (sampled from other seeds) are not judged by it."""
    import pytest

    from bytemtp.decoding.generation import Generation, SpeculativeStats
    from bytemtp.decoding.speed import SpeedFigures, speed_figures

    def gen(out: bytes, passes: int) -> Generation:
        return Generation(out, SpeculativeStats(bytes_out=len(out), forward_passes=passes))

    took = {"plain": [[2.0]], "auto": [[1.0]]}  # twice as fast at 1.25 bytes a pass: impossible
    same = {"plain": [[gen(b"x" * 100, 100)]], "auto": [[gen(b"x" * 100, 80)]]}
    noisy = speed_figures(took, same, "auto")  # kept, with a note that says it is noise: never thrown away
    assert noisy.speedup.mid == pytest.approx(2.0) and "impossible" in noisy.noise
    assert SpeedFigures.from_json(noisy.to_json()).noise == noisy.noise
    other = {"plain": [[gen(b"x" * 100, 100)]], "auto": [[gen(b"y" * 100, 80)]]}
    assert speed_figures(took, other, "auto").speedup.mid == pytest.approx(2.0)


def test_a_comparison_renders_what_generate_compare_prints():
    from bytemtp.decoding.repetition import Repetition, RepetitionFigures
    from bytemtp.decoding.speed import Comparison, repetition_line
    from bytemtp.spread import Spread

    rep = Repetition(decoded=RepetitionFigures(0.4, 3.0, 40), real=RepetitionFigures(None, None, 40))
    assert repetition_line(rep) == ("repetition, decoded text (40 bytes): distinct 8-grams 0.40, zstd ratio 3.00x; "
                                    "real continuation: distinct 8-grams -, zstd ratio -")
    figures = SpeedFigures(mode="chain-4", speedup=Spread.around(1.75, [1.5, 2.0], keep_runs=True),
                           bytes_per_forward=2.5, pass_cost=1.2, plain_bytes_s=1000.0, spec_bytes_s=1750.0,
                           identical=True, heads_used={4: 3}, shapes={}, repetition=rep)
    eager = Comparison(figures=figures, output=b"xy", compiled=False, degenerate=False, identical=True)
    assert eager.table("chain-4").splitlines()[:3] == [
        "plain greedy, eager:             1,000 bytes/s, 1.00 bytes/pass",
        "speculative, chain-4             1,750 bytes/s, 2.50 bytes/pass",
        "speedup 1.75x over eager plain (runs: 1.50, 2.00); outputs identical: yes"]
    # on the compiled step, eager plain decoding is the baseline above and the speedups over it below
    compiled = dataclasses.replace(eager, output=b"aaa", compiled=True, degenerate=True, identical=False,
                                   eager_plain_bytes_s=500.0, compiled_plain_speedup=2.0, eager_speedup=3.5,
                                   compile_stats={"graphs": 2, "compile_s": 1.0, "cache_hits": 0, "cache_misses": 2})
    lines = compiled.table("chain-4").splitlines()
    assert lines[:2] == ["plain greedy, eager:               500 bytes/s, 1.00 bytes/pass",
                         "plain greedy, compiled:          1,000 bytes/s, 1.00 bytes/pass"]
    assert lines[3].startswith("speedup 1.75x over compiled plain") and lines[3].endswith("identical: NO")
    assert lines[4] == repetition_line(rep)
    assert lines[5:7] == ["over eager plain: compiled plain 2.00x, speculative 3.50x",
                          "compiled step: 2 graphs in 1.0 s (disk cache: 0 hits, 2 misses)"]
    assert lines[7].startswith("note: the output is one byte repeated (b'a')")
