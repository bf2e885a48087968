"""The comparison of multi-token recipes with next-byte training (bytemtp.experiments.quality,
`bytemtp bench quality`): its arms and seeds, its ratios to the baseline of the same seed, and its
command."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bytemtp.experiments import quality
from bytemtp.experiments.sweep import CandidateResult, TunedFigures
from bytemtp_cli.main import main


def _run(r: float, name: str = "a-s0", tuned_chain_bytes_per_pass: float | None = None) -> CandidateResult:
    tuned = None if tuned_chain_bytes_per_pass is None else TunedFigures(
        tuned_chain_bytes_per_pass=tuned_chain_bytes_per_pass, tuned_tree_bytes_per_pass=0.0, eager_speedup=1.0,
        plain_bytes_s=1.0, repetition=None, decode=None)
    return CandidateResult(name=name, sets=[], params=1000, budget_s=1.0, steps=10, bytes_seen=0, train_s=2.0,
                           stopped_by="steps", val_bytes=0, val_bpb=[r, r + 1], head_agreement={}, tuned=tuned)


def test_an_arm_is_better_or_worse_only_beyond_every_seed():
    base = [_run(2.0), _run(2.2)]
    better = quality.summary([_run(1.9), _run(2.1)], base, label="x", sets=[])
    assert list(better.ratio.runs) == pytest.approx([0.95, 2.1 / 2.2]) and better.verdict == "better"
    assert better.bpb.mid == pytest.approx(2.0) and better.ms_per_step.mid == pytest.approx(200)
    mixed = quality.summary([_run(1.9), _run(2.3)], base, label="x", sets=[])
    assert mixed.verdict == "within the seeds' spread"
    assert quality.summary([_run(2.1), _run(2.3)], base, label="x", sets=[]).verdict == "worse"
    tuned = quality.summary([_run(1.9, tuned_chain_bytes_per_pass=4.0), _run(2.0, tuned_chain_bytes_per_pass=5.0)],
                            base, label="x", sets=[])
    assert tuned.tuned_chain_bytes_per_pass.mid == 4.5 and tuned.head_bpb == pytest.approx([1.95, 2.95])


def test_the_comparison_reads_back_from_the_json_bench_quality_wrote():
    spread = {"mean": 2.0, "min": 1.9, "max": 2.1, "each": [1.9, 2.1]}
    arm = {"label": "x", "sets": ["model.n_future=1"], "params": 1000, "bpb": spread, "ratio": spread,
           "steps": {"mean": 10.0, "min": 10, "max": 10, "each": [10, 10]}, "ms_per_step": spread, "verdict": "worse"}
    data = {"preset": "tiny", "data": "c", "seeds": 2, "budget_s": 0.0, "steps": 3, "eval_bytes": 2048, "tune_s": 1.0,
            "out": "q", "arms": {"ntp": arm, "mtp": {**arm, "verdict": "better", "head_bpb": [2.0, 3.0],
                                                     "tuned_chain_bytes_per_pass": spread}}}
    res = quality.QualityResult.from_json(data)
    assert res.arms["ntp"].head_bpb is None and res.arms["mtp"].tuned_chain_bytes_per_pass.mid == 2.0
    written = json.loads(json.dumps(res.to_json()))
    assert list(written.items()) == list(data.items()) and quality.QualityResult.from_json(written) == res
    assert [list(s) for s in written["arms"].values()] == [list(s) for s in data["arms"].values()]
    assert res.table().splitlines()[3] == "| ntp | x | 0.00M | 10 | 2 | 2.0000 (1.9000-2.1000) | 2.0000 (1.9000-2.1000) | - | - |"


def test_the_grid_runs_every_arm_at_every_seed_seed_major_baseline_first():
    grid = quality.grid_of("tiny", ["data.batch_size=4"], {"ntp": ("model.n_future=1",), "mtp": ()}, 2)
    assert list(grid.candidates) == ["ntp-s0", "mtp-s0", "ntp-s1", "mtp-s1"]
    assert grid.candidates["mtp-s1"] == ("train.seed=1", "data.seed=1")
    cfg = grid.config("ntp-s1", budget_s=5.0)
    assert cfg.model.n_future == 1 and cfg.train.seed == cfg.data.seed == 1 and cfg.train.max_time == 5.0


@pytest.mark.parametrize("text,message", [("nope", "expected NAME=SETTING"), ("ntp=model.n_future=2", "new name"),
                                          ("a/b=model.n_future=2", "without '/'")])
def test_a_users_arm_is_a_name_and_settings(text, message):
    with pytest.raises(ValueError, match=message):
        quality.parse_arm(text)
    assert quality.parse_arm("s3=loss.head_schedule=reverse, loss.head_schedule_span=0.3") == (
        "s3", ("loss.head_schedule=reverse", "loss.head_schedule_span=0.3"))


@pytest.mark.slow  # six trainings and four tunes end to end
def test_bench_quality_compares_arms_over_seeds_against_the_baseline_of_each_seed(corpus_dir, tmp_path):
    out = tmp_path / "q"
    args = ["bench", "quality", "--preset", "tiny", "--data", str(corpus_dir), "--steps", "3", "--seeds", "2",
            "--arms", "reverse", "--arm", "geo=loss.head_weights=geometric", "--set", "data.batch_size=4",
            "--tune-time", "1s", "--n-prompts", "2", "--eval-bytes", "2048", "--out", str(out), "--device", "cpu"]
    res = CliRunner().invoke(main, [*args, "--json", str(tmp_path / "q.json")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "q.json").read_text())
    assert list(data["arms"]) == ["ntp", "reverse", "geo"] and data["steps"] == 3
    for arm, s in data["arms"].items():
        runs = [json.loads((out / f"{arm}-s{seed}" / "sweep.json").read_text()) for seed in range(2)]
        base = [json.loads((out / f"ntp-s{seed}" / "sweep.json").read_text()) for seed in range(2)]
        assert [r["steps"] for r in runs] == [3, 3]
        assert s["ratio"]["each"] == pytest.approx([r["val_bpb"][0] / b["val_bpb"][0] for r, b in zip(runs, base)])
        config = json.loads((out / f"{arm}-s1" / "run-config.json").read_text())
        assert config["train"]["seed"] == config["data"]["seed"] == 1 and config["train"]["device"] == "cpu"
        assert ("tuned_chain_bytes_per_pass" in s) == (arm != "ntp")  # the baseline has no draft heads
        assert f"| {arm} |" in res.output
    assert data["arms"]["ntp"]["ratio"]["each"] == [1.0, 1.0]
    assert json.loads((out / "geo-s0" / "run-config.json").read_text())["loss"]["head_weights"] == "geometric"
    assert json.loads((out / "reverse-s0" / "run-config.json").read_text())["loss"]["head_schedule"] == "reverse"
    # measured arms are read back: the same figures, nothing trained again
    again = CliRunner().invoke(main, [*args, "--json", str(tmp_path / "again.json")])
    assert again.exit_code == 0 and json.loads((tmp_path / "again.json").read_text()) == data


@pytest.mark.parametrize("more,message", [(["--device", "gpu"], "--device"), (["--arms", "mtp,nope"], "no arm 'nope'"),
                                          (["--arms", "mtp", "--arm", "bad=model.width=3"],
                                           "arm 'bad': unknown setting model.width")])
def test_bench_quality_refuses_bad_arms_in_one_line_before_training(corpus_dir, tmp_path, more, message):
    res = CliRunner().invoke(main, ["bench", "quality", "--preset", "tiny", "--data", str(corpus_dir), "--steps", "1",
                                    "--out", str(tmp_path / "q"), *more])
    assert res.exit_code != 0 and "Traceback" not in res.output and message in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not list((tmp_path / "q").glob("*-s0"))


def test_the_trunk_control_is_a_next_byte_model_as_deep_as_the_heads_trunk_plus_one_head():
    # tiny: 10 layers, 8 one-layer heads, so a 2-layer trunk; small: 12 layers, a 4-layer trunk
    assert quality.arm_sets("ntp-trunk", "tiny", []) == ("model.n_future=1", "model.n_layers=3")
    assert quality.arm_sets("ntp-trunk", "small", ["model.n_layers=16"]) == ("model.n_future=1", "model.n_layers=9")
    assert quality.arm_sets("reverse", "tiny", []) == ("loss.head_schedule=reverse",)


def test_a_signal_in_an_arms_tune_stops_the_comparison_and_keeps_no_figure_of_the_cut_tune(corpus_dir, tmp_path,
                                                                                          monkeypatch):
    from bytemtp.experiments import sweep
    from bytemtp.training.runs import RunResult

    out = tmp_path / "q"
    measured = {"ntp-s0": [3.0], "mtp-s0": [3.1, 4.2]}  # both trained and measured; mtp's heads not tuned yet
    for name, bpb in measured.items():
        (out / name).mkdir(parents=True)
        (out / name / "sweep.json").write_text(json.dumps(_run(bpb[0], name).to_json() | {"val_bpb": bpb}))

    def cut(tuned, *, say):  # the tune's training, stopped by Ctrl-C
        return RunResult(step=2, bytes_seen=0, stopped_by="signal", checkpoint=None, val_bpb=None)

    monkeypatch.setattr(sweep.runs, "plan_tune", lambda source, tuned, *, overrides: tuned)
    monkeypatch.setattr(sweep, "run_plan", cut)
    before = {name: (out / name / "sweep.json").read_text() for name in measured}
    res = CliRunner().invoke(main, ["bench", "quality", "--preset", "tiny", "--data", str(corpus_dir), "--steps", "3",
                                    "--seeds", "1", "--arms", "mtp", "--tune-time", "1s", "--out", str(out)])
    assert res.exit_code == 130 and "Traceback" not in res.output and res.stdout == "", res.output
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: stopped during mtp-s0's tune: run the same command again to go on")
    assert {name: (out / name / "sweep.json").read_text() for name in measured} == before


def test_bench_quality_refuses_a_run_of_other_settings_in_one_line(corpus_dir, tmp_path):
    from bytemtp.config_io import to_dict
    from bytemtp.training.runs import RUN_CONFIG

    out = tmp_path / "q"
    shared = [f"data.path={corpus_dir}", "train.eval_every=0", "train.device=cpu"]
    cfg = quality.grid_of("tiny", shared, {"ntp": quality.ARMS["ntp"][1]}, 1).config("ntp-s0", budget_s=0.0, steps=2)
    (out / "ntp-s0").mkdir(parents=True)
    (out / "ntp-s0" / RUN_CONFIG).write_text(json.dumps(to_dict(cfg)))
    res = CliRunner().invoke(main, ["bench", "quality", "--preset", "tiny", "--data", str(corpus_dir), "--steps", "3",
                                    "--seeds", "1", "--arms", "mtp", "--out", str(out), "--device", "cpu"])
    assert res.exit_code == 1 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert "ntp-s0 was trained with other settings than asked for now (train.steps: 2 -> 3)" in res.output
    assert not (out / "mtp-s0").exists()
