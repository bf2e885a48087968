"""The trackers beside metrics.jsonl (bytemtp.training.tracking, train.log_to): TensorBoard's event
files and W&B's offline run hold the rows of metrics.jsonl, a resumed run continues them with every
step once, a missing package is one line before any work, and a failing tracker does not stop
training.

Runs use the tiny preset on conftest's `corpus_dir` and train in this process. A run "crashes"
by losing its newest checkpoint, so that its trackers hold steps past the one it resumes from;
W&B's log is also cut short as a killed writer leaves it, and one run is killed for real
(SIGKILL, in a subprocess).
"""

from __future__ import annotations

import glob
import json
import math
import shutil
import struct
import sys

import pytest
from train_runs import cli, read_metrics, signal_at_step, start_cli, tiny_cfg

import bytemtp.training.train as train_lib
from bytemtp import config_io
from bytemtp.runtime.checkpoint import latest_checkpoint
from bytemtp.training import tracking

SETS = ("train.eval_every=3", "train.ckpt_every=3")


def _expected(records: list[dict]) -> dict[tuple[str, int], float]:
    """{(name, step): value} as the trackers name a record's numbers (tracking's docstring): KEY,
    KEY/hN for a list's N-th value, KEY/SUB for a dict's; None and non-finite values left out."""
    out = {}

    def walk(name, value, step):
        if isinstance(value, dict):
            for key, v in value.items():
                walk(f"{name}/{key}", v, step)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{name}/h{i + 1}", v, step)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name, step] = value

    for record in records:
        for key, value in record.items():
            if key != "step":
                walk(key, value, record["step"])
    return out


def _crash_and_resume(cfg_sets: tuple[str, ...], corpus_dir, run, crash=lambda: None):
    """Train 8 steps (checkpoints 3, 6, 8), lose checkpoint 8 (and whatever `crash` does), resume to
    step 10 from step 6; return the records of metrics.jsonl before the resume and after it."""
    say = lambda m: None  # noqa: E731
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=8", *SETS, *cfg_sets), run, show_progress=False, say=say)
    first = read_metrics(run)
    assert {r["step"] for r in first} == set(range(1, 9))
    shutil.rmtree(latest_checkpoint(run))
    assert latest_checkpoint(run).name == "step-00000006"
    crash()
    result = train_lib.train(tiny_cfg(corpus_dir, "train.steps=10", *SETS, *cfg_sets), run, resume=True,
                             show_progress=False, say=say)
    assert result.step == 10
    return first, read_metrics(run)


# --- TensorBoard ----------------------------------------------------------------------------------


def _events(run):
    """{tag: [(step, value), ...]} of the run's scalars, and the accumulator (for its texts)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}, acc


def _check_events(events: dict, records: list[dict]) -> None:
    expected = _expected(records)
    got = {(tag, step): value for tag, points in events.items() for step, value in points}
    for tag, points in events.items():  # every step once, in order
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), f"{tag}: {steps}"
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-30), key  # stored as float32


def test_tensorboard_holds_every_metric_and_a_resumed_run_continues_it(tmp_path, corpus_dir):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    first, after = _crash_and_resume(("train.log_to=jsonl,tensorboard",), corpus_dir, run)
    assert {r["step"] for r in after} == set(range(1, 11)) and len(after) == 10 + 4  # 4 validations: 3, 6, 9, 10
    events, acc = _events(run)
    assert {"loss", "bpb", "lr", "grad_norm", "bytes_per_s", "head_loss/h8", "head_acc/h1", "val_bpb/h1",
            "val_agreed_bytes_per_forward/h8", "data/documents"} <= set(events)
    _check_events(events, after)
    # steps 7 and 8 are the resumed session's: the first session's were discarded (their times differ)
    elapsed = dict(events["elapsed_s"])
    old = {r["step"]: r["elapsed_s"] for r in first if "elapsed_s" in r}
    new = {r["step"]: r["elapsed_s"] for r in after if "elapsed_s" in r}
    assert elapsed[7] == pytest.approx(new[7], rel=1e-6) and old[7] != new[7]
    # the settings, as a text of each session (steps 0 and 6)
    texts = acc.Tensors("config/text_summary")
    assert [t.step for t in texts] == [0, 6]
    assert '"log_to": "jsonl,tensorboard"' in texts[-1].tensor_proto.string_val[0].decode()


# --- W&B ------------------------------------------------------------------------------------------


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B offline and quiet, every folder of its own under tmp_path; no network, no login."""
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))


def _new_wandb_service():
    """Shut this process's W&B service down, as the end of a process does: only then are the logs
    of the runs it served sure to be written out (`run.finish` may return before)."""
    import wandb

    wandb.teardown()


def _wandb_records(path):
    """The records of a .wandb file: W&B's LevelDB-style log (a 7-byte header, then 32 KiB blocks
    of chunks, each with a checksum, a length and a type: full, first, middle or last), up to a
    chunk cut short."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zeroed: the rest of the block is padding
            pos += block - pos % block
            continue
        if pos + 7 + length > len(data):
            break
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, or the last chunk of a record
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _wandb_sessions(run) -> list[tuple[str, list[dict], dict]]:
    """Each offline session of the run, in order: (its run id, its history rows, its config); a
    session killed before its log's first block was written has none."""
    _new_wandb_service()  # the logs written out
    sessions = []
    for folder in sorted(glob.glob(str(run / "wandb" / "offline-run-*"))):  # offline-run-DATE_TIME-ID
        rows, config, run_id = [], {}, folder.rsplit("-", 1)[1]
        for record in (r for path in glob.glob(f"{folder}/run-*.wandb") for r in _wandb_records(path)):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
            elif kind == "run":
                run_id = record.run.run_id
                config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
        sessions.append((run_id, rows, config))
    return sessions


def test_wandb_offline_holds_every_metric_and_a_resumed_run_continues_the_same_run(tmp_path, corpus_dir,
                                                                                    wandb_offline):
    run = tmp_path / "run"
    first, after = _crash_and_resume(("train.log_to=wandb",), corpus_dir, run)
    sessions = _wandb_sessions(run)
    assert len(sessions) == 2 and sessions[0][0] == sessions[1][0]  # one W&B run, continued
    assert json.loads((run / "wandb-run.json").read_text()) == {"id": sessions[0][0]}
    assert sessions[1][2]["train"]["log_to"] == "wandb" and sessions[1][2]["model"]["d_model"] == 32
    rows = [row for _, session_rows, _ in sessions for row in session_rows]
    steps = [row["_step"] for row in rows]
    assert steps == list(range(1, 11))  # every step once: 7 and 8 are the first session's, not logged again
    # a row per step: the first session's rows up to step 8 (metrics.jsonl before the resume), then the resumed one's
    records = [r for r in first] + [r for r in after if r["step"] > 8]
    got = {(name, row["_step"]): value for row in rows for name, value in row.items() if not name.startswith("_")}
    assert got == _expected(records)


def _cut_the_wandb_log(run) -> int:
    """Cut the run's W&B log in the middle of a record after step 4's, as a writer killed with
    records in its buffer leaves it (whole blocks on disk, or a torn last one); return the last step
    it still holds."""
    (path,) = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = open(path, "rb").read()
    low, high = 7, len(data)  # the shortest prefix that holds step 4 (what a prefix holds only grows)
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if _last_step(data[:mid]) >= 4 else (mid + 1, high)
    cut = low + 3  # past step 4's record and into the next chunk
    with open(path, "wb") as f:
        f.write(data[:cut])
    assert _last_step(data[:cut]) < 8
    return _last_step(data[:cut])


def _last_step(data: bytes) -> int:
    from wandb.proto import wandb_internal_pb2 as pb

    steps = [0]
    for raw in tracking.wandb_log_records(data):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            steps.append(record.history.step.num)
    return max(steps)


def test_a_resumed_wandb_run_logs_again_the_steps_a_killed_session_had_not_written(tmp_path, corpus_dir,
                                                                                   wandb_offline):
    """The steps an interrupted session handed to W&B but W&B had not written when it died are
    logged by the resumed session: what counts is what the log holds, not what was handed over.
    Those at or before the checkpoint it resumes from (step 6) come from metrics.jsonl, the rest
    from its own training."""
    run = tmp_path / "run"
    held = []
    first, after = _crash_and_resume(("train.log_to=wandb",), corpus_dir, run,
                                     crash=lambda: (_new_wandb_service(), held.append(_cut_the_wandb_log(run))))
    assert held == [4]  # the log ends before the checkpoint
    sessions = _wandb_sessions(run)
    assert [[row["_step"] for row in rows] for _, rows, _ in sessions] == [[1, 2, 3, 4], list(range(5, 11))]
    got = {(name, row["_step"]): value for _, rows, _ in sessions for row in rows
           for name, value in row.items() if not name.startswith("_")}
    assert got == _expected(after)  # what metrics.jsonl holds, every step once


@pytest.mark.slow
def test_wandb_through_a_sigkill_and_a_resume_holds_every_step_once(tmp_path, corpus_dir, wandb_offline):
    """`bytemtp train` killed with SIGKILL after a checkpoint and resumed: the W&B run's history
    holds every step once, those the killed session had not yet written included."""
    import signal
    import subprocess

    run, steps = tmp_path / "run", 40
    cmd = [sys.executable, "-m", "bytemtp_cli", "train"]
    args = ["--preset", "tiny", "--data", str(corpus_dir), "--out", str(run), "--steps", str(steps),
            "--set", "train.log_every=1", "--set", "data.batch_size=4", "--set", "train.ckpt_every=10",
            "--set", "train.eval_every=1000", "--set", "train.compile=off", "--set", "train.log_to=jsonl,wandb"]
    log = tmp_path / "first.log"
    proc = start_cli(args, log)
    signal_at_step(proc, run, 15, log, signal.SIGKILL)  # after the checkpoint at step 10
    assert proc.returncode == -signal.SIGKILL and latest_checkpoint(run) is not None, log.read_text()[-3000:]
    resumed = subprocess.run([*cmd, "--resume", str(run)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    sessions = _wandb_sessions(run)
    assert len(sessions) == 2 and sessions[0][0] == sessions[1][0]
    assert [row["_step"] for _, rows, _ in sessions for row in rows] == list(range(1, steps + 1))


# --- errors and failures --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_package_is_one_line_naming_the_extra(name, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # `import NAME` fails as if it were not installed
    with pytest.raises(ValueError) as e:
        tracking.require(("jsonl", name))
    assert str(e.value) == f"train.log_to={name} needs the {name} package: pip install 'bytemtp[{name}]'"
    tracking.require(("jsonl",))  # jsonl needs nothing


def test_the_train_command_refuses_a_missing_tracker_before_any_work(tmp_path, corpus_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    new = tmp_path / "new"
    res = cli("--preset", "tiny", "--data", corpus_dir, "--out", new, "--steps", 2, "--set", "train.log_to=jsonl,wandb")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.stderr.strip().splitlines() == [
        "Error: train.log_to=wandb needs the wandb package: pip install 'bytemtp[wandb]'"]
    assert not new.exists()


def test_log_to_is_checked_and_read_as_a_list():
    cfg = config_io.resolve("tiny", overrides=["train.log_to= tensorboard ,jsonl,wandb,tensorboard"])
    assert cfg.train.log_targets == ("jsonl", "tensorboard", "wandb")
    assert config_io.resolve("tiny").train.log_targets == ("jsonl",)
    with pytest.raises(ValueError) as e:
        config_io.resolve("tiny", overrides=["train.log_to=jsonl,mlflow"])
    assert str(e.value) == ("train.log_to='jsonl,mlflow' is not allowed; a comma-separated list of jsonl, "
                            "tensorboard, wandb")


def test_a_failing_tracker_warns_once_and_training_goes_on(tmp_path, corpus_dir, monkeypatch):
    pytest.importorskip("tensorboard")

    def full(self, record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking.TensorBoardTracker, "log", full)
    said = []
    run = tmp_path / "run"
    result = train_lib.train(tiny_cfg(corpus_dir, "train.steps=4", "train.log_to=tensorboard"), run,
                             show_progress=False, say=said.append)
    assert result.step == 4 and [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 4]  # and the last validation
    warnings = [m for m in said if m.startswith("warning")]
    assert warnings == ["warning: cannot log to tensorboard (train.log_to): [Errno 28] No space left on device; "
                        "training goes on"]


def test_a_tracker_that_cannot_start_warns_and_the_run_trains(tmp_path, corpus_dir, monkeypatch):
    pytest.importorskip("tensorboard")

    def broken(self, run_dir, cfg, *, step):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(tracking.TensorBoardTracker, "__init__", broken)
    said = []
    result = train_lib.train(tiny_cfg(corpus_dir, "train.steps=2", "train.log_to=tensorboard"), tmp_path / "run",
                             show_progress=False, say=said.append)
    assert result.step == 2
    assert "warning: cannot start tensorboard (train.log_to): [Errno 13] Permission denied; training goes on " \
           "without it" in said


def test_the_trackers_share_out_records_and_a_failure_spares_the_others():
    seen, calls = [], {"n": 0}

    class Flaky:
        def log(self, record):
            calls["n"] += 1
            if calls["n"] in (1, 2, 4):
                raise RuntimeError("network down")

        def close(self):
            pass

    class Good:
        def log(self, record):
            seen.append(record["step"])

        def close(self):
            seen.append("closed")

    said = []
    trackers = tracking.Trackers({"wandb": Flaky(), "tensorboard": Good()}, say=said.append)
    for step in range(1, 6):
        trackers.log({"step": step, "loss": 1.0})
    trackers.close()
    assert seen == [1, 2, 3, 4, 5, "closed"]
    # once when it fails, and again only after it has worked in between
    assert said == ["warning: cannot log to wandb (train.log_to): network down; training goes on"] * 2


def test_scalars_name_a_records_numbers():
    record = {"step": 5, "loss": 2.5, "bytes": 1024, "val_bpb": [1.0, None, float("nan"), 3.0],
              "data": {"documents": 3, "skipped": {"bad_json": 2}}, "flag": True, "inf": float("inf")}
    assert tracking.scalars(record) == {"loss": 2.5, "bytes": 1024, "val_bpb/h1": 1.0, "val_bpb/h4": 3.0,
                                        "data/documents": 3, "data/skipped/bad_json": 2}


def test_wandb_is_offline_unless_it_is_set_up(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # none there
    assert tracking.wandb_mode() == "offline"
    (tmp_path / "netrc").write_text("machine example.org login user password secret\n")
    assert tracking.wandb_mode() == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password secret\n")
    assert tracking.wandb_mode() is None  # `wandb login` was run: W&B decides (online)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc-none"))
    monkeypatch.setenv("WANDB_API_KEY", "key")
    assert tracking.wandb_mode() is None
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.wandb_mode() is None  # W&B reads WANDB_MODE itself


def test_a_new_run_clears_what_a_run_that_died_before_its_first_checkpoint_logged(tmp_path, corpus_dir):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    (run / "tensorboard" / "events.out.tfevents.0.dead").write_bytes(b"torn")
    (run / "wandb-run.json").write_text('{"id": "dead0000", "step": 40}\n')
    (run / "metrics.jsonl").write_text('{"step": 40, "loss": 1.0}\n')
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=2", "train.log_to=tensorboard"), run, show_progress=False,
                    say=lambda m: None)
    assert not (run / "wandb-run.json").exists() and len(list((run / "tensorboard").iterdir())) == 1
    events, _ = _events(run)
    _check_events(events, read_metrics(run))
