"""`bytemtp plot`: PNG figures from a run's metrics and an acceptance profile."""

import builtins
import dataclasses
import json

import pytest
from click.testing import CliRunner

from bytemtp import config as C
from bytemtp import plot
from bytemtp.checkpoint import save_checkpoint
from bytemtp.model import ByteMTP
from bytemtp_cli.main import main

PNG = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path, corpus, *, val=True):
    run = tmp_path / "run"
    run.mkdir()
    lines = []
    for step in range(1, 7):
        lines.append({"step": step, "loss": 20.0 - step, "head_loss": [3.0 - 0.1 * step + 0.2 * k for k in range(4)],
                      "bpb": 4.0})
        if val and step % 3 == 0:
            lines.append({"step": step, "val_bpb": [4.0 - 0.1 * step + 0.3 * k for k in range(4)]})
    lines.append({"step": 7, "head_loss": [None, 1.0, 1.0, 1.0]})  # a non-finite step logs null
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn": ')
    cfg = dataclasses.replace(C.tiny(), model=dataclasses.replace(C.tiny().model, n_future=4),
                              data=dataclasses.replace(C.tiny().data, path=str(corpus)))
    save_checkpoint(run, step=7, model=ByteMTP(cfg.model), config=cfg, train_state={})
    return run


@pytest.mark.slow
def test_plot_writes_the_curves_and_the_profile(tmp_path, code_corpus):
    run = _run(tmp_path, code_corpus)
    res = CliRunner().invoke(main, ["plot", str(run), "--eval-batches", "2", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    for name in ("loss.png", "val_bpb.png", "acceptance.png"):
        data = (run / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
        assert f"wrote {run / 'plots' / name}" in res.output


@pytest.mark.slow
def test_profile_from_eval_json_and_no_validation(tmp_path, code_corpus):
    run = _run(tmp_path, code_corpus, val=False)
    result = {"acceptance": {"2": 0.5, "3": 0.3, "4": 0.1}, "bytes_per_forward": {"2": 1.5, "3": 1.8, "4": 1.9}}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(result))
    res = CliRunner().invoke(main, ["plot", str(run), "--out", str(tmp_path / "figs"), "--eval", str(path)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["acceptance.png", "loss.png"]
    res = CliRunner().invoke(main, ["plot", str(run), "--out", str(tmp_path / "f2"), "--eval-batches", "0"])
    assert sorted(p.name for p in (tmp_path / "f2").iterdir()) == ["loss.png"]


def test_plot_takes_ckpt_like_the_other_commands(tmp_path, code_corpus):
    run = _run(tmp_path, code_corpus, val=False)
    res = CliRunner().invoke(main, ["plot", "--ckpt", str(run / "checkpoints" / "step-00000007"),
                                    "--eval-batches", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["acceptance.png", "loss.png"]


def test_a_failure_leaves_no_figure(tmp_path):
    run = _run(tmp_path, tmp_path / "gone")  # the run's corpus is missing: the evaluation fails
    res = CliRunner().invoke(main, ["plot", str(run), "--eval-batches", "2", "--device", "cpu"])
    assert res.exit_code != 0 and "gone does not exist" in res.output and "Traceback" not in res.output
    assert not (run / "plots").exists()
    assert [p.name for p in run.iterdir() if p.name.startswith(".tmp")] == []


def test_clear_errors(tmp_path, monkeypatch):
    res = CliRunner().invoke(main, ["plot", str(tmp_path / "nothing")])
    assert res.exit_code != 0 and "metrics.jsonl does not exist" in res.output and "Traceback" not in res.output
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ValueError, match=r"pip install 'bytemtp\[plot\]'"):
        plot.acceptance_profile({"acceptance": {}, "bytes_per_forward": {}}, tmp_path / "a.png")
