"""Benchmarks measured as ratios (bytemtp.experiments.bench): when the spread of the pair ratios
says a time ratio is noise. The `bench` commands end to end are in test_cli.py and
test_generate_cli.py."""

import pytest


def test_train_step_time_ratio_spread_says_when_it_is_noise():
    from bytemtp.experiments.bench import NOISY_SPREAD, ratio_spread

    quiet = ratio_spread([1.02, 0.98, 1.0, 1.05, 1.01])
    assert (quiet["min"], quiet["median"], quiet["max"]) == (0.98, 1.01, 1.05)
    assert quiet["runs"] == [0.98, 1.0, 1.01, 1.02, 1.05]
    assert quiet["spread"] == pytest.approx(0.07 / 1.01) and not quiet["noisy"] and quiet["note"] is None
    busy = ratio_spread([0.12, 1.0, 1.57])  # two runs on a busy machine gave these as the whole result
    assert busy["noisy"] and busy["spread"] > NOISY_SPREAD and "0.120 to 1.570" in busy["note"]
    assert ratio_spread([1.0, 1.01])["noisy"]  # too few rounds to judge
