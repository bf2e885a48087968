"""Preparing a corpus: the policy (dedup, split, bad records) that turns any corpus spec into a
prepared one, written in the format of `bytemtp.data.shards` (which owns the format, and its reader).

`prepare` drops exact duplicates and splits documents by a hash of their bytes, so the split is stable
across runs and file orders and identical documents can never straddle train and val. Frames are
compressed in parallel but written in order, so the output is the same for every thread count.
Duplicate detection keeps one digest per unique document in memory (about 100 bytes each).

No half corpus, no litter. The corpus is built in a hidden sibling folder `.NAME.tmp-PID`, fsynced
and renamed into place, so the output never holds half a corpus. The folder goes on any error, on
KeyboardInterrupt, and on SIGTERM or SIGHUP: while prep runs in the main thread it turns them into
an exception that unwinds it (the previous handlers come back when it ends, and then get the
signal, so a default SIGTERM still ends the process). SIGKILL and a power cut cannot be caught; the
folder they leave is removed by the next prep of the same output, once the process whose id it
bears is gone from this host. A folder whose process still runs, or that was made on another host
(a `.prep-host` file inside names the host), is kept and named.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pathlib
import shutil
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import bytemtp
from bytemtp.data.corpus import corpus_files, iter_documents, spec_items
from bytemtp.data.readers import SKIP_REASONS
from bytemtp.data.shards import FORMAT_VERSION, CorpusError, ShardWriter, fsync_dir, write_manifest

HOST_FILE = ".prep-host"  # inside a temporary folder: the host whose process made it
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Stopped(BaseException):
    """A signal arrived while prep ran: unwinds it like KeyboardInterrupt, so its cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_unwind() -> Iterator[None]:
    """While the block runs in the main thread, SIGTERM and SIGHUP raise _Stopped (once: a second
    one waits for the cleanup); the previous handlers are restored when it ends. Signals that are
    ignored, or handled outside Python, are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if not raised:
            raised.append(signum)
            raise _Stopped(signum)

    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    mine = [s for s, h in previous.items() if h is signal.SIG_DFL or callable(h)]
    for s in mine:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, previous[s])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _made_on(tmp: pathlib.Path, host: str) -> str | None:
    """The host a temporary folder was made on: its HOST_FILE, this host if it has none (an older
    prep wrote none), or None if the file cannot be read."""
    try:
        return (tmp / HOST_FILE).read_text().strip()
    except FileNotFoundError:
        return host
    except OSError:
        return None


def _remove_stale_temporaries(out: pathlib.Path, *, say: Callable[[str], None] | None = None) -> None:
    """Remove the temporary folders `.NAME.tmp-PID` of earlier preps of `out` whose process is gone
    (no such pid on this host); name in one line, through `say`, those it keeps because it cannot
    judge them (the pid runs, the folder was made on another host, or the name has no pid)."""
    host, kept = socket.gethostname(), []
    for tmp in sorted(out.parent.glob(f".{out.name}.tmp-*")):
        pid, made_on = tmp.name.rpartition("-")[2], _made_on(tmp, host)
        if not tmp.is_dir() or not pid.isdigit():
            kept.append(f"{tmp.name} (not a prep's folder)")
        elif made_on != host:
            kept.append(f"{tmp.name} (made on host {made_on or 'unknown: its ' + HOST_FILE + ' is unreadable'})")
        elif int(pid) != os.getpid() and _pid_alive(int(pid)):
            kept.append(f"{tmp.name} (process {pid} is running)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if kept and say is not None:
        say(f"note: kept {len(kept)} temporary folder(s) beside {out} that another prep may be using: "
            f"{', '.join(kept)}; remove them by hand once no prep of {out.name} runs")


def prepare(sources: list, out_dir, *, field: str = "text", val_fraction: float = 0.01, level: int = 10,
            source_name: str | None = None, licence: str = "unknown",
            progress: Callable[[int, int], None] | None = None, max_bad_fraction: float = 0.01,
            frame_bytes: int = 1 << 20, threads: int = -1, say: Callable[[str], None] | None = None) -> dict:
    """Build a prepared corpus in out_dir (train/ and val/ shards plus manifest.json); return the manifest.

    A document goes to val when the first 8 bytes of its sha256, read as a fraction of 2**64, are
    below val_fraction. `progress(bytes_read, docs)` gets running totals every 1024 documents and
    after each file: the on-disk bytes of the files read (within a file, the document bytes read
    from it, capped at its size) and the documents read, duplicates included. `say` gets notes for
    the user, one line each: an empty val split and how to get one, temporary folders kept. The
    corpus is built in a hidden sibling directory and renamed into place (see the module doc).
    """
    for name, value in (("val_fraction", val_fraction), ("max_bad_fraction", max_bad_fraction)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name}={value!r} is not allowed; expected a number in [0, 1]")
    files = corpus_files(sources, split=None)
    out = pathlib.Path(out_dir)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise CorpusError(f"{out} already exists and is not empty; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out, say=say)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with _signals_unwind():
            try:
                tmp.mkdir()
                (tmp / HOST_FILE).write_text(socket.gethostname() + "\n")
                manifest = _build(files, tmp, sources=sources, field=field, val_fraction=val_fraction,
                                  level=level, source_name=source_name, licence=licence, progress=progress,
                                  max_bad_fraction=max_bad_fraction, frame_bytes=frame_bytes, threads=threads)
                (tmp / HOST_FILE).unlink()
                if out.exists():
                    out.rmdir()
                os.replace(tmp, out)
                fsync_dir(out.parent)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except _Stopped as stop:
        # the previous handler is back: it gets the signal (by default SIGTERM ends the process here)
        signal.raise_signal(stop.signum)
        raise CorpusError(f"prep of {out} stopped by signal {signal.Signals(stop.signum).name}; its temporary "
                          f"folder is removed") from None
    val = manifest["splits"]["val"]["documents"]
    if val == 0 and say is not None:
        total = manifest["splits"]["train"]["documents"]
        wanted = min(0.5, 10 / total)
        say(f"warning: the val split of {out} is empty: a val fraction of {val_fraction:g} of {total:,} documents "
            f"expects {val_fraction * total:.2g} there; prepare again with a larger `bytemtp prep --val-fraction` "
            f"(e.g. {wanted:.2g}) or more documents, or evaluate the train split (`bytemtp eval --split train`)")
    return manifest


def _build(files: list[pathlib.Path], tmp: pathlib.Path, *, sources, field: str, val_fraction: float, level: int,
           source_name: str | None, licence: str, progress, max_bad_fraction: float, frame_bytes: int,
           threads: int) -> dict:
    """Write the shards and the manifest of a prepared corpus into tmp; return the manifest."""
    skipped, seen, duplicates, read, done = {}, set(), 0, 0, 0
    kw = dict(level=level, frame_bytes=frame_bytes, threads=threads)
    with ShardWriter(tmp / "train", **kw) as train, ShardWriter(tmp / "val", **kw) as val:
        for path in files:
            size, in_file = path.stat().st_size, 0
            for doc in iter_documents(path, field=field, counts=skipped):
                read, in_file = read + 1, in_file + len(doc)
                if progress is not None and read % 1024 == 0:
                    progress(done + min(in_file, size), read)
                digest = hashlib.sha256(doc).digest()
                if digest in seen:
                    duplicates += 1
                    continue
                seen.add(digest)
                is_val = int.from_bytes(digest[:8], "big") / 2**64 < val_fraction
                (val if is_val else train).write(doc)
            done += size
            if progress is not None:
                progress(done, read)
    bad = sum(skipped.values())
    records = read + bad
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "none"
    if bad > max_bad_fraction * records:
        raise CorpusError(f"{bad} of {records} records are bad ({reasons}), more than max_bad_fraction="
                          f"{max_bad_fraction}; fix the input or allow a larger fraction")
    if train.documents + val.documents == 0:
        raise CorpusError(f"no documents in {', '.join(map(str, files))} after skipping {bad} bad records "
                          f"({reasons}) and {duplicates} duplicates; check the sources and --field")
    if train.documents == 0:
        raise CorpusError(f"all {val.documents} documents went to val (val_fraction={val_fraction}), none to "
                          f"train; lower the validation fraction")
    manifest = {
        "format_version": FORMAT_VERSION,
        "bytemtp_version": bytemtp.__version__,
        "source": source_name or ", ".join(os.fspath(s) for s in spec_items(sources)),
        "licence": licence,
        "source_field": field,  # the JSONL field read from the sources
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "frame_bytes": frame_bytes,
        "level": level,
        "splits": {"train": train.summary(), "val": val.summary()},
        "skipped": {reason: skipped.get(reason, 0) for reason in SKIP_REASONS},
        "duplicates": duplicates,
        "input_files": len(files),
    }
    write_manifest(tmp, manifest)
    return manifest
