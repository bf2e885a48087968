"""The documents of prep's inputs, in input order, with their digests: read in this process or by
worker processes, all of them or one part.

Where prep's time goes (300 MB of JSONL here): compressing at zstd level 10 about 35-40 MB/s a
core, reading, parsing and hashing the inputs about 350 MB/s, and the writer's own work (two running
digests, the frame buffer) about 450 MB/s. Compression runs in threads (zstd releases the GIL:
`ShardWriter`), so one process that reads for itself keeps about five compressing cores busy;
beyond that its reading holds them up. `plan(workers)` therefore reads in this process up to
`INLINE_UP_TO` workers and starts a reading process for every four workers beyond: on the 2 vCPUs
measured here, reading processes made prep slower (1.5-1.6x one worker's speed against 1.8-2.0x
reading inline, in the same runs), since parsing moved to another process costs a copy through a
pipe and a process start and frees little.

With `processes` > 0, `read_inputs` starts that many; process p reads files p, p + P, ... in
order, hashes each document (sha256) and sends the documents in batches of about `BATCH_BYTES`
through a pipe of its own, each batch as one blob (no pickled object a document), blocking while
the pipe is full, so a process runs at most a batch ahead of its turn. This process takes the
batches file by file in input order, so what it sees, and therefore the corpus prep writes, is the
same for every number of processes and threads: the same documents in the same order, the same
shards, byte for byte. Deduplication and the split stay in this process (exact: one set of digests).

A worker that ends without finishing (killed, out of memory) closes its pipe, which is raised at
once as CorpusError naming it and its file; a worker's own error (a damaged input) comes back as
its one-line CorpusError. Workers ignore SIGINT: Ctrl-C reaches prep in this process, whose cleanup
stops them. A worker whose parent is gone finds its pipe broken and stops.

`part` (a `Part`: index i of n) keeps only the documents whose digest falls in part i (bytes 8-16
of the sha256 modulo n; the val split reads bytes 0-8, so parts and split do not correlate).
A part is a function of the document's bytes alone, so copies of one document always fall in the
same part: n jobs that each read every input and keep one part never share a document, their
union is every document, and each one's deduplication is exact across all of them, as long as
every job reads the same bytes: each file's last batch carries a digest of all its documents (every
part's), which a part records so that the merge refuses parts that read a file edited in place
between the jobs (same name, same size, other documents).
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
from collections.abc import Iterator
from typing import NamedTuple

from bytemtp.data.corpus import iter_documents
from bytemtp.data.shards import CorpusError

BATCH_BYTES = 4 << 20  # document bytes a reading process sends at a time
INLINE_UP_TO = 4  # up to this many workers, prep reads in its own process


def plan(workers: int) -> tuple[int, int]:
    """(reading processes, compressing threads) for `prep --workers N` (the module doc says why):
    one worker reads and compresses in one thread, the baseline of one core."""
    if workers <= 1:
        return 0, 0
    return (0 if workers <= INLINE_UP_TO else workers // 4), workers


class Part(NamedTuple):
    """Part `index` of `of` (0 <= index < of), as `prep --part I/N` names it."""

    index: int
    of: int

    @classmethod
    def parse(cls, text: str) -> Part:
        i, sep, n = text.partition("/")
        if not (sep and i.strip().isdigit() and n.strip().isdigit() and int(i) < int(n)):
            raise ValueError(f"--part {text!r} is not I/N with 0 <= I < N, e.g. 0/4 (in a Slurm array: "
                             f"$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
        return cls(int(i), int(n))

    def takes(self, digest: bytes) -> bool:
        return int.from_bytes(digest[8:16], "big") % self.of == self.index


class Batch(NamedTuple):
    """Documents of one input file, in order (bytes, or memoryviews of what a reading process
    sent), with their sha256 digests. `read` counts the documents read for this batch (those of
    other parts too), `in_file` the document bytes read from the file so far; the file's last batch
    has `end` set, its skipped records by reason, and `content`: the sha256 of the digests of every
    document read from the file (every part's), in order, which a part records so that a merge can
    tell that every part read the same documents."""

    file: int
    docs: list[bytes]
    digests: list[bytes]
    read: int
    in_file: int
    end: bool = False
    skipped: dict | None = None
    content: str | None = None


def _batches(files, index: int, *, field: str, part: Part | None, batch_bytes: int) -> Iterator[Batch]:
    """The batches of file `index`."""
    docs, digests, size, read, in_file, skipped, content = [], [], 0, 0, 0, {}, hashlib.sha256()
    for doc in iter_documents(files[index], field=field, counts=skipped):
        digest = hashlib.sha256(doc).digest()
        content.update(digest)
        read, in_file = read + 1, in_file + len(doc)
        if part is not None and not part.takes(digest):
            continue
        docs.append(doc)
        digests.append(digest)
        size += len(doc)
        if size >= batch_bytes:
            yield Batch(index, docs, digests, read, in_file)
            docs, digests, size, read = [], [], 0, 0
    yield Batch(index, docs, digests, read, in_file, end=True, skipped=skipped, content=content.hexdigest())


def read_inputs(files: list, *, field: str = "text", processes: int = 0, part: Part | None = None,
                batch_bytes: int | None = None) -> Iterator[Batch]:
    """Every file's batches, file after file in the order given (see the module doc). A batch's
    documents may be views of a buffer that the next batch reuses: use them before asking for it."""
    workers, batch_bytes = min(processes, len(files)), batch_bytes or BATCH_BYTES
    if workers < 1:
        for index in range(len(files)):
            yield from _batches(files, index, field=field, part=part, batch_bytes=batch_bytes)
        return
    # spawn, not fork: prep runs threads (compression, progress), and a forked copy of a process
    # with threads may inherit a held lock; so a script that calls this must guard its top level
    # with `if __name__ == "__main__":` as multiprocessing requires
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(workers)]
    procs = [context.Process(target=_work, name=f"bytemtp-prep-{w}", daemon=True,
                             args=(list(map(os.fspath, files)), range(w, len(files), workers), field, part,
                                   batch_bytes, pipes[w][1]))
             for w in range(workers)]
    try:
        for proc, (_, sender) in zip(procs, pipes):
            proc.start()
            sender.close()  # the worker's end: once it exits, a read here ends instead of waiting
        buffers = [bytearray() for _ in range(workers)]  # each worker's blobs land here, reused
        for index in range(len(files)):
            w = index % workers
            while True:
                batch, buffers[w] = _receive(pipes[w][0], procs[w], files[index], buffers[w])
                yield batch
                if batch.end:
                    break
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for receiver, _ in pipes:
            receiver.close()
        for proc in procs:
            if proc.pid is not None:  # started
                proc.join()


def _receive(conn, proc, path, blob: bytearray) -> tuple[Batch, bytearray]:
    """The next batch a worker sends (its fields, then its documents as one blob: no object a
    document on the way, one copy into the pipe and one out), and the buffer the blob is in: `blob`
    again when it is large enough (the previous batch's documents, views of it, are written by then),
    else a new one (a bytearray with views cannot grow)."""
    try:
        message = conn.recv()
        if isinstance(message, str):  # the worker's error, one line
            raise CorpusError(message)
        batch, lengths = message
        size = sum(lengths)
        if size > len(blob):
            blob = bytearray(max(size, 2 * len(blob)))
        if lengths:
            conn.recv_bytes_into(blob)
    except (EOFError, OSError):
        proc.join()
        code = proc.exitcode
        how = f"was killed by signal {-code}" if code and code < 0 else f"exited with status {code}"
        raise CorpusError(f"prep's reading process {proc.pid} {how} while reading {path}; nothing was written "
                          f"(rerun prep; with fewer --workers if memory ran out)") from None
    view, at, docs = memoryview(blob), 0, []
    for n in lengths:
        docs.append(view[at:at + n])
        at += n
    return batch._replace(docs=docs), blob


def _work(files, indices, field, part, batch_bytes, conn) -> None:
    """A worker process: the batches of its files, in order, into its pipe. It blocks while the
    pipe is full (its batches wait their turn), and ends when the pipe breaks (prep is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    index = None
    try:
        for index in indices:
            for batch in _batches(files, index, field=field, part=part, batch_bytes=batch_bytes):
                conn.send((batch._replace(docs=[]), [len(d) for d in batch.docs]))
                if batch.docs:
                    conn.send_bytes(b"".join(batch.docs))
    except (BrokenPipeError, ConnectionResetError):
        return
    except CorpusError as e:
        _say(conn, str(e))
    except Exception as e:  # noqa: BLE001 - anything else still reaches the user as one line
        _say(conn, f"reading {files[index]} failed: {type(e).__name__}: {e}")
    finally:
        conn.close()


def _say(conn, message: str) -> None:
    try:
        conn.send(message)
    except OSError:
        pass
