"""Preparing a corpus: the policy (dedup, split, bad records) that turns any corpus spec into a
prepared one, written in the format of `bytemtp.data.shards` (which owns the format, and its reader).

`prepare` drops exact duplicates and splits documents one of three ways, recorded in the manifest's
`split`. By default by a hash of their bytes, so the split is stable across runs and file orders and
identical documents can never straddle train and val. Given val inputs, those go to val whole and
every other input to train (val inputs are read first, so a train document equal to a val one is
the duplicate dropped). Given a val tail F, the last F of each document's bytes go to val as a
document of their own and the rest to train: the one split that can cut a one-document corpus (a
novel, say) in two, at the cost of a boundary inside the text. Frames are compressed in parallel but
written in order, so the output is the same for every thread count. Duplicate detection keeps one
digest per unique document in memory (about 100 bytes each).

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
from bytemtp.data.corpus import corpus_files, spec_items
from bytemtp.data.intake import Part, read_inputs
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


def split_record(*, val_fraction: float | None = None, val=None, val_tail: float | None = None) -> dict:
    """How `prepare` splits, as the manifest records it: {"method": "hash", "val_fraction"},
    {"method": "inputs", "val_inputs"} or {"method": "tail", "val_tail"}; at most one of the three
    may be given (none: the hash split at 0.01)."""
    given = [name for name, value in (("--val-fraction", val_fraction), ("--val", val), ("--val-tail", val_tail))
             if value is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} choose the val split in different ways; give one of them")
    if val is not None:
        return {"method": "inputs", "val_inputs": [os.fspath(item) for item in spec_items(val)]}
    if val_tail is not None:
        if not (isinstance(val_tail, (int, float)) and 0.0 < val_tail < 1.0):
            raise ValueError(f"--val-tail {val_tail!r} is not allowed; expected a fraction of each document's "
                             f"bytes strictly between 0 and 1, e.g. 0.1")
        return {"method": "tail", "val_tail": val_tail}
    val_fraction = 0.01 if val_fraction is None else val_fraction
    if not (isinstance(val_fraction, (int, float)) and 0.0 <= val_fraction <= 1.0):
        raise ValueError(f"val_fraction={val_fraction!r} is not allowed; expected a number in [0, 1]")
    return {"method": "hash", "val_fraction": val_fraction}


def val_files(val, *, inputs=()) -> list[pathlib.Path]:
    """The files of the val inputs `val` (a corpus spec), none of which may be among `inputs` (the
    files of the other inputs)."""
    try:
        found = corpus_files(val, split=None)
    except CorpusError as e:
        raise CorpusError(f"--val: {e}") from None
    taken = {os.path.realpath(f): f for f in inputs}
    for path in found:
        if (twin := taken.get(os.path.realpath(path))) is not None:
            raise CorpusError(f"{twin} is both an input and a --val input; give it once (a folder given as "
                              f"input keeps it for train unless you --exclude it)")
    return found


def prepare(sources: list, out_dir, *, field: str = "text", val_fraction: float | None = None, val=None,
            val_tail: float | None = None, level: int = 10, source_name: str | None = None,
            licence: str = "unknown", progress: Callable[[int, int], None] | None = None,
            max_bad_fraction: float = 0.01, frame_bytes: int = 1 << 20, threads: int = -1, readers: int = 0,
            part: Part | None = None, say: Callable[[str], None] | None = None) -> dict:
    """Build a prepared corpus in out_dir (train/ and val/ shards plus manifest.json); return the manifest.

    The split, one of (see the module doc): by hash (the default; val_fraction, None for 0.01), where
    a document goes to val when the first 8 bytes of its sha256, read as a fraction of 2**64, are
    below val_fraction; `val`, a corpus spec like `sources` whose files go to val whole (none of
    them may be among the sources' files); or `val_tail` F in (0, 1), where a document of n bytes
    gives its first int(n * (1 - F)) bytes to train and the rest to val (an empty piece is not
    written; an empty document goes to train). `progress(bytes_read, docs)` gets running totals
    every 1024 documents and after each file: the on-disk bytes of the files read (within a file,
    the document bytes read from it, capped at its size) and the documents read, duplicates
    included. `readers` processes read and parse the inputs (0: this one; `bytemtp.data.intake`),
    and `threads` compress (-1: one per core, 0: this thread); `intake.plan` chooses both for a
    number of workers. The corpus is the same, byte for byte, for every number of either. `part`
    keeps one part of the documents (`intake.Part`: a function of each document's bytes) and
    records it in the manifest for `bytemtp.data.merge`. `say` gets notes for the user, one line
    each: an empty val split and how to get one, temporary folders kept. The corpus is built in a
    hidden sibling directory and renamed into place (see the module doc).
    """
    if not (isinstance(max_bad_fraction, (int, float)) and 0.0 <= max_bad_fraction <= 1.0):
        raise ValueError(f"max_bad_fraction={max_bad_fraction!r} is not allowed; expected a number in [0, 1]")
    split = split_record(val_fraction=val_fraction, val=val, val_tail=val_tail)
    files = corpus_files(sources, split=None)
    val_paths = val_files(val, inputs=files) if val is not None else []
    files = [*val_paths, *files]  # val first: a train copy of a val document is the duplicate dropped
    out = pathlib.Path(out_dir)
    manifest = build_atomically(out, lambda tmp: _build(
        files, tmp, val_paths=val_paths, sources=sources, field=field, split=split, level=level,
        source_name=source_name, licence=licence, progress=progress, max_bad_fraction=max_bad_fraction,
        frame_bytes=frame_bytes, threads=threads, readers=readers, part=part), say=say)
    if say is not None and part is None and (note := empty_val_note(out, manifest)):
        say(note)
    return manifest


def build_atomically(out: pathlib.Path, build: Callable[[pathlib.Path], dict], *,
                     say: Callable[[str], None] | None = None) -> dict:
    """Run `build(tmp)` to write a corpus into a new hidden sibling of `out`, then rename it into
    place; return what build returns. On any error, Ctrl-C, SIGTERM or SIGHUP the folder goes (the
    module doc); `out` must not exist or be an empty folder."""
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
                result = build(tmp)
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
    return result


def empty_val_note(out: pathlib.Path, manifest: dict) -> str | None:
    """The warning for a hash split whose val split came out empty, with the fix, or None."""
    split = manifest["split"]
    if manifest["splits"]["val"]["documents"] or split["method"] != "hash":
        return None
    total, val_fraction = manifest["splits"]["train"]["documents"], split["val_fraction"]
    wanted = min(0.5, 10 / total)
    return (f"warning: the val split of {out} is empty: a val fraction of {val_fraction:g} of {total:,} documents "
            f"expects {val_fraction * total:.2g} there; prepare again with a larger `bytemtp prep --val-fraction` "
            f"(e.g. {wanted:.2g}) or more documents, or evaluate the train split (`bytemtp eval --split train`)")


def inputs_digest(files: list[pathlib.Path]) -> str:
    """A digest of the input files' names and sizes in order: the parts of one job share it (and
    the digest of each file's documents, `intake.Batch.content`, which a part records beside it)."""
    sha = hashlib.sha256()
    for path in files:
        sha.update(f"{path.name}\0{path.stat().st_size}\n".encode())
    return sha.hexdigest()[:16]


def _pieces(doc: bytes, digest: bytes, *, split: dict, val_input: bool) -> list[tuple[str, bytes]]:
    """(split name, bytes) for each piece a unique document gives under a split record."""
    if split["method"] == "inputs":
        return [("val" if val_input else "train", doc)]
    if split["method"] == "tail":
        cut = int(len(doc) * (1 - split["val_tail"]))  # nanoGPT's data[:int(n * 0.9)] at val_tail 0.1
        head, tail = doc[:cut], doc[cut:]
        return [("train", head)] * (bool(head) or not tail) + [("val", tail)] * bool(tail)
    is_val = int.from_bytes(digest[:8], "big") / 2**64 < split["val_fraction"]
    return [("val" if is_val else "train", doc)]


def empty_split_error(split: dict, *, train: int, val: int, reasons: str) -> str | None:
    """Why a split that holds no document cannot be, or None when both are allowed as they are."""
    if split["method"] == "inputs" and val == 0:
        return (f"the val inputs {', '.join(split['val_inputs'])} hold no document (bad records skipped in all "
                f"inputs: {reasons}); check them")
    if train > 0:
        return None
    if split["method"] == "inputs":
        return (f"no document went to train: every input is a val input or a copy of one ({val} documents "
                f"in val); give inputs besides the val ones")
    if split["method"] == "tail":
        return (f"no byte went to train: at val_tail={split['val_tail']} every document is too short to keep "
                f"one ({val} pieces in val); lower the tail")
    return (f"all {val} documents went to val (val_fraction={split['val_fraction']}), none to train; lower the "
            f"validation fraction")


def _build(files: list[pathlib.Path], tmp: pathlib.Path, *, val_paths: list[pathlib.Path], sources, field: str,
           split: dict, level: int, source_name: str | None, licence: str, progress, max_bad_fraction: float,
           frame_bytes: int, threads: int, readers: int, part: Part | None) -> dict:
    """Write the shards and the manifest of a prepared corpus into tmp; return the manifest."""
    skipped, seen, duplicates, read, done, contents = {}, set(), 0, 0, 0, {}
    kw = dict(level=level, frame_bytes=frame_bytes, threads=threads)
    val_inputs, sizes = set(val_paths), [path.stat().st_size for path in files]
    with ShardWriter(tmp / "train", **kw) as train, ShardWriter(tmp / "val", **kw) as val:
        writers = {"train": train, "val": val}
        for batch in read_inputs(files, field=field, processes=readers, part=part):
            path = files[batch.file]
            for doc, digest in zip(batch.docs, batch.digests):
                if digest in seen:
                    duplicates += 1
                    continue
                seen.add(digest)
                pieces = _pieces(doc, digest, split=split, val_input=path in val_inputs)
                for name, piece in pieces:
                    writers[name].write(piece, digest if len(pieces) == 1 else None)
            read += batch.read
            if batch.end:
                done += sizes[batch.file]
                contents[os.fspath(path)] = batch.content
                for reason, n in batch.skipped.items():
                    skipped[reason] = skipped.get(reason, 0) + n
            if progress is not None:
                progress(done if batch.end else done + min(batch.in_file, sizes[batch.file]), read)
    bad = sum(skipped.values())
    records = read + bad
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "none"
    if bad > max_bad_fraction * records:
        raise CorpusError(f"{bad} of {records} records are bad ({reasons}), more than max_bad_fraction="
                          f"{max_bad_fraction}; fix the input or allow a larger fraction")
    if part is None and train.documents + val.documents == 0:  # a part may hold none: the merge checks
        raise CorpusError(f"no documents in {', '.join(map(str, files))} after skipping {bad} bad records "
                          f"({reasons}) and {duplicates} duplicates; check the sources and --field")
    if part is None and (error := empty_split_error(split, train=train.documents, val=val.documents,
                                                      reasons=reasons)):
        raise CorpusError(error)
    manifest = {
        "format_version": FORMAT_VERSION,
        "bytemtp_version": bytemtp.__version__,
        "source": source_name or ", ".join(os.fspath(s) for s in spec_items(sources)),
        "licence": licence,
        "source_field": field,  # the JSONL field read from the sources
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "frame_bytes": frame_bytes,
        "level": level,
        "split": split | ({"val_files": len(val_paths)} if split["method"] == "inputs" else {}),
        "splits": {"train": train.summary(), "val": val.summary()},
        "skipped": {reason: skipped.get(reason, 0) for reason in SKIP_REASONS},
        "duplicates": duplicates,
        "input_files": len(files),
        "records": records,  # every record read, bad ones included (a part's are those of all its inputs)
    }
    if part is not None:  # what the merge checks: the same files (names and sizes) with the same documents
        manifest["part"] = {"index": part.index, "of": part.of, "inputs": inputs_digest(files), "contents": contents}
    write_manifest(tmp, manifest)
    return manifest
