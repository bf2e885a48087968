"""PNG figures of a run: training loss and validation bits per byte of every head, and the
acceptance profile of self-speculative decoding. matplotlib is an optional extra
(`pip install 'bytemtp[plot]'`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from bytemtp.training.runs import METRICS


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plotting needs matplotlib, an optional extra: pip install 'bytemtp[plot]' "
                         "(or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def read_metrics(run_dir) -> tuple[list[dict], list[dict]]:
    """The training lines and the validation lines of a run's metrics.jsonl."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        raise ValueError(f"{path} does not exist: give a run directory that `bytemtp train` wrote")
    train, val = [], []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash
        if "val_bpb" in record:
            val.append(record)
        elif "head_loss" in record:
            train.append(record)
    if not train and not val:
        raise ValueError(f"{path} holds no logged step yet")
    return train, val


def _per_head(ax, records: list[dict], key: str, scale: float = 1.0) -> None:
    steps = [r["step"] for r in records]
    n = len(records[0][key])
    for k in range(n):
        ys = [r[key][k] * scale if r[key][k] is not None else math.nan for r in records]
        ax.plot(steps, ys, label=f"head {k + 1}", linewidth=1.2)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)


def training_curves(run_dir, out_dir) -> list[Path]:
    """loss.png (training loss of every head, bits per byte) and, when the run validated,
    val_bpb.png (validation bits per byte of every head)."""
    plt = _pyplot()
    train, val = read_metrics(run_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for records, key, scale, name, title in (
            (train, "head_loss", 1 / math.log(2), "loss.png", "training loss"),
            (val, "val_bpb", 1.0, "val_bpb.png", "validation")):
        if not records:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _per_head(ax, records, key, scale)
        ax.set_ylabel("bits per byte")
        ax.set_title(f"{Path(run_dir).name}: {title}")
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        written.append(out_dir / name)
    return written


def acceptance_profile(result, out_path) -> Path:
    """acceptance.png from `bytemtp eval`'s result (an `evaluate.EvalResult`): for each k, the
    fraction of positions at which heads 2..k are all right, and the bytes per forward pass that
    follow."""
    plt = _pyplot()
    ks = sorted(result.acceptance)
    rates = [result.acceptance[k] for k in ks]
    per_pass = [result.bytes_per_forward[k] for k in ks]
    fig, left = plt.subplots(figsize=(7, 4.5))
    left.bar(ks, rates, color="tab:blue", alpha=0.7, label="heads 2..k all right")
    left.set_xlabel("heads used (k)")
    left.set_ylabel("fraction of positions")
    left.set_ylim(0, 1)
    right = left.twinx()
    right.plot(ks, per_pass, "o-", color="tab:red", label="bytes per forward pass")
    right.set_ylabel("bytes per forward pass")
    right.set_ylim(1, max(per_pass) * 1.1)
    left.set_title("acceptance profile")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.9), fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def figures(run_dir, out_dir, profile=None) -> list[Path]:
    """Every figure of a run (the curves, and the acceptance profile when `profile`, an
    evaluation result, is given), written all or none: drawn into a temporary folder beside
    out_dir, then moved in, so a failure leaves no partial set."""
    _pyplot()
    read_metrics(run_dir)  # a run without metrics fails before anything is made
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-plot-", dir=out_dir.parent))
    try:
        drawn = training_curves(run_dir, tmp)
        if profile is not None:
            drawn.append(acceptance_profile(profile, tmp / "acceptance.png"))
        out_dir.mkdir(exist_ok=True)
        for path in drawn:
            os.replace(path, out_dir / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out_dir / path.name for path in drawn]
