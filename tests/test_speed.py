"""bytemtp.decoding.speed: the figures of a comparison and their JSON form (what `bench decode
--json` writes in each case)."""

from bytemtp.decoding.generation import DecodeStats, Generation, SpeculativeStats
from bytemtp.decoding.speed import SpeedFigures, speed_figures


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
