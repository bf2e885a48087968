"""Experiment trackers beside metrics.jsonl (train.log_to): TensorBoard and Weights & Biases.

metrics.jsonl is always written (`bytemtp.training.train`); train.log_to=jsonl,tensorboard,wandb
names the trackers that receive the same records. A tracker is an object with `log(record)` and
`close()`; `open_trackers` opens those a run names on the rank that logs (rank 0), and `Trackers`
feeds every record to each. Each package is imported only when a run names it: `require`, called
when a run is planned (on every rank, before any work), turns a missing one into a one-line
ValueError that names the extra to install.

One record, one row at `record["step"]`, as `scalars` names it: a number is a scalar of the
record's key (`loss`, `bpb`, `lr`, `grad_norm`, `bytes_per_s`, `val_bpb` ...); a list, one value a
head, is one scalar a head, `KEY/hN` for its N-th value (`head_loss/h1` .. `head_loss/h8`,
`val_bpb/h1`; `val_agreed_bytes_per_forward/hN` is the bytes a pass that heads 1..N agree on); a
dict is flattened with `/` (`data/documents`, `data/skipped/REASON`); None, booleans and non-finite
values are left out (metrics.jsonl writes null for a non-finite value).

TensorBoard: event files in RUN/tensorboard/, so `tensorboard --logdir runs/` shows every run; the
run's settings as a text (`config`, the JSON of run-config.json) and as hyperparameters (the
HPARAMS tab, against `loss` and `val_bpb/h1`), both at the session's first step. W&B: a run named
after the run directory in project $WANDB_PROJECT (default bytemtp), its files under RUN/wandb/,
the settings as its config, the console not captured. It is online only when W&B is set up: when
WANDB_MODE says so, or when an API key is there (WANDB_API_KEY, or a ~/.netrc entry for W&B's host,
which `wandb login` writes); otherwise offline, and `wandb sync RUN/wandb/offline-run-*` uploads it
later. WANDB_MODE always decides when set (offline, online, disabled).

Resume: a resumed run continues the same curves, each step once. The interrupted session may have
logged steps after the checkpoint it resumes from (metrics.jsonl drops them, `runs.start_run`).
TensorBoard's writer opens with purge_step = the checkpoint's step + 1, which makes TensorBoard
discard the earlier sessions' events from that step on, so the resumed session's rows replace
them. W&B cannot take rows back: RUN/wandb-run.json keeps the W&B run's id; a resumed session
continues that run (the same id, resume="allow") and leaves out the steps that the earlier
sessions' logs hold (with exact resume, the same losses; timings differ). What a log holds is read
from the log itself (`wandb_logged_step`), not from what was handed to W&B: its writer keeps the
newest records in memory until a 32 KiB block fills, so a session killed by SIGKILL loses the
steps it was given last, some of them at or before the checkpoint resumed from. The resumed
session first logs those again from metrics.jsonl (which keeps every step up to the checkpoint),
then goes on from the checkpoint: every step once.

A tracker that fails (a full disk, the network) warns once, until it works again, and training goes
on without it, as for metrics.jsonl; one that cannot start warns and the run trains without it
(only rank 0 logs: an error there would leave the other ranks waiting).
"""

from __future__ import annotations

import importlib
import json
import math
import netrc
import os
import secrets
import string
import struct
import zlib
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from bytemtp.config import Config
from bytemtp.config_io import to_dict, to_json

TENSORBOARD_DIR = "tensorboard"  # RUN/tensorboard/: TensorBoard's event files
WANDB_DIR = "wandb"  # RUN/wandb/: W&B's run folders (offline-run-*, run-*)
WANDB_RUN = "wandb-run.json"  # the W&B run's id
WANDB_BLOCK = 32768  # the block of W&B's transaction log (run-ID.wandb), LevelDB's log format
FILES = (TENSORBOARD_DIR, WANDB_DIR, WANDB_RUN)  # what the trackers leave in a run directory

# the modules each tracker imports; the first is the package (and extra) a user installs
_MODULES = {"tensorboard": ("tensorboard", "torch.utils.tensorboard"), "wandb": ("wandb",)}


class Tracker(Protocol):
    def log(self, record: dict) -> None:
        """One metrics record (a step's or a validation's), as metrics.jsonl holds it."""

    def close(self) -> None:
        """Flush and finish; the run has ended (or failed)."""


def require(targets) -> None:
    """Import the packages that the trackers in `targets` (train.log_to's names) need; ValueError,
    naming the extra to install, when one is missing or does not import."""
    for name in targets:
        for module in _MODULES.get(name, ()):
            try:
                importlib.import_module(module)
            except ImportError as e:
                package = _MODULES[name][0]
                why = "" if getattr(e, "name", None) == package else f" (importing {module} failed: {e})"
                raise ValueError(f"train.log_to={name} needs the {package} package: "
                                 f"pip install 'bytemtp[{name}]'{why}") from None


def scalars(record: dict, prefix: str = "") -> dict[str, float | int]:
    """A record's numbers by name: a number under its key, a list's N-th value as KEY/hN, a dict's
    under KEY/...; None, booleans, non-finite values and the step itself left out."""
    out = {}
    for key, value in record.items():
        name = prefix + key
        if isinstance(value, dict):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, (list, tuple)):
            out.update({f"{name}/h{i + 1}": v for i, v in enumerate(value) if _number(v)})
        elif _number(value) and name != "step":
            out[name] = value
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TensorBoardTracker:
    """Scalars in RUN/tensorboard/; opened at the session's first step `step` (0 for a new run),
    so that earlier sessions' events after it are discarded."""

    def __init__(self, run_dir: Path, cfg: Config, *, step: int):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.path = run_dir / TENSORBOARD_DIR
        self.writer = SummaryWriter(str(self.path), purge_step=step + 1)
        # markdown: a code block is a 4-space indent
        self.writer.add_text("config", "".join(f"    {line}\n" for line in to_json(cfg).splitlines()), step)
        settings = {key: value if isinstance(value, (int, float, str)) else json.dumps(value)
                    for key, value in _flat(to_dict(cfg)).items()}
        for summary in hparams(settings, {"loss": 0.0, "val_bpb/h1": 0.0}):  # only the metrics' names count
            self.writer.file_writer.add_summary(summary, step)
        self.writer.flush()
        self.last_step: dict[str, int] = {}  # a tag's last step: `bytes` comes with a step and with its validation

    def log(self, record: dict) -> None:
        step = record["step"]
        for tag, value in scalars(record).items():
            if self.last_step.get(tag, -1) < step:
                self.writer.add_scalar(tag, value, step)
                self.last_step[tag] = step
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _flat(settings: dict, prefix: str = "") -> dict:
    """{"train.lr": 0.001, ...}: a config dict's settings by their dotted names."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def wandb_mode() -> str | None:
    """The mode of the W&B run: None (W&B decides: WANDB_MODE, else online) when WANDB_MODE is
    set or an API key is there (WANDB_API_KEY, or ~/.netrc, or $NETRC, for W&B's host); else offline."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        has_key = netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        has_key = False
    return None if has_key else "offline"


class WandbTracker:
    """A W&B run for the run directory, continued by every session of the run (`resumed`)."""

    def __init__(self, run_dir: Path, cfg: Config, *, resumed: bool, say, logged: list[dict] = ()):
        """`logged`: the records of the steps up to the checkpoint a resumed session starts from
        (metrics.jsonl's), of which it logs those that the earlier sessions' W&B logs lack."""
        import wandb

        self.path = run_dir / WANDB_RUN
        saved = json.loads(self.path.read_text()) if resumed and self.path.is_file() else {}
        alphabet = string.ascii_lowercase + string.digits
        self.id = saved.get("id") or "".join(secrets.choice(alphabet) for _ in range(8))
        # steps up to `before` are in an earlier session's log (read before this session's starts)
        self.before = wandb_logged_step(run_dir / WANDB_DIR, self.id) if saved else 0
        self.path.write_text(json.dumps({"id": self.id}) + "\n")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "bytemtp", name=run_dir.resolve().name,
                              id=self.id, resume="allow", dir=str(run_dir), config=to_dict(cfg), mode=wandb_mode(),
                              settings=wandb.Settings(console="off"))
        if self.run.settings.mode in ("offline", "dryrun"):  # dryrun: older W&B's name for it
            say(f"W&B run {self.id} is offline in {run_dir / WANDB_DIR}; upload it with: "
                f"wandb sync {run_dir / WANDB_DIR}/offline-run-*")
        for record in logged:
            self.log(record)

    def log(self, record: dict) -> None:
        if record["step"] > self.before:
            self.run.log(scalars(record), step=record["step"])  # a second record at the same step joins its row

    def close(self) -> None:
        self.run.finish()


def wandb_logged_step(wandb_dir: Path, run_id: str) -> int:
    """The last step that the logs of W&B run `run_id` under `wandb_dir` hold (each session's
    `*-ID/run-ID.wandb`, offline or online; 0 when none holds one)."""
    from wandb.proto import wandb_internal_pb2 as pb

    step = 0
    for path in wandb_dir.glob(f"*-{run_id}/run-{run_id}.wandb"):
        for data in wandb_log_records(path.read_bytes()):
            record = pb.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                step = max(step, record.history.step.num)
    return step


def wandb_log_records(data: bytes):
    """The records (serialised) of a W&B transaction log, in order: a 7-byte header (":W&B", a
    magic number, a version), then blocks of WANDB_BLOCK bytes holding chunks, each a 7-byte header
    (the CRC-32 of its type byte and data, its length, its type: 1 a whole record, 2 its first
    chunk, 3 a middle one, 4 its last) and its data; a block's tail too short for a header is
    zeros. The log ends where a chunk is cut short or fails its check (a killed writer's tail)."""
    if data[:4] != b":W&B":
        return
    pos, record = 7, b""
    while pos + 7 <= len(data):
        room = WANDB_BLOCK - pos % WANDB_BLOCK
        crc, length, kind = struct.unpack_from("<IHB", data, pos) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the block's padding
            pos += room
            continue
        chunk = data[pos + 7:pos + 7 + length]
        if kind > 4 or len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            return
        record = chunk if kind in (1, 2) else record + chunk
        pos += 7 + length
        if kind in (1, 4):
            yield record


class Trackers:
    """The trackers of a run by name, fed every record; one that fails warns (once, until it works
    again) and the others, and training, go on."""

    def __init__(self, trackers: dict[str, Tracker] | None = None, *, say=lambda *_: None):
        self.trackers, self.say, self.failing = dict(trackers or {}), say, set()

    def log(self, record: dict) -> None:
        for name, tracker in self.trackers.items():
            self._guard(name, "log to", lambda: tracker.log(record))

    def close(self) -> None:
        for name, tracker in self.trackers.items():
            self._guard(name, "close", tracker.close)

    def _guard(self, name: str, what: str, work) -> None:
        try:
            work()
        except Exception as e:  # a tracker's own errors (I/O, network, its package's) never stop training
            if name not in self.failing:
                self.say(f"warning: cannot {what} {name} (train.log_to): {e}; training goes on")
            self.failing.add(name)
        else:
            self.failing.discard(name)


def open_trackers(cfg: Config, run_dir: Path, *, step: int, resumed: bool, say, logged: list[dict] = ()) -> Trackers:
    """The trackers that cfg.train.log_to names besides jsonl, for a session that starts at `step`
    (from a checkpoint when `resumed`, `logged` the records metrics.jsonl holds up to it); one that
    cannot start warns and is left out."""
    opened = {}
    for name in cfg.train.log_targets:
        try:
            if name == "tensorboard":
                opened[name] = TensorBoardTracker(run_dir, cfg, step=step)
            elif name == "wandb":
                opened[name] = WandbTracker(run_dir, cfg, resumed=resumed, say=say, logged=logged)
        except Exception as e:  # as in Trackers: a tracker never stops training
            say(f"warning: cannot start {name} (train.log_to): {e}; training goes on without it")
    return Trackers(opened, say=say)
