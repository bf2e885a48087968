"""The preset sweep (bytemtp.experiments.sweep, `bytemtp bench sweep`): its grid file, its runs
on the same budget and held-out bytes, the read-back of a measured candidate, and the table."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from bytemtp.experiments import sweep
from bytemtp.training.runs import RunResult
from bytemtp_cli.main import main


def _grid(tmp_path, corpus_dir, body: str):
    path = tmp_path / "grid.toml"
    path.write_text(f'preset = "tiny"\nsets = ["data.path={corpus_dir}", "data.batch_size=4"]\n{body}')
    return path


TWO = '''
[[candidate]]
name = "adamw"
sets = ["train.lr=3e-3"]

[[candidate]]
name = "muon"
sets = ["train.optimizer=muon", "train.schedule=wsd"]
'''


@pytest.mark.parametrize("body,message", [
    ("", "has no [[candidate]]"),
    ('[[candidate]]\nname = "a"\nsets = ["model.width=3"]\n', "candidate 'a': unknown setting model.width"),
    ('[[candidate]]\nname = "a"\n[[candidate]]\nname = "a"\n', "names the candidate 'a' twice"),
    ('[[candidate]]\nsets = []\n', "candidate 1 needs a name"),
    ('steps = 3\n[[candidate]]\nname = "a"\n', "unknown key 'steps'"),
])
def test_a_grid_is_checked_whole_before_anything_trains(tmp_path, corpus_dir, body, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sweep.read_grid(_grid(tmp_path, corpus_dir, body))


def test_the_commands_settings_join_every_candidates(tmp_path, corpus_dir):
    # `bench sweep --set train.log_to=jsonl,tensorboard`: after the grid's shared settings, before a candidate's
    grid = sweep.read_grid(_grid(tmp_path, corpus_dir, TWO), shared=["train.log_to=jsonl,tensorboard", "train.lr=1e-2"])
    assert grid.config("adamw", budget_s=1.0).train.log_to == "jsonl,tensorboard"
    assert grid.config("adamw", budget_s=1.0).train.lr == 3e-3 and grid.config("muon", budget_s=1.0).train.lr == 1e-2
    with pytest.raises(ValueError, match="train.log_to='mlflow' is not allowed"):
        sweep.read_grid(_grid(tmp_path, corpus_dir, TWO), shared=["train.log_to=mlflow"])


@pytest.mark.slow  # two candidates trained for 2 s each
def test_every_candidate_gets_the_budget_and_the_same_held_out_bytes(tmp_path, corpus_dir):
    grid = sweep.read_grid(_grid(tmp_path, corpus_dir, TWO))
    cfg = grid.config("muon", budget_s=60.0)
    assert cfg.train.max_time == 60.0 and cfg.train.steps == 0 and cfg.train.optimizer == "muon"
    results = sweep.run_sweep(grid, tmp_path / "out", budget_s=2.0, eval_bytes=1024)
    assert [r.name for r in results] == ["adamw", "muon"]
    for r in results:
        assert r.steps > 0 and r.stopped_by in ("time", "schedule")
        assert r.val_bytes == results[0].val_bytes > 0 and len(r.val_bpb) == 8
        assert json.loads((tmp_path / "out" / r.name / sweep.RESULT).read_text()) == r.to_json()
    table = sweep.SweepResult(results).table().splitlines()
    assert len(table) == 4 and table[0].startswith("| candidate |")
    best = min(results, key=lambda r: r.val_bpb[0])
    assert table[2].startswith(f"| {best.name} |") and f"{best.val_bpb[0]:.3f}" in table[2]


@pytest.mark.slow  # a training and a tune of 1 s each, and decoding
def test_a_measured_candidate_is_read_back_and_tuned_when_asked(tmp_path, corpus_dir):
    grid = sweep.read_grid(_grid(tmp_path, corpus_dir, TWO))
    first = sweep.run_sweep(grid, tmp_path / "out", budget_s=1.0, eval_bytes=512, only=["adamw"])
    again = sweep.run_sweep(grid, tmp_path / "out", budget_s=1.0, eval_bytes=512, only=["adamw"])
    assert again == first  # not trained again
    tuned = sweep.run_sweep(grid, tmp_path / "out", budget_s=1.0, eval_bytes=512, only=["adamw"], tune_s=1.0,
                            prompts=2)[0]
    assert tuned.steps == first[0].steps and (tmp_path / "out" / "adamw-tuned" / "checkpoints").is_dir()
    assert tuned.tuned.tuned_chain_bytes_per_pass >= 1.0 and tuned.tuned.eager_speedup > 0
    assert tuned.tuned.repetition.decoded.distinct_8grams is not None
    with pytest.raises(ValueError, match="no candidate 'nope' in the grid; it has adamw, muon"):
        sweep.run_sweep(grid, tmp_path / "out", budget_s=1.0, only=["nope"])


@pytest.mark.slow
def test_the_sweep_command_prints_the_table_and_refuses_a_bad_grid_in_one_line(tmp_path, corpus_dir):
    path = _grid(tmp_path, corpus_dir, TWO)
    res = CliRunner().invoke(main, ["bench", "sweep", str(path), "--out", str(tmp_path / "out"), "--time", "1s",
                                    "--eval-bytes", "512", "--only", "muon", "--json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "| muon | train.optimizer=muon train.schedule=wsd |" in res.output
    assert json.loads((tmp_path / "s.json").read_text())[0]["name"] == "muon"
    bad = _grid(tmp_path, corpus_dir, '[[candidate]]\nname = "a"\nsets = ["train.optimizer=sgd"]\n')
    res = CliRunner().invoke(main, ["bench", "sweep", str(bad), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 1 and "train.optimizer='sgd' is not allowed" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.slow  # trainings on a time budget
def test_a_signal_stops_the_sweep_and_its_candidate_trains_anew_next_time(tmp_path, corpus_dir, monkeypatch):
    real = sweep.train

    def stopped(*args, **kwargs):  # the candidate's training ends as Ctrl-C ends it
        return dataclasses.replace(real(*args, **kwargs), stopped_by="signal")

    monkeypatch.setattr(sweep, "train", stopped)
    path = _grid(tmp_path, corpus_dir, TWO)
    res = CliRunner().invoke(main, ["bench", "sweep", str(path), "--out", str(tmp_path / "out"), "--time", "1s",
                                    "--eval-bytes", "512"])
    assert res.exit_code == 130 and "Traceback" not in res.output
    assert "stopped during adamw: run the same command again to go on (it trains anew" in res.output
    assert not (tmp_path / "out" / "adamw" / sweep.RESULT).exists() and not (tmp_path / "out" / "muon").exists()
    monkeypatch.setattr(sweep, "train", real)
    (tmp_path / "out" / "adamw" / "stale").write_text("")
    results = sweep.run_sweep(sweep.read_grid(path), tmp_path / "out", budget_s=1.0, eval_bytes=512)
    assert [r.name for r in results] == ["adamw", "muon"]
    assert not (tmp_path / "out" / "adamw" / "stale").exists()  # its interrupted run was replaced


def test_a_corpus_without_a_val_split_stops_the_sweep_before_anything_trains(tmp_path):
    src = tmp_path / "files"
    src.mkdir()
    (src / "a.txt").write_text("some text " * 50)
    grid = sweep.read_grid(_grid(tmp_path, src, TWO))
    with pytest.raises(ValueError, match="candidate 'adamw': .* has no val split to score on"):
        sweep.run_sweep(grid, tmp_path / "out", budget_s=1.0)
    assert not (tmp_path / "out").exists()


def test_a_sweep_json_of_an_earlier_version_is_read_back_not_trained_again(tmp_path, corpus_dir):
    """The first sweeps wrote no train_s; a tuned one carries the decode case of its tuned heads."""
    case = {"speedup": 1.4, "speedup_min": 1.3, "speedup_max": 1.5, "speedup_runs": [1.3, 1.5],
            "bytes_per_forward": 2.0, "pass_cost": 1.1, "plain_bytes_s": 300.0, "spec_bytes_s": 420.0,
            "identical": True, "heads_used": {"8": 12}, "shapes": {"chain-8": 12},
            "repetition": {"decoded": {"distinct_8grams": 0.7, "zstd_ratio": 2.0, "bytes": 256}, "real": None,
                           "zstd_ratio_over_real": None}}
    old = {"name": "adamw", "sets": ["train.lr=3e-3"], "params": 123456, "budget_s": 1.0, "steps": 7,
           "bytes_seen": 7168, "stopped_by": "time", "val_bytes": 512, "val_bpb": [3.1, 4.2],
           "head_agreement": {"2": 0.25}, "tuned_chain_bytes_per_pass": 2.0, "tuned_tree_bytes_per_pass": 2.2,
           "eager_speedup": 1.4, "plain_bytes_s": 300.0, "repetition": case["repetition"], "decode": case}
    (tmp_path / "out" / "adamw").mkdir(parents=True)
    (tmp_path / "out" / "adamw" / sweep.RESULT).write_text(json.dumps(old, indent=2) + "\n")
    grid = sweep.read_grid(_grid(tmp_path, corpus_dir, TWO))
    [got] = sweep.run_sweep(grid, tmp_path / "out", budget_s=1.0, eval_bytes=512, only=["adamw"])
    assert not (tmp_path / "out" / "adamw" / "checkpoints").exists()  # read back, not trained
    assert got.train_s is None and got.head_agreement == {2: 0.25} and got.tuned.decode.figures.heads_used == {8: 12}
    assert list(json.loads(json.dumps(got.to_json())).items()) == list(old.items())
    assert json.loads((tmp_path / "out" / "adamw" / sweep.RESULT).read_text()) == old  # written back the same
    assert sweep.SweepResult([got]).table().splitlines()[2] == ("| adamw | train.lr=3e-3 | 0.12M | 7 | 0.01 MB | 3.100 | 0.250 | "
                                                  "2.00 | 1.40x | - |")
    untuned = {k: v for k, v in old.items() if k in list(old)[:10]} | {"train_s": 2.5}
    assert sweep.CandidateResult.from_json(untuned).tuned is None
    assert sweep.CandidateResult.from_json(untuned).to_json() == untuned


MEASURED = {"name": "adamw", "sets": ["train.lr=3e-3"], "params": 123456, "budget_s": 1.0, "steps": 7,
            "bytes_seen": 7168, "train_s": 1.0, "stopped_by": "time", "val_bytes": 512, "val_bpb": [3.1, 4.2],
            "head_agreement": {"2": 0.25}}


def _fake_tunes(monkeypatch, run_plan):
    """A tune's plan is its folder, and `run_plan` stands for its training: no model is trained."""
    monkeypatch.setattr(sweep.runs, "plan_tune", lambda source, tuned, *, overrides: tuned)
    monkeypatch.setattr(sweep, "run_plan", run_plan)


def _cut_tune(seen):
    def run_plan(tuned, *, say):  # a tune that Ctrl-C stops: it saves where it stopped, and says so
        seen.append(sorted(p.name for p in tuned.iterdir()) if tuned.exists() else None)
        (tuned / "checkpoints" / "step-000003").mkdir(parents=True)
        return RunResult(step=3, bytes_seen=0, stopped_by="signal", checkpoint=tuned / "checkpoints" / "step-000003",
                         val_bpb=None)
    return run_plan


def test_a_signal_in_a_tune_stops_the_sweep_keeps_no_figure_of_it_and_the_next_call_tunes_anew(
        tmp_path, corpus_dir, monkeypatch):
    out, seen = tmp_path / "out", []
    (out / "adamw").mkdir(parents=True)
    (out / "adamw" / sweep.RESULT).write_text(json.dumps(MEASURED))  # trained and measured, not tuned yet
    _fake_tunes(monkeypatch, _cut_tune(seen))
    args = ["bench", "sweep", str(_grid(tmp_path, corpus_dir, TWO)), "--out", str(out), "--only", "adamw",
            "--tune-time", "1s"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 130 and "Traceback" not in res.output and res.stdout == "", res.output
    assert res.stderr.strip().splitlines()[-1] == (
        "Error: stopped during adamw's tune: run the same command again to go on (the tune starts anew; adamw's "
        "training and the candidates measured are kept)")
    assert json.loads((out / "adamw" / sweep.RESULT).read_text()) == MEASURED  # the cut tune's figures not kept
    assert seen == [None] and (out / "adamw-tuned" / "checkpoints").is_dir()

    def interrupted(tuned, *, say):  # Ctrl-C where no training takes it: a KeyboardInterrupt
        seen.append(tuned.exists())
        raise KeyboardInterrupt

    _fake_tunes(monkeypatch, interrupted)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 130 and "Traceback" not in res.output
    assert "adamw's tune was interrupted before it was measured: tuning it anew" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("Error: stopped during adamw: run the same command again")
    assert seen == [None, False]  # the cut tune's folder went before the tune began again
    assert json.loads((out / "adamw" / sweep.RESULT).read_text()) == MEASURED

    # a candidate trained again (cut before it was measured) loses the tune of its earlier training first
    (out / "adamw" / sweep.RESULT).unlink()
    (out / "adamw-tuned" / "checkpoints").mkdir(parents=True)

    def train(cfg, run_dir, *, resume, say):
        seen.append((out / "adamw-tuned").exists())
        run_dir.mkdir(parents=True)
        return RunResult(step=1, bytes_seen=0, stopped_by="signal", checkpoint=None, val_bpb=None)

    monkeypatch.setattr(sweep, "train", train)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 130 and "stopped during adamw: run the same command again to go on (it trains anew" \
        in res.stderr
    assert seen == [None, False, False] and not (out / "adamw" / sweep.RESULT).exists()


def test_a_sweep_json_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    run_dir = tmp_path / "adamw"
    run_dir.mkdir()
    figures = sweep.CandidateResult.from_json(MEASURED)
    sweep._keep(run_dir, figures)
    real = sweep.os.replace

    def dies(src, dst):  # killed between the write and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep.os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        sweep._keep(run_dir, dataclasses.replace(figures, steps=8))
    monkeypatch.setattr(sweep.os, "replace", real)
    assert json.loads((run_dir / sweep.RESULT).read_text()) == MEASURED


def _trained_with(run_dir, cfg, **changed) -> None:
    """Leave in run_dir the run-config.json and sweep.json of a run trained with cfg, sections' settings `changed`."""
    from bytemtp.config_io import to_dict
    from bytemtp.training.runs import RUN_CONFIG

    saved = to_dict(cfg)
    for key, value in changed.items():
        section, name = key.split("__")
        saved[section][name] = value
    run_dir.mkdir(parents=True)
    (run_dir / RUN_CONFIG).write_text(json.dumps(saved))
    (run_dir / sweep.RESULT).write_text(json.dumps(MEASURED))


def test_a_run_trained_with_other_settings_is_refused_naming_them_or_trained_anew_when_fresh(
        tmp_path, corpus_dir, monkeypatch):
    grid = sweep.read_grid(_grid(tmp_path, corpus_dir, TWO))
    out = tmp_path / "out"
    _trained_with(out / "adamw", grid.config("adamw", budget_s=1.0))  # the same settings: read back
    assert sweep.run_sweep(grid, out, budget_s=1.0, only=["adamw"]) == [sweep.CandidateResult.from_json(MEASURED)]
    _trained_with(out / "muon", grid.config("muon", budget_s=1.0), train__max_time=5.0)
    (out / "muon-tuned").mkdir()
    with pytest.raises(ValueError, match=r"muon was trained with other settings than asked for now "
                                         r"\(train.max_time: 5.0 -> 1.0\); train it anew with --fresh, "
                                         r"or use another --out"):
        sweep.run_sweep(grid, out, budget_s=1.0)
    seen = []
    monkeypatch.setattr(sweep, "run_candidate", lambda grid, name, out, **kw: seen.append(
        (name, (out / name).exists(), (out / f"{name}-tuned").exists())))
    sweep.run_sweep(grid, out, budget_s=1.0, fresh=True)
    assert seen == [("adamw", True, False), ("muon", False, False)]  # the stale run and its tune went first


def test_fresh_leaves_a_run_that_another_sweep_is_training(tmp_path, corpus_dir):
    """--fresh pointed at a run of other settings that a training holds (another sweep's): refused
    in one line naming the holder, before any run or tune is removed (it was removed, and its
    run-config.json rewritten, while the first sweep went on)."""
    from bytemtp.training.runs import RunLocked, run_lock

    path = _grid(tmp_path, corpus_dir, TWO)
    grid, out = sweep.read_grid(path), tmp_path / "out"
    for name in ("adamw", "muon"):
        _trained_with(out / name, grid.config(name, budget_s=1.0), train__max_time=5.0)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    with run_lock(out / "muon"):  # a training of another process holds it
        with pytest.raises(RunLocked):
            sweep.run_sweep(grid, out, budget_s=1.0, fresh=True)
        res = CliRunner().invoke(main, ["bench", "sweep", str(path), "--out", str(out), "--time", "1s", "--fresh"])
    assert res.exit_code == 1 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert str(out / "muon") in res.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_bench_sweep_refuses_a_run_of_another_budget_in_one_line(tmp_path, corpus_dir):
    path = _grid(tmp_path, corpus_dir, TWO)
    _trained_with(tmp_path / "out" / "muon", sweep.read_grid(path).config("muon", budget_s=1.0), train__max_time=5.0)
    res = CliRunner().invoke(main, ["bench", "sweep", str(path), "--out", str(tmp_path / "out"), "--time", "1s"])
    assert res.exit_code == 1 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert "muon was trained with other settings than asked for now (train.max_time: 5.0 -> 1.0)" in res.output
    assert "--fresh" in res.output  # the refusal names the flag that trains it anew
    assert not (tmp_path / "out" / "adamw").exists()  # refused before anything trained


def test_bench_sweep_fresh_trains_a_run_of_other_settings_anew(tmp_path, corpus_dir, monkeypatch):
    path = _grid(tmp_path, corpus_dir, TWO)
    out = tmp_path / "out"
    _trained_with(out / "muon", sweep.read_grid(path).config("muon", budget_s=1.0), train__max_time=5.0)
    (out / "muon-tuned").mkdir()
    seen = []

    def run_candidate(grid, name, out, **kw):  # stands for the training: records what it found
        seen.append((name, (out / name).exists(), (out / f"{name}-tuned").exists()))
        return sweep.CandidateResult.from_json({**MEASURED, "name": name})

    monkeypatch.setattr(sweep, "run_candidate", run_candidate)
    res = CliRunner().invoke(main, ["bench", "sweep", str(path), "--out", str(out), "--time", "1s", "--fresh"])
    assert res.exit_code == 0, res.output
    assert seen == [("adamw", False, False), ("muon", False, False)]  # the stale run and its tune went first
    assert res.output.splitlines()[0].startswith("| candidate |") and "| muon |" in res.output


@pytest.mark.parametrize("command,module", [("quality", "bytemtp.experiments.quality"),
                                            ("tokens", "bytemtp.experiments.token_bench")])
def test_bench_quality_and_tokens_pass_fresh_to_the_sweep(tmp_path, monkeypatch, command, module):
    """bench quality and bench tokens train through run_sweep too: --fresh reaches it, and its
    refusal names the flag."""
    import importlib

    asked = []

    def compare(*args, **kwargs):
        asked.append(kwargs["fresh"])
        raise ValueError("refused: train it anew with --fresh")

    monkeypatch.setattr(importlib.import_module(module), "compare", compare)
    for flags in ((), ("--fresh",)):
        res = CliRunner().invoke(main, ["bench", command, "--out", str(tmp_path / "out"), "--device", "cpu", *flags])
        assert res.exit_code == 1 and "Traceback" not in res.output and "--fresh" in res.output
    assert asked == [False, True]
