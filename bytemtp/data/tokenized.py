"""A document stream read as BPE tokens: the loader's stage for the token baseline of `bench tokens`.

`TokenStream` wraps a `stream.DocumentStream` and hands the packer the same kind of pieces, but as
ids already: each whole document encoded by the vocabulary (`bytemtp.vocab`), then EOS. A
document arrives in pieces from prepared shards (up to a chunk at a time), and BPE needs it whole,
so the bytes of a document not yet ended wait in `pending`; they are part of the state, next to
the inner stream's position (which stands after them), so a resumed stream encodes exactly the
documents an uninterrupted one would. `counts["tokens"]` counts the ids handed out.
"""

from __future__ import annotations

import base64
from typing import Iterator

import numpy as np

from bytemtp.vocab import Vocabulary
from bytemtp.vocab import EOS


class TokenStream:
    """`DocumentStream` (`docs`) as token ids: pieces (uint16 ids with EOS after each document, no
    offsets), with the same epoch, position and statistics, plus the bytes of the document in progress."""

    def __init__(self, docs, vocab: Vocabulary):
        self.docs, self.vocab = docs, vocab
        self.pending = bytearray()  # the document in progress (its bytes so far)
        self.tokens = 0

    @property
    def reader(self) -> int:
        return self.docs.reader

    @property
    def epoch(self) -> int:
        return self.docs.epoch

    def epoch_pieces(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The current epoch's documents as ids, each whole document once (see the module docstring)."""
        none = np.zeros(0, dtype=np.int64)
        for data, at in self.docs.epoch_pieces():
            if not len(at):
                self.pending += data.tobytes()
                continue
            ends = at.tolist()
            docs = [bytes(self.pending) + data[:ends[0]].tobytes()]
            docs += [data[a:b].tobytes() for a, b in zip(ends, ends[1:])]
            self.pending = bytearray(data[ends[-1]:].tobytes())
            ids = []
            for doc in self.vocab.encode_many(docs):
                ids += doc
                ids.append(EOS)
            self.tokens += len(ids)
            yield np.asarray(ids, dtype=np.uint16), none

    def state_dict(self) -> dict:
        return {**self.docs.state_dict(), "pending": base64.b64encode(bytes(self.pending)).decode("ascii"),
                "tokens": self.tokens}

    def load_state_dict(self, state: dict) -> None:
        self.docs.load_state_dict(state)
        self.pending = bytearray(base64.b64decode(state.get("pending", "")))
        self.tokens = state.get("tokens", 0)
