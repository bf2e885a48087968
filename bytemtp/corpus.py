"""Corpora: finding, reading and writing the files a corpus is made of.

Reading. `corpus_files` turns a spec (paths, directories, globs, prepared corpora, lists of them) into
a sorted list of files. `*.jsonl`, `*.jsonl.zst` and `*.jsonl.gz` files hold one JSON object a line,
the document in a text field; any other file is one raw document. The suffix decides the compression
(`.zst`, `.gz`, else none). Bad JSONL lines are skipped and counted by reason, never dropped silently.

Strict zstd. python-zstandard's streaming readers return what they have when a file ends mid-frame,
so zstd files are decoded here frame by frame with `decompressobj`, whose `eof` marks a frame's end
and `unused_data` the next frame's start. A file that ends inside a frame is truncated; a zstd error
(bad magic, corrupt block, checksum mismatch, trailing garbage) is corruption; both raise
`CorpusError` with the file and the frame's byte offset. Frames are streamed, not buffered, since
external files are often one multi-gigabyte frame: a frame's lines are yielded as they decode and a
checksum mismatch surfaces at the frame's end, after them (the run still stops). Prepared shards use
frames of about 1 MiB, so at most that much precedes the error.

Resume positions (`Pos`): (compressed offset of a zstd frame start, decompressed bytes to skip from
there), or (0, byte offset) in plain and gzip files. Resuming costs at most one frame of decompression
in a prepared shard, but the whole prefix in a single-frame external file or any gzip file.

Writing. `prepare` drops exact duplicates and splits documents by a hash of their bytes, so the split
is stable across runs and file orders and identical documents can never straddle train and val.
Documents go to JSONL shards of independent ~1 MiB zstd frames: a few percent worse compression than
one long frame, for resumable reading and parallel compression with byte-identical output. JSON
strings carry only valid UTF-8, so raw files that are not are skipped and counted (stream such files
directly to train on arbitrary bytes). Duplicate detection keeps one digest per unique document in
memory (about 100 bytes each). `manifest.json` holds counts and the sha256 of each split's
decompressed shards, which `verify` recomputes.
"""
from __future__ import annotations

import collections
import datetime
import fnmatch
import glob
import gzip
import hashlib
import json
import os
import pathlib
import queue
import shutil
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import simdjson
import zstandard

import bytemtp

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SKIP_REASONS = ("empty_line", "invalid_utf8", "invalid_json", "not_object", "missing_field", "not_string")
CHUNK = 1 << 20  # bytes read from a file at a time
_REDO = "re-download or re-create the file"
_REPREP = "rebuild the corpus with bytemtp prep"

Pos = tuple[int, int]


class CorpusError(ValueError):
    """A corpus cannot be read or written; the one-line message names the file, the offset and the fix."""


# --- finding files --------------------------------------------------------------------------------


def _walk(directory: pathlib.Path) -> list[pathlib.Path]:
    """Every regular, non-hidden file below directory, sorted by relative path."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [pathlib.Path(root, f) for f in files if not f.startswith(".")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.relative_to(directory).parts)


def _expand(path: pathlib.Path, split: str | None) -> list[pathlib.Path]:
    corpus = _corpus_dir(path)
    if not (corpus / MANIFEST).is_file():
        return [path] if path.is_file() else _walk(path)
    known = list(read_manifest(corpus)["splits"])
    splits = known if split is None else [split]
    for name in splits:
        if not (corpus / name).is_dir():
            raise CorpusError(f"prepared corpus {corpus} has no split {name!r} (no directory {corpus / name}); "
                              f"choose one of {', '.join(known)}")
    return [f for name in splits for f in _walk(corpus / name)]


def _spec_items(spec) -> list:
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items:
        raise CorpusError("no corpus given; name a file, directory, glob or prepared corpus")
    return items


def corpus_files(spec, *, split: str | None = "train") -> list[pathlib.Path]:
    """The files a corpus spec names, de-duplicated, in a deterministic order.

    Each item of `spec` (a path, or a list of them) is one of: a prepared corpus directory or its
    manifest (the files of its `split`, or of every split if split is None), another directory
    (every non-hidden file below it), a glob pattern (its sorted matches, directories expanded),
    or a file.
    """
    result, seen = [], set()
    for item in _spec_items(spec):
        text = os.fspath(item)
        if os.path.exists(text):
            paths = _expand(pathlib.Path(text), split)
        elif any(c in text for c in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise CorpusError(f"no file matches the pattern {text}; check the path")
            paths = [f for m in matches for f in _expand(pathlib.Path(m), split)]
        else:
            raise CorpusError(f"{text} does not exist; check the path")
        for path in paths:
            if (key := os.path.realpath(path)) not in seen:
                seen.add(key)
                result.append(path)
    if not result:
        raise CorpusError(f"no files found in {', '.join(os.fspath(i) for i in _spec_items(spec))}; "
                          f"point at a directory or pattern that holds corpus files")
    return result


def select_files(files: list[pathlib.Path], *, include=(), exclude=()) -> list[pathlib.Path]:
    """The files that match an include pattern (all if none is given) and no exclude pattern.

    A glob pattern matches a file when it matches its path or any trailing part of it, so `*.py`
    matches by name and `site-packages/*` everything below a directory of that name.
    """
    def matches(path: pathlib.Path, patterns) -> bool:
        parts = pathlib.Path(path).parts
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), p) for p in patterns for i in range(len(parts)))

    kept = [f for f in files if (not include or matches(f, include)) and not matches(f, exclude)]
    if not kept:
        raise CorpusError(f"no file is left of {len(files)} after include {list(include)} and exclude "
                          f"{list(exclude)}; loosen the patterns")
    return kept


def file_kind(path) -> str:
    """'jsonl' for *.jsonl, *.jsonl.zst, *.jsonl.gz; 'raw' (one document per file) for anything else."""
    return "jsonl" if pathlib.Path(path).name.lower().endswith((".jsonl", ".jsonl.zst", ".jsonl.gz")) else "raw"


# --- decompression --------------------------------------------------------------------------------
#
# A piece generator yields (a, b, data) where data starts at Pos (a, b): for zstd, the frame's start
# offset and the offset into that frame's output; for plain and gzip files, (0, offset). Its last
# item is (a, b, None), the Pos of the end of the file.


def _open(path: pathlib.Path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}; check the path") from None


def _moved(path: pathlib.Path, start: Pos) -> CorpusError:
    return CorpusError(f"resume position {start} does not fit {path}; the file changed since it was saved")


def _zstd_pieces(f, path: pathlib.Path, offset: int):
    size = os.fstat(f.fileno()).st_size
    if offset > size:
        raise _moved(path, (offset, 0))
    f.seek(offset)
    dctx = zstandard.ZstdDecompressor()
    buf, used, buf_start = b"", 0, offset  # bytes read, how many were fed, file offset of buf[0]
    dobj, frame_start, produced, step = None, offset, 0, 1 << 16
    while True:
        if used == len(buf):
            buf_start, buf, used = buf_start + len(buf), f.read(CHUNK), 0
            if not buf:
                break
        if dobj is None:
            dobj, frame_start, produced = dctx.decompressobj(), buf_start + used, 0
        # At a frame's end `unused_data` copies the rest of what was fed, so feed about twice the
        # last frame's size, not the whole buffer: many tiny frames then stay linear in time.
        fed = memoryview(buf)[used:used + step]
        try:
            out = dobj.decompress(fed)
        except zstandard.ZstdError as e:
            raise CorpusError(f"{path} is corrupt: the zstd frame at byte {frame_start} fails to decode "
                              f"({e}); {_REDO}") from None
        used += len(fed) - (len(dobj.unused_data) if dobj.eof else 0)
        if dobj.eof:
            step, dobj = min(CHUNK, max(1 << 16, 2 * (buf_start + used - frame_start))), None
        if out:
            yield frame_start, produced, out
            produced += len(out)
    if dobj is not None:
        raise CorpusError(f"{path} is truncated: the zstd frame at byte {frame_start} is cut off by the "
                          f"end of the file at {size} bytes; {_REDO}")
    yield size, 0, None


def _gzip_pieces(f, path: pathlib.Path):
    pos = 0
    with gzip.GzipFile(fileobj=f) as gz:  # closing it leaves f open
        while True:
            try:
                data = gz.read(CHUNK)
            except (EOFError, OSError, zlib.error) as e:
                raise CorpusError(f"{path} is {'truncated' if isinstance(e, EOFError) else 'corrupt'}: gzip "
                                  f"fails after {pos} decompressed bytes ({e}); {_REDO}") from None
            if not data:
                break
            yield 0, pos, data
            pos += len(data)
    yield 0, pos, None


def _plain_pieces(f, path: pathlib.Path, offset: int):
    if offset > os.fstat(f.fileno()).st_size:
        raise _moved(path, (0, offset))
    f.seek(offset)
    while data := f.read(CHUNK):
        yield 0, offset, data
        offset += len(data)
    yield 0, offset, None


def _skip(pieces, skip: int, path: pathlib.Path, start: Pos):
    """Drop the first `skip` bytes of output (a gzip file, or the start of a zstd frame)."""
    for a, b, data in pieces:
        if data is None and skip:
            raise _moved(path, start)
        if data is not None and skip:
            if skip >= len(data):
                skip -= len(data)
                continue
            b, data, skip = b + skip, data[skip:], 0
        yield a, b, data


def _prefetched(pieces: Iterator, depth: int = 4) -> Iterator:
    """Run a decompressing generator in a thread, `depth` pieces ahead of the consumer.

    zstd and zlib release the GIL while they decompress, so decompression overlaps the caller's
    parsing and packing. Errors surface in the consumer in order; closing the consumer stops the
    thread before the file is closed.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in pieces:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as e:  # handed to the consumer, which raises it
            q.put((None, e))
            return
        q.put((None, None))

    thread = threading.Thread(target=produce, name="bytemtp-decompress", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if error is not None:
                raise error
            if item is None:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)


def _pieces(f, path: pathlib.Path, start: Pos):
    offset, skip = start
    name = path.name.lower()
    zst = name.endswith(".zst")
    if offset < 0 or skip < 0 or (offset and not zst):
        raise _moved(path, start)
    if not zst and not name.endswith(".gz"):
        return _plain_pieces(f, path, skip)
    pieces = _zstd_pieces(f, path, offset) if zst else _gzip_pieces(f, path)
    return _prefetched(_skip(pieces, skip, path, start) if skip else pieces)


def iter_lines(path, *, start: Pos = (0, 0)) -> Iterator[tuple[bytes, Pos]]:
    """Each line of a (compressed) file without its b"\\n", with the Pos where the next line starts.

    For zstd files that Pos is (start offset of the frame holding the next line's first byte,
    decompressed bytes from that frame's start to it); after the last line it is (file size, 0).
    `iter_lines(path, start=pos)` yields exactly the lines after the one `pos` came with.
    Lines may span frames. Interior blank lines are yielded as b""; a final "\\n" adds no line.
    """
    path = pathlib.Path(path)
    with _open(path) as f:
        # A line is yielded only once the next line's first byte arrives: only then is it known
        # which frame that byte lies in.
        line, partial = None, []
        for a, b, data in _pieces(f, path, start):
            if data is None:
                end = (a, b)
                break
            i, n = 0, len(data)
            while i < n:
                if line is not None:
                    yield line, (a, b + i)
                    line = None
                j = data.find(b"\n", i)
                if j < 0:
                    partial.append(data[i:])
                    break
                line = b"".join(partial) + data[i:j] if partial else data[i:j]
                partial, i = [], j + 1
        if line is not None or partial:
            yield line if line is not None else b"".join(partial), end


def read_raw(path) -> bytes:
    """The whole decompressed content of a file (strict multi-frame zstd, gzip, or plain bytes)."""
    path = pathlib.Path(path)
    with _open(path) as f:
        return b"".join(data for _, _, data in _pieces(f, path, (0, 0)) if data is not None)


def decompressed_size(path) -> int:
    """The size of a file's decompressed content, found by streaming it as strictly as read_raw reads."""
    path = pathlib.Path(path)
    with _open(path) as f:
        return sum(len(data) for _, _, data in _pieces(f, path, (0, 0)) if data is not None)


_parsers = threading.local()  # a simdjson parser is not reentrant: one per thread


def parse_record(line: bytes, field: str = "text") -> bytes | str:
    """The document of one JSONL line as UTF-8 bytes, or the reason (one of SKIP_REASONS) to skip it.

    simdjson parses (about 1.5 times as fast as orjson and 3 times as fast as json on text-heavy
    lines). A line it rejects, or an object with a repeated key (simdjson keeps the first, json
    the last), goes through json, the reference, which names the reason or accepts what only json
    accepts (NaN). simdjson admits neither invalid UTF-8 nor lone surrogates.
    """
    if line.endswith(b"\r"):
        line = line[:-1]
    parser = getattr(_parsers, "parser", None)
    if parser is None:
        parser = _parsers.parser = simdjson.Parser()
    try:
        record = parser.parse(line)
    except (ValueError, RuntimeError):  # UnicodeDecodeError is a ValueError; RuntimeError: too deep
        return _parse_slowly(line, field)
    try:  # the proxy must be gone before the parser's next parse
        if type(record) is not simdjson.Object:
            return "not_object"
        doc = record.get(field)
        if len(record) > 1 and len(record) != len(set(record.keys())):
            return _parse_slowly(line, field)
        if type(doc) is str:
            return doc.encode("utf-8")
        return "missing_field" if field not in record else "not_string"
    finally:
        del record


def _parse_slowly(line: bytes, field: str) -> bytes | str:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    try:
        record = json.loads(text.removeprefix("\ufeff"))  # as simdjson, accept a byte order mark
    except (ValueError, RecursionError):
        return "invalid_json" if text.strip() else "empty_line"
    if type(record) is not dict:
        return "not_object"
    if field not in record:
        return "missing_field"
    doc = record[field]
    if type(doc) is not str:
        return "not_string"
    try:
        return doc.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from an escape such as "\ud800"
        return "invalid_utf8"


def iter_documents(path, *, field: str = "text", counts: dict[str, int] | None = None) -> Iterator[bytes]:
    """Every document of one file (a raw file is one, or none if empty); skips add to counts[reason]."""
    if file_kind(path) == "raw":
        if data := read_raw(path):
            yield data
        return
    for line, _ in iter_lines(path):
        doc = parse_record(line, field)
        if type(doc) is bytes:
            yield doc
        elif counts is not None:
            counts[doc] = counts.get(doc, 0) + 1


# --- writing --------------------------------------------------------------------------------------


class ShardWriter:
    """Writes documents as JSONL lines {"text": ...} into shard-00000.jsonl.zst, shard-00001, ... in directory.

    Whole lines are gathered into frames of about frame_bytes of input (a longer line is a frame of
    its own). Each frame is compressed as one independent zstd frame with checksum and content size.
    A new shard starts once shard_bytes of input went into the current one. threads=0 compresses in
    the calling thread, n > 0 in n threads, and -1 in one thread per CPU core. Frames are compressed
    in parallel but written in order, so the output is the same for every thread count. Each shard is
    written as `<name>.tmp`, then fsynced and renamed when complete.
    """

    def __init__(self, directory, *, level: int = 10, frame_bytes: int = 1 << 20,
                 shard_bytes: int = 256 << 20, threads: int = 0):
        for name, value, low, high in (("level", level, 1, zstandard.MAX_COMPRESSION_LEVEL),
                                       ("frame_bytes", frame_bytes, 1, None),
                                       ("shard_bytes", shard_bytes, 1, None), ("threads", threads, -1, None)):
            if not (isinstance(value, int) and low <= value <= (high or value)):
                raise ValueError(f"{name}={value!r} is not allowed; expected an integer in [{low}, {high or 'inf'}]")
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.level, self.frame_bytes, self.shard_bytes = level, frame_bytes, shard_bytes
        workers = (os.cpu_count() or 1) if threads == -1 else threads
        self._pool = ThreadPoolExecutor(workers) if workers else None
        self._max_inflight = 2 * workers
        self._inflight = collections.deque()  # (input bytes, compressed frame or its future)
        self._local = threading.local()  # one compressor per thread: they are not thread-safe
        self._lines, self._buffered = [], 0
        self._file, self._shard_input = None, 0
        self._sha = hashlib.sha256()
        self.shards: list[str] = []
        self.documents = self.bytes = self.compressed_bytes = 0

    def write(self, doc: bytes) -> None:
        try:
            text = doc.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"document {self.documents} is not valid UTF-8 (byte {e.start}) and JSON "
                             f"cannot carry it; skip or repair it before writing") from None
        line = json.dumps({"text": text}, ensure_ascii=False).encode("utf-8") + b"\n"
        if self._buffered and self._buffered + len(line) > self.frame_bytes:
            self._end_frame()
        self._lines.append(line)
        self._buffered += len(line)
        self._sha.update(line)
        self.documents += 1
        self.bytes += len(doc)
        if self._buffered >= self.frame_bytes:
            self._end_frame()

    def _compress(self, frame: bytes) -> bytes:
        if not hasattr(self._local, "cctx"):
            self._local.cctx = zstandard.ZstdCompressor(level=self.level, write_checksum=True,
                                                        write_content_size=True)
        return self._local.cctx.compress(frame)

    def _end_frame(self) -> None:
        frame, self._lines, self._buffered = b"".join(self._lines), [], 0
        pending = self._compress(frame) if self._pool is None else self._pool.submit(self._compress, frame)
        self._inflight.append((len(frame), pending))
        while len(self._inflight) > self._max_inflight:
            self._write_frame()

    def _write_frame(self) -> None:
        n_input, pending = self._inflight.popleft()
        compressed = pending if self._pool is None else pending.result()
        if self._file is None:
            self.shards.append(f"shard-{len(self.shards):05d}.jsonl.zst")
            self._file = open(self.directory / (self.shards[-1] + ".tmp"), "wb")
        self._file.write(compressed)
        self.compressed_bytes += len(compressed)
        self._shard_input += n_input
        if self._shard_input >= self.shard_bytes:
            self._end_shard()

    def _end_shard(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._file.name, self.directory / self.shards[-1])
        self._file, self._shard_input = None, 0

    def summary(self) -> dict:
        """This split's manifest entry; sha256 is of the decompressed content (the JSONL, in shard order)."""
        return {"documents": self.documents, "bytes": self.bytes, "compressed_bytes": self.compressed_bytes,
                "shards": list(self.shards), "sha256": self._sha.hexdigest()}

    def close(self) -> None:
        if self._lines:
            self._end_frame()
        while self._inflight:
            self._write_frame()
        if self._file is not None:
            self._end_shard()
        if self._pool is not None:
            self._pool.shutdown()
        _fsync_dir(self.directory)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._file is not None:  # drop the unfinished shard; finished ones stay
            self._file.close()
            os.remove(self._file.name)


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def prepare(sources: list, out_dir, *, field: str = "text", val_fraction: float = 0.01, level: int = 10,
            source_name: str | None = None, licence: str = "unknown",
            progress: Callable[[int, int], None] | None = None, max_bad_fraction: float = 0.01,
            frame_bytes: int = 1 << 20, threads: int = -1) -> dict:
    """Build a prepared corpus in out_dir (train/ and val/ shards plus manifest.json); return the manifest.

    A document goes to val when the first 8 bytes of its sha256, read as a fraction of 2**64, are
    below val_fraction. `progress(bytes_read, docs)` gets running totals every 1024 documents and
    after each file: the on-disk bytes of the files read (within a file, the document bytes read
    from it, capped at its size) and the documents read, duplicates included. The corpus is built in
    a hidden sibling directory and renamed into place, so out_dir never holds half a corpus.
    """
    for name, value in (("val_fraction", val_fraction), ("max_bad_fraction", max_bad_fraction)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name}={value!r} is not allowed; expected a number in [0, 1]")
    files = corpus_files(sources, split=None)
    out = pathlib.Path(out_dir)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise CorpusError(f"{out} already exists and is not empty; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed run that had this process id
    tmp.mkdir()
    try:
        skipped, seen, duplicates, read, raw_bad, done = {}, set(), 0, 0, 0, 0
        kw = dict(level=level, frame_bytes=frame_bytes, threads=threads)
        with ShardWriter(tmp / "train", **kw) as train, ShardWriter(tmp / "val", **kw) as val:
            for path in files:
                raw, size, in_file = file_kind(path) == "raw", path.stat().st_size, 0
                for doc in iter_documents(path, field=field, counts=skipped):
                    read, in_file = read + 1, in_file + len(doc)
                    if progress is not None and read % 1024 == 0:
                        progress(done + min(in_file, size), read)
                    if raw:
                        try:
                            doc.decode("utf-8")
                        except UnicodeDecodeError:
                            skipped["invalid_utf8"] = skipped.get("invalid_utf8", 0) + 1
                            raw_bad += 1
                            continue
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
        records = read + bad - raw_bad  # a raw file that is not UTF-8 was also read as a document
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "none"
        if bad > max_bad_fraction * records:
            raise CorpusError(f"{bad} of {records} records are bad ({reasons}), more than max_bad_fraction="
                              f"{max_bad_fraction}; fix the input or allow a larger fraction")
        if train.documents + val.documents == 0:
            raise CorpusError(f"no documents in {', '.join(map(str, files))} after skipping {bad} bad records "
                              f"({reasons}) and {duplicates} duplicates; check the sources and --field")
        manifest = {
            "format_version": FORMAT_VERSION,
            "bytemtp_version": bytemtp.__version__,
            "source": source_name or ", ".join(os.fspath(s) for s in _spec_items(sources)),
            "licence": licence,
            "field": "text",  # the field in the shards; source_field is the one read from the sources
            "source_field": field,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "frame_bytes": frame_bytes,
            "level": level,
            "splits": {"train": train.summary(), "val": val.summary()},
            "skipped": {reason: skipped.get(reason, 0) for reason in SKIP_REASONS},
            "duplicates": duplicates,
            "input_files": len(files),
        }
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


# --- prepared corpora: manifest, description, verification ----------------------------------------


def _corpus_dir(path) -> pathlib.Path:
    path = pathlib.Path(path)
    return path.parent if path.name == MANIFEST else path


def read_manifest(corpus_dir) -> dict:
    """The manifest of a prepared corpus, given its directory or its manifest.json."""
    path = _corpus_dir(corpus_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CorpusError(f"{path} does not exist, so {path.parent} is not a prepared corpus; "
                          f"build one with bytemtp prep") from None
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}; check the path") from None
    except ValueError as e:
        raise CorpusError(f"{path} is not valid JSON ({e}); {_REPREP}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise CorpusError(f"{path} is not a bytemtp corpus manifest (it has no splits); {_REPREP}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CorpusError(f"{path} has format_version {manifest.get('format_version')!r} but this bytemtp "
                          f"reads {FORMAT_VERSION}; {_REPREP}")
    return manifest


def describe(path, *, field: str = "text") -> dict:
    """What `bytemtp corpus-info` shows: for a prepared corpus its manifest and per-split figures;
    for any other spec the documents, bytes, file bytes and skipped records found by reading it."""
    ratio = lambda n, c: round(n / c, 3) if c else None  # noqa: E731
    if not isinstance(path, (list, tuple)) and (_corpus_dir(path) / MANIFEST).is_file():
        manifest = read_manifest(path)
        splits = {name: {key: s[key] for key in ("documents", "bytes", "compressed_bytes")}
                  | {"ratio": ratio(s["bytes"], s["compressed_bytes"])} for name, s in manifest["splits"].items()}
        return {"path": str(_corpus_dir(path)), "prepared": True, "manifest": manifest, "splits": splits}
    files = corpus_files(path, split=None)
    counts, documents, nbytes = {}, 0, 0
    for file in files:
        for doc in iter_documents(file, field=field, counts=counts):
            documents, nbytes = documents + 1, nbytes + len(doc)
    compressed = sum(file.stat().st_size for file in files)
    return {"path": ", ".join(os.fspath(i) for i in _spec_items(path)), "prepared": False,
            "files": len(files), "documents": documents, "bytes": nbytes, "compressed_bytes": compressed,
            "ratio": ratio(nbytes, compressed), "skipped": {r: counts.get(r, 0) for r in SKIP_REASONS}}


def verify(corpus_dir) -> None:
    """Re-read every shard of a prepared corpus and check it against the manifest: the files, the
    document and byte counts, the compressed sizes and the sha256 of the decompressed content."""
    manifest, root = read_manifest(corpus_dir), _corpus_dir(corpus_dir)
    damaged = f"the corpus is damaged; {_REPREP}"
    for name, split in manifest["splits"].items():
        found = [p.name for p in _walk(root / name)] if (root / name).is_dir() else []
        if sorted(found) != sorted(split["shards"]):
            raise CorpusError(f"{root / name} holds {found} but the manifest lists {split['shards']}; {damaged}")
        sha, documents, nbytes, compressed = hashlib.sha256(), 0, 0, 0
        for shard in split["shards"]:
            path, rest = root / name / shard, b""
            compressed += path.stat().st_size
            with _open(path) as f:
                for _, _, data in _pieces(f, path, (0, 0)):
                    if data is None:
                        break
                    sha.update(data)
                    *lines, rest = (rest + data).split(b"\n")
                    for line in lines:
                        if type(doc := parse_record(line)) is not bytes:
                            raise CorpusError(f"{path} holds a bad record ({doc}) after {documents} "
                                              f"documents of split {name}; {damaged}")
                        documents, nbytes = documents + 1, nbytes + len(doc)
            if rest:
                raise CorpusError(f"{path} does not end with a newline; {damaged}")
        got = {"documents": documents, "bytes": nbytes, "compressed_bytes": compressed, "sha256": sha.hexdigest()}
        for key, value in got.items():
            if split.get(key) != value:
                raise CorpusError(f"split {name} of {root} has {key} {value} but its manifest says "
                                  f"{split.get(key)}; {damaged}")
