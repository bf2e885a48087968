"""The first stage of the loader's chain (`bytemtp.data.loader`): `DocumentStream`, one reader's
share of a corpus as ids (each document's bytes, then EOS), epoch after epoch, with a plain-dict
position that a resumed stream seeks straight to.

The files are walked in an order shuffled every epoch from the seed (the same order in every
reader), and the records met (documents of prepared shards, JSONL lines, table rows, whole raw
files) are numbered in that order; reader g of G keeps the records whose number is g mod G. Each
file is read by its format's reader (`bytemtp.data.readers`), which owns the typed position within
it. The position carries a digest of the files' names and sizes, so it is refused in a corpus that
changed. Bad records are counted by reason; the stream stops with CorpusError once more than
`max_bad_fraction` of them are bad (after the first 1,000, or at an epoch's end).
"""

from __future__ import annotations

import functools
import hashlib
import random
from pathlib import Path
from typing import Iterator

import numpy as np

from bytemtp.data.readers import reader_for
from bytemtp.data.shards import CorpusError
from bytemtp.data.steps import Share

START = (0, 0)  # the saved position of a file's start, in every format
_MIN_LINES_FOR_BAD_CHECK = 1000


class DocumentStream:
    """One reader's share of the corpus as ids (documents, each followed by EOS), epoch after
    epoch, with a resumable position."""

    CHUNK = 1 << 16  # the most bytes a prepared shard hands out at a time (the packer's tail stays small)
    AHEAD = 3  # frames of a prepared shard decoded ahead, in threads (zstd releases the GIL)

    def __init__(self, files: list[Path], *, field: str = "text", reader: int = 0, n_readers: int = 1,
                 seed: int = 0, max_bad_fraction: float = 0.01):
        assert 0 <= reader < n_readers, (reader, n_readers)
        self.files, self.field = [Path(f) for f in files], field
        self.readers = [reader_for(f, field=field) for f in self.files]
        self.reader, self.n_readers, self.seed = reader, n_readers, seed
        self.max_bad_fraction = max_bad_fraction
        self.epoch, self.file_index, self.record = 0, 0, 0
        self.pos: tuple[int, int] = START  # the position in the current file, typed by its reader once read
        self.counts = {"documents": 0, "bytes": 0, "lines": 0, "skipped": {}}
        self._epoch_docs = 0  # documents this reader took in the current epoch
        self._unchecked = False

    def order(self, epoch: int) -> list[int]:
        """File order of an epoch: a permutation that every reader derives alike."""
        order = list(range(len(self.files)))
        random.Random(f"bytemtp-shards:{self.seed}:{epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Pieces (bytes, offsets after which an EOS follows) from the current position on, forever:
        whole documents from raw and JSONL files, up to CHUNK bytes at a time from prepared shards
        and tables (a table's longer document whole).
        The position advances as they go."""
        while True:
            yield from self.epoch_pieces()

    def epoch_pieces(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The pieces from the current position to the end of the current epoch; once they run out,
        the stream stands at the start of the next epoch."""
        order = self.order(self.epoch)
        while self.file_index < len(order):
            file = self.readers[order[self.file_index]]
            share = Share(self.reader, self.n_readers, chunk=self.CHUNK, ahead=self.AHEAD,
                          undigested=self._unchecked)
            for step in file.share(file.position(self.pos), record=self.record, share=share):
                self.pos, self.record = step.pos, step.record
                self.counts["lines"] += step.lines
                if step.skipped is not None:
                    self._skip(step.skipped, file.path)
                self.counts["documents"] += step.documents
                self.counts["bytes"] += step.nbytes
                self._epoch_docs += step.documents
                if step.piece is not None:
                    yield step.piece
            self.file_index, self.pos = self.file_index + 1, START
        self._check_bad(final=True)
        if self._epoch_docs == 0:
            raise CorpusError(
                f"reader {self.reader} of {self.n_readers} found no documents in a whole epoch of "
                f"{len(self.files)} file(s): the corpus has fewer documents than readers "
                "(ranks x workers); use fewer workers or a bigger corpus")
        self.epoch, self.file_index, self.record, self._epoch_docs = self.epoch + 1, 0, 0, 0

    def _skip(self, reason: str, path: Path) -> None:
        skipped = self.counts["skipped"]
        skipped[reason] = skipped.get(reason, 0) + 1
        self._check_bad(final=False, path=path)

    def _check_bad(self, *, final: bool, path: Path | None = None) -> None:
        lines, bad = self.counts["lines"], sum(self.counts["skipped"].values())
        if (final or lines >= _MIN_LINES_FOR_BAD_CHECK) and lines and bad / lines > self.max_bad_fraction:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.counts["skipped"].items()))
            where = f" (last in {path})" if path else ""
            raise CorpusError(
                f"{bad} of {lines} records are unusable ({reasons}){where}: more than "
                f"data.max_bad_fraction={self.max_bad_fraction}; check data.field "
                f"(now {self.field!r}) or clean the corpus")

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of the files' names and sizes: a saved position fits only the corpus it was taken in."""
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(f"{path.name}\0{path.stat().st_size}\n".encode())
        return digest.hexdigest()[:16]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "file_index": self.file_index, "pos": list(self.pos),
                "record": self.record, "epoch_docs": self._epoch_docs,
                "counts": {**self.counts, "skipped": dict(self.counts["skipped"])},
                "files": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        self._unchecked = "files" not in state  # saved before positions carried the files' digest
        if state.get("files", self.fingerprint) != self.fingerprint:
            raise CorpusError(f"the corpus changed since this position was saved (its {len(self.files)} "
                              "file(s) differ in names or sizes, e.g. prepared again); resume with the "
                              "corpus the run trained on, or start a new run")
        self.epoch, self.file_index, self.record = state["epoch"], state["file_index"], state["record"]
        self.pos = tuple(state["pos"])
        self._epoch_docs = state["epoch_docs"]
        self.counts = {**state["counts"], "skipped": dict(state["counts"]["skipped"])}
