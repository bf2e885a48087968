"""Writing prepared corpora: shards of raw document bytes and the manifest that describes them.

`ShardWriter` cuts documents into independent zstd frames of `frame_bytes` of content and ends each
shard with its index; `prepare` turns any corpus spec into a prepared corpus. The formats (shard
layout, index, manifest) and their constants are defined, and read, in `bytemtp.corpus`; this module
only writes them.

`prepare` drops exact duplicates and splits documents by a hash of their bytes, so the split is stable
across runs and file orders and identical documents can never straddle train and val. Frames are
compressed in parallel but written in order, so the output is the same for every thread count.
Duplicate detection keeps one digest per unique document in memory (about 100 bytes each). Shards and
the corpus itself are written under temporary names, fsynced and renamed, so a crash never leaves a
half-written file under a final name.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import json
import os
import pathlib
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

import bytemtp
from bytemtp.corpus import (
    FORMAT_VERSION, MANIFEST, SHARD_MAGIC, SKIP_REASONS, SKIPPABLE_MAGIC, TRAILER_BYTES, CorpusError, corpus_files,
    hash_document, iter_documents, spec_items)


def encode_index(compressed: list[int], content: list[int], lengths: list[int]) -> bytes:
    """A shard's index as the skippable zstd frame that ends the file (layout in `bytemtp.corpus`'s module doc)."""
    body = np.array([len(compressed), len(lengths), *compressed, *content, *lengths], dtype="<u8").tobytes()
    size = len(body) + TRAILER_BYTES
    if size >= 1 << 32:
        raise ValueError(f"a shard index of {size} bytes does not fit a skippable frame; use smaller shards")
    return (SKIPPABLE_MAGIC.to_bytes(4, "little") + size.to_bytes(4, "little") + body
            + size.to_bytes(8, "little") + SHARD_MAGIC)


class ShardWriter:
    """Writes documents into prepared shards shard-00000.zst, shard-00001.zst, ... in directory.

    Documents go back to back into frames of exactly frame_bytes of content (a document may span
    frames); each frame is compressed as one independent zstd frame with checksum and content size.
    A shard ends after the document that brings its content to shard_bytes or more, with its index
    (`bytemtp.corpus`'s module doc has the layout). threads=0 compresses in the calling thread, n > 0 in n
    threads, and -1 in one thread per CPU core; frames are written in order, so the output is the
    same for every thread count. Each shard is written as `<name>.tmp`, then fsynced and renamed
    when complete.
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
        self._inflight = collections.deque()  # (content bytes, compressed frame or its future)
        self._local = threading.local()  # one compressor per thread: they are not thread-safe
        self._buffer = bytearray()  # content not yet in a frame
        self._file = None
        self._frames: tuple[list[int], list[int]] = ([], [])  # the open shard's compressed, content sizes
        self._lengths: list[int] = []  # the open shard's document lengths
        self._shard_content = 0
        self._sha = hashlib.sha256()
        self.shards: list[str] = []
        self.documents = self.bytes = self.compressed_bytes = 0

    def write(self, doc: bytes) -> None:
        self._buffer += doc
        self._lengths.append(len(doc))
        hash_document(self._sha, doc)
        self.documents += 1
        self.bytes += len(doc)
        while len(self._buffer) >= self.frame_bytes:
            self._end_frame(self.frame_bytes)
        self._shard_content += len(doc)
        if self._shard_content >= self.shard_bytes:
            self._end_shard()

    def _compress(self, frame: bytes) -> bytes:
        if not hasattr(self._local, "cctx"):
            self._local.cctx = zstandard.ZstdCompressor(level=self.level, write_checksum=True,
                                                        write_content_size=True)
        return self._local.cctx.compress(frame)

    def _end_frame(self, size: int) -> None:
        frame = bytes(self._buffer[:size])
        del self._buffer[:size]
        pending = self._compress(frame) if self._pool is None else self._pool.submit(self._compress, frame)
        self._inflight.append((len(frame), pending))
        while len(self._inflight) > self._max_inflight:
            self._write_frame()

    def _write_frame(self) -> None:
        n_content, pending = self._inflight.popleft()
        compressed = pending if self._pool is None else pending.result()
        if self._file is None:
            self.shards.append(f"shard-{len(self.shards):05d}.zst")
            self._file = open(self.directory / (self.shards[-1] + ".tmp"), "wb")
        self._file.write(compressed)
        self._frames[0].append(len(compressed))
        self._frames[1].append(n_content)
        self.compressed_bytes += len(compressed)

    def _end_shard(self) -> None:
        if self._buffer or not (self._inflight or self._frames[0]):  # a shard has at least one frame
            self._end_frame(len(self._buffer))
        while self._inflight:
            self._write_frame()
        index = encode_index(*self._frames, self._lengths)
        self._file.write(index)
        self.compressed_bytes += len(index)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._file.name, self.directory / self.shards[-1])
        self._file, self._frames, self._lengths, self._shard_content = None, ([], []), [], 0

    def summary(self) -> dict:
        """This split's manifest entry; sha256 is of each document's length (8 bytes, little-endian)
        and bytes, in shard order."""
        return {"documents": self.documents, "bytes": self.bytes, "compressed_bytes": self.compressed_bytes,
                "shards": list(self.shards), "sha256": self._sha.hexdigest()}

    def close(self) -> None:
        if self._lengths:
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
