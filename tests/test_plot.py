"""`bytemtp plot`: PNG figures from a run's metrics and an acceptance profile."""

import builtins
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bytemtp import config_io
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import save_checkpoint
from bytemtp.training import plot
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
    cfg = dataclasses.replace(config_io.tiny(), model=dataclasses.replace(config_io.tiny().model, n_future=4),
                              data=dataclasses.replace(config_io.tiny().data, path=str(corpus)))
    model = ByteMTP(cfg.model)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    save_checkpoint(run, step=7, model=model, config=cfg, train_state={})
    return run


def _loss_curve(k: int) -> tuple[list, list]:
    """Head k's training loss as _run logged it and loss.png must show it: steps, bits per byte
    (nan where the step logged null)."""
    nats = [3.0 - 0.1 * step + 0.2 * k for step in range(1, 7)] + [math.nan if k == 0 else 1.0]
    return list(range(1, 8)), [x / math.log(2) for x in nats]


LOSS_CURVES = {f"head {k + 1}": _loss_curve(k) for k in range(4)}
VAL_CURVES = {f"head {k + 1}": ([3, 6], [4.0 - 0.1 * step + 0.3 * k for step in (3, 6)]) for k in range(4)}


@pytest.fixture
def drawn(monkeypatch):
    """What each figure saved shows, by file name: per axes, its lines (label: x, y) and bars (x, height)."""
    import matplotlib.figure

    shown = {}
    real = matplotlib.figure.Figure.savefig

    def contents(ax) -> dict:
        lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
        return {"lines": lines, "bars": [(bar.get_x() + bar.get_width() / 2, bar.get_height()) for bar in ax.patches]}

    def savefig(fig, fname, *args, **kwargs):
        shown[Path(fname).name] = [contents(ax) for ax in fig.axes]
        return real(fig, fname, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return shown


def _assert_curves(axes, curves):
    (ax,) = axes
    assert ax["lines"].keys() == curves.keys()
    for label, (x, y) in curves.items():
        assert ax["lines"][label][0] == x, label
        np.testing.assert_allclose(ax["lines"][label][1], y, rtol=1e-12, err_msg=label)  # nan where null


def _assert_profile(axes, result):
    """acceptance.png: bars of the acceptance rate of heads 2..k and the bytes per pass, by k."""
    ks = sorted(int(k) for k in result["acceptance"])
    rates = [result["acceptance"][str(k)] for k in ks]
    per_pass = [result["bytes_per_forward"][str(k)] for k in ks]
    bars, line = axes
    # flat lists for approx: pytest 9.2 refuses nested structures (a list of pairs)
    assert [x for x, _ in bars["bars"]] == pytest.approx(ks, rel=1e-12)
    assert [h for _, h in bars["bars"]] == pytest.approx(rates, rel=1e-12)
    [(xs, ys)] = line["lines"].values()
    assert list(xs) == ks and list(ys) == pytest.approx(per_pass, rel=1e-12)


def _evaluated(run, batches):
    """What plot's evaluation finds: `bytemtp eval` of the run's model on its held-out split."""
    from bytemtp.evaluation.evaluate import evaluate
    from bytemtp.runtime.checkpoint import load_model

    model, cfg = load_model(run)
    result = evaluate(model, cfg.data.path, split="val", batches=batches)
    return json.loads(json.dumps(result.to_json()))  # keys as eval --json writes them


@pytest.mark.slow
def test_plot_writes_the_curves_and_the_profile(tmp_path, code_corpus, drawn):
    run = _run(tmp_path, code_corpus)
    res = CliRunner().invoke(main, ["plot", str(run), "--eval-batches", "2", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    for name in ("loss.png", "val_bpb.png", "acceptance.png"):
        assert (run / "plots" / name).read_bytes().startswith(PNG), name
        assert f"wrote {run / 'plots' / name}" in res.output
    _assert_curves(drawn["loss.png"], LOSS_CURVES)
    _assert_curves(drawn["val_bpb.png"], VAL_CURVES)
    _assert_profile(drawn["acceptance.png"], _evaluated(run, 2))


@pytest.mark.slow
def test_profile_from_eval_json_and_no_validation(tmp_path, code_corpus, drawn):
    run = _run(tmp_path, code_corpus, val=False)
    result = {"acceptance": {"2": 0.5, "3": 0.3, "4": 0.1}, "bytes_per_forward": {"2": 1.5, "3": 1.8, "4": 1.9}}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(result))
    res = CliRunner().invoke(main, ["plot", str(run), "--out", str(tmp_path / "figs"), "--eval", str(path)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["acceptance.png", "loss.png"]
    _assert_curves(drawn["loss.png"], LOSS_CURVES)
    _assert_profile(drawn["acceptance.png"], result)
    res = CliRunner().invoke(main, ["plot", str(run), "--out", str(tmp_path / "f2"), "--eval-batches", "0"])
    assert sorted(p.name for p in (tmp_path / "f2").iterdir()) == ["loss.png"]


def test_plot_takes_ckpt_like_the_other_commands(tmp_path, code_corpus, drawn):
    run = _run(tmp_path, code_corpus, val=False)
    res = CliRunner().invoke(main, ["plot", "--ckpt", str(run / "checkpoints" / "step-00000007"),
                                    "--eval-batches", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["acceptance.png", "loss.png"]
    _assert_curves(drawn["loss.png"], LOSS_CURVES)
    _assert_profile(drawn["acceptance.png"], _evaluated(run, 1))


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
