"""Run directories: their layout, their lock, and a run resolved and checked before any work.

A run directory holds `run-config.json` (the resolved configuration), `metrics.jsonl` (one JSON
object per logged step or validation), `checkpoints/step-NNNNNNNN/` and `.lock`, and what the
trackers of train.log_to write (`tensorboard/`, `wandb/`, `wandb-run.json`; `tracking`). `plan_run`
turns what a user names (a new run directory, or a run to resume: its directory, its checkpoints/
folder or its newest checkpoint) and their settings into a `RunPlan`, refusing what cannot work
before any model is built: a run that another training holds, a tracker whose package is missing, a
preset with a resume, a change to anything but train.* on resume, a tokenizer file (data.tokenizer)
that is not the one the checkpoint was trained with, no stop condition, a corpus that does not exist
or is a run directory, a run directory that is taken. `plan_config` does the same for
a resolved Config, `plan_tune` for a tune of a run's draft heads. A run's corpus path is stored
absolute, and on resume the same corpus may be named another way, so a run works from any directory.

One writer at a time. A training holds an exclusive `fcntl.flock` on RUN/.lock (which names its
pid and host) from before it writes anything in the run until it ends; the operating system
drops the lock when the process dies, however it dies, so a crash never leaves a run locked. A
second training into the run stops at once with a `RunLocked` error that names the holder; `eval`,
`generate`, `plot` and `inspect` never take the lock. The lock file stays after the run
(removing it would race with a training that has just opened it: two trainings could then hold
locks on two different files); only who holds the lock counts, never whether the file exists.
flock needs a local filesystem or one that supports it (NFS v4 does); under torchrun the rank
that writes, rank 0, holds it for the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from bytemtp import config_io
from bytemtp.config import Config, TrainConfig
from bytemtp.config_io import to_dict, to_json
from bytemtp.data import corpus, shards
from bytemtp.runtime import distributed as dist_lib
from bytemtp.runtime.checkpoint import (check_tokenizer, is_checkpoint_dir, latest_checkpoint, load_config,
                                        read_train_state, resolve_checkpoint)
from bytemtp.training import tracking

RUN_CONFIG = "run-config.json"
METRICS = "metrics.jsonl"
LOCK = ".lock"


@dataclass
class RunResult:
    step: int
    bytes_seen: int
    # steps, bytes, schedule (fitted to the time), time or signal; done: the run had reached its limit before
    stopped_by: str
    checkpoint: Path
    val_bpb: list[float] | None



def check_new_run_dir(run_dir: Path) -> None:
    """A new run needs a directory without checkpoints that holds nothing but a run's files (a run
    that died before its first checkpoint leaves some, and starts over)."""
    if latest_checkpoint(run_dir) is not None:
        raise ValueError(f"run directory {run_dir} already exists; resume it, or choose another run directory")
    leftovers = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
    if leftovers - {RUN_CONFIG, METRICS, LOCK, "checkpoints", *tracking.FILES}:
        raise ValueError(f"{run_dir} exists and is not a run directory; choose another run directory")


def start_run(plan: RunPlan) -> Path | None:
    """Ready the run directory for training, by the one process that writes it, holding its lock;
    return the checkpoint to go on from (None for a new run). Checked again here, under the lock:
    another training may have written the run since it was planned. A resumed run drops the
    metrics that the interrupted one logged past its checkpoint (the trackers discard or skip them,
    `tracking`); a new run drops the metrics and TensorBoard events of a run that died before its
    first checkpoint, and starts a new W&B run. Both write run-config.json."""
    run_dir, ckpt = plan.run_dir, None
    if plan.resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ValueError(f"no checkpoint to resume in {run_dir}: expected "
                             f"{run_dir / 'checkpoints' / 'step-*'}/; start a new run there instead")
        keep_metrics_up_to(run_dir / METRICS, read_train_state(ckpt)["step"])
    else:
        check_new_run_dir(run_dir)
        (run_dir / METRICS).unlink(missing_ok=True)
        shutil.rmtree(run_dir / tracking.TENSORBOARD_DIR, ignore_errors=True)
        (run_dir / tracking.WANDB_RUN).unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_CONFIG).write_text(to_json(plan.cfg) + "\n")
    return ckpt


class RunLocked(ValueError):
    """Another training holds the run directory; the message names it (pid and host)."""


_held: set[int] = set()  # the lock files' descriptors that this process holds
_fork_hook = False


def _close_held_locks() -> None:
    """In a forked child (a DataLoader worker): close the copies of the parent's lock files, so
    that the lock goes with the trainer when it dies, not with the last of its children."""
    for fd in _held:
        os.close(fd)
    _held.clear()


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike):
    """Hold the run directory's lock for the block (the directory is made if need be); raise
    `RunLocked` at once, naming the holder, when another process holds it."""
    global _fork_hook
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunLocked(_locked(run_dir, holder)) from None
    except OSError as e:
        os.close(fd)
        raise ValueError(f"cannot lock {run_dir / LOCK} ({e.strerror}); put the run directory on a filesystem "
                         "that supports flock (a local disk, NFS v4)") from None
    try:
        if not _fork_hook:
            os.register_at_fork(after_in_child=_close_held_locks)
            _fork_hook = True
        _held.add(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        _held.discard(fd)
        os.close(fd)  # which releases the lock


def check_unlocked(run_dir: str | os.PathLike) -> None:
    """Raise `RunLocked` when a training holds the run directory; reads only (a directory
    without a lock file is free)."""
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunLocked(_locked(Path(run_dir), _holder(fd))) from None
    except OSError:
        pass  # a filesystem without flock: taking the lock says so
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    return os.pread(fd, 256, 0).decode(errors="replace").strip() or "a process that has not written its pid yet"


def _locked(run_dir: Path, holder: str) -> str:
    return (f"{run_dir} is in use by a training that is running ({holder}); a run has one writer at a time: "
            "wait for that training to end or stop it, or train into another run directory")


def already_done(run_dir: Path, tc: TrainConfig) -> RunResult | None:
    """The newest checkpoint, as a result, when it has already reached the step or bytes limit or
    the end of a schedule fitted to its time (then resuming changes nothing); None when there is
    training left or no checkpoint."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return None
    state = read_train_state(ckpt)
    step, seen = state.get("step", 0), state.get("bytes_seen", 0)
    fitted = state.get("schedule_steps", 0)
    if not ((tc.steps and step >= tc.steps) or (tc.max_bytes and seen >= tc.max_bytes) or (fitted and step >= fitted)):
        return None
    return RunResult(step=step, bytes_seen=seen, stopped_by="done", checkpoint=ckpt,
                     val_bpb=state.get("val_bpb"))


def metrics_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl, in order (none where it does not exist; a torn line left out)."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else ():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


def keep_metrics_up_to(path: Path, step: int) -> None:
    """After a resume, drop the lines that the interrupted run logged past its checkpoint."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):  # a line torn by the crash
            continue
    path.write_text("".join(line + "\n" for line in kept))



def absolute_corpus(cfg: Config) -> Config:
    """cfg with data.path made absolute (against the current directory), so that the run's
    config.json names its corpus from anywhere."""
    path = cfg.data.path
    if os.path.isabs(path):
        return cfg
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=os.path.abspath(path)))


def same_corpus(a: str, b: str) -> bool:
    """Whether two corpus specs name the same corpus: the same real path, or two prepared corpora
    with the same manifest (a copy, or the same folder reached another way)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return shards.read_manifest(a) == shards.read_manifest(b)
    except shards.CorpusError:
        return False


def run_dir_of(path: str | os.PathLike) -> Path:
    """The run directory that a path to resume names: itself, or the run of its checkpoints/
    folder or of one of its checkpoints."""
    path = Path(path)
    if is_checkpoint_dir(path):
        return path.parent.parent
    return path.parent if path.name == "checkpoints" and not (path / "checkpoints").exists() else path


def resume_target(path: str | os.PathLike) -> tuple[Path, Path]:
    """(run directory, checkpoint) that resuming `path` continues: a run directory (its newest
    checkpoint), its checkpoints/ folder, or its newest checkpoint itself."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist; resume a run directory that `bytemtp train` wrote")
    run_dir = run_dir_of(path)
    latest = latest_checkpoint(run_dir)
    if is_checkpoint_dir(path):
        if path.parent.name != "checkpoints":
            raise ValueError(f"{path} is a checkpoint outside a run directory (RUN/checkpoints/step-*); "
                             "only a run can be resumed")
        if latest is None or latest.resolve() != path.resolve():
            newer = f"{latest.name} is its newest" if latest is not None else "it is incomplete"
            raise ValueError(f"{path} is not the newest checkpoint of {run_dir} ({newer}); resume the run "
                             f"directory {run_dir} to go on from its newest, or delete the newer "
                             f"checkpoints in {path.parent} to go back to {path.name}")
        return run_dir, path
    if latest is None:
        raise ValueError(f"no checkpoint to resume in {run_dir} (expected "
                         f"{run_dir / 'checkpoints' / 'step-*'}/); start a new run there instead")
    return run_dir, latest


@dataclass(frozen=True)
class RunPlan:
    """A run resolved and checked before any work: where it lives, its config and what to do;
    `bytemtp.training.train.run_plan` carries it out."""

    run_dir: Path
    cfg: Config  # data.path absolute
    resume: bool
    checkpoint: Path | None  # the newest checkpoint, that a resumed run goes on from
    done: RunResult | None  # a resumed run that has already reached its step or bytes limit


def plan_run(path: str | os.PathLike, *, resume: bool = False, preset: str | None = None,
             config_file: str | None = None, overrides: list[str] = ()) -> RunPlan:
    """The run that `bytemtp train` starts or resumes, from what a user typed.

    A new run: the preset (default small), then a config file, then each override. A resumed run
    (`path` a run directory, its checkpoints/ folder or its newest checkpoint): the checkpoint's
    config takes the preset's place and a preset is refused. Then `plan_config` checks the rest;
    a run that another training holds is refused first."""
    if resume and preset is not None:
        raise ValueError(f"--preset {preset} is for a new run; a resumed run keeps its checkpoint's settings "
                         "(change train.* with --set or --config)")
    check_unlocked(run_dir_of(path) if resume else Path(path))
    if resume:
        run_dir, ckpt = resume_target(path)
        saved = load_config(ckpt)
        cfg = config_io.load_file(config_file, saved) if config_file else saved
    else:
        run_dir = Path(path)
        cfg = config_io.resolve(preset or "small", config_file=config_file)
    return plan_config(config_io.apply_overrides(cfg, list(overrides)), run_dir, resume=resume)


def plan_config(cfg: Config, run_dir: str | os.PathLike, *, resume: bool = False) -> RunPlan:
    """The plan of a resolved config in run_dir, every check made before any work.

    Refused: a run that another training holds (`RunLocked`), a config without a stop condition,
    a corpus that does not exist, a tracker (train.log_to) whose package does not import. A new run
    also needs a new run directory (or one left by a run that died before its first checkpoint) and
    a corpus that is not a run directory; a resumed run needs a checkpoint, and only train.* may
    differ from its config (data.path may name the same corpus another way). Restarted by torchrun
    (--max-restarts), a new run that has a checkpoint is resumed: the job goes on from where it failed."""
    run_dir = Path(run_dir)
    check_unlocked(run_dir)
    tc = cfg.train
    if not (tc.steps or tc.max_bytes or tc.max_time):
        raise ValueError("no stop condition: set train.steps, train.max_bytes or train.max_time "
                         "(--steps, --bytes or --time)")
    if not resume and dist_lib.restarted() and latest_checkpoint(run_dir) is not None:
        resume = True
    ckpt = None
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ValueError(f"no checkpoint to resume in {run_dir} (expected "
                             f"{run_dir / 'checkpoints' / 'step-*'}/); start a new run there instead")
        cfg = config_for_resume(load_config(ckpt), cfg)
        check_tokenizer(ckpt, cfg.data.tokenizer)
    else:
        check_not_a_run(cfg.data.path)
        check_new_run_dir(run_dir)
    if cfg.train.init and not resume:  # the weights a new run starts from were trained on its tokenizer's ids too
        check_tokenizer(resolve_checkpoint(cfg.train.init), cfg.data.tokenizer)
    cfg = absolute_corpus(cfg)
    corpus.corpus_files(cfg.data.path)  # a missing corpus fails here, before any work
    tracking.require(cfg.train.log_targets)  # and a missing tracker package
    return RunPlan(run_dir=run_dir, cfg=cfg, resume=resume, checkpoint=ckpt,
                   done=already_done(run_dir, cfg.train) if resume else None)


def tune_config(saved: Config, ckpt: Path) -> Config:
    """The settings a heads-only tune starts from: the source run's model, data and optimiser,
    its weights (train.init), only heads 2..n trained, with its own stop conditions, a short
    warmup and constant head weights (a source trained with a reverse head schedule ends with its
    draft heads at the floor); the second half of every window is the model's own greedy continuation
    (loss.rollout_bytes), and the draft heads learn it both as data and from head 1 as teacher."""
    train = dataclasses.replace(saved.train, init=str(ckpt.resolve()), trainable="draft-heads", steps=0,
                                max_bytes=0, max_time=0.0, schedule_steps=0,
                                warmup_steps=min(saved.train.warmup_steps, 20))
    loss = dataclasses.replace(saved.loss, head_schedule="constant", teacher_weight=1.0, draft_data_weight=1.0,
                               rollout_bytes=saved.model.seq_len // 2)
    return dataclasses.replace(saved, train=train, loss=loss)


def plan_tune(source: str | os.PathLike, out: str | os.PathLike, *, config_file: str | None = None,
              overrides: list[str] = ()) -> RunPlan:
    """A new run in `out` that tunes the draft heads of `source` (a run, its newest checkpoint,
    or a checkpoint): `tune_config`, then a config file, then each override. model.* stays the
    source's (the weights are its), and `out` must be a new run directory (`plan_config`)."""
    ckpt = resolve_checkpoint(source)
    saved = load_config(ckpt)
    if saved.model.n_future < 2:
        raise ValueError(f"{ckpt} has one head (model.n_future=1): there are no draft heads to tune")
    base = tune_config(saved, ckpt)
    cfg = config_io.load_file(config_file, base) if config_file else base
    cfg = config_io.apply_overrides(cfg, list(overrides))
    if dataclasses.replace(cfg.model, draft=saved.model.draft) != saved.model:
        raise ValueError("model.* cannot change in a tune (but model.draft, which adds draft heads): it starts "
                         f"from the weights of {ckpt}; train a new run for another model")
    run_dir = Path(out)
    if run_dir.resolve() == ckpt.resolve().parent.parent:
        raise ValueError(f"{out} is the run being tuned; write the tune to a new run directory (--out)")
    return plan_config(cfg, run_dir)


def check_not_a_run(spec) -> None:
    """Refuse a corpus that names a run directory (it holds checkpoints/ or run-config.json):
    training on checkpoint binaries is a mistake. Files inside a run can still be named one by
    one or with a glob."""
    for item in spec if isinstance(spec, (list, tuple)) else [spec]:
        path = Path(item)
        if path.is_dir() and ((path / "checkpoints").is_dir() or (path / RUN_CONFIG).is_file()):
            raise ValueError(f"the corpus {item} is a run directory (it holds "
                             f"{'checkpoints/' if (path / 'checkpoints').is_dir() else RUN_CONFIG}), not text to "
                             "train on; name a corpus, or its files with a glob if you mean them")


def config_for_resume(saved: Config, resolved: Config) -> Config:
    """On resume only train.* may change; a change elsewhere would not match the checkpoint.
    data.path may name the same corpus another way (another directory, a link, a copy)."""
    for section in ("model", "loss", "data"):
        before, after = to_dict(getattr(saved, section)), to_dict(getattr(resolved, section))
        for key in before:
            if section == "data" and key == "path":
                old, new = before[key], after[key]
                if old == new and not os.path.isabs(old) and not os.path.exists(old):
                    raise ValueError(f"the run's corpus {old} was named relative to the directory the "
                                     f"run started in and does not exist from here; name the corpus again (data.path)")
                if old == new or same_corpus(old, new) or (not os.path.isabs(old) and not os.path.exists(old)):
                    continue  # a relative name from another directory cannot be checked: the new one counts
            if before[key] != after[key]:
                raise ValueError(f"{section}.{key} cannot change when resuming (checkpoint has "
                                 f"{before[key]!r}, asked {after[key]!r}); start a new run instead")
    return resolved
