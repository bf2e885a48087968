"""Byte vocabulary: ids 0..255 are the byte values, then three special ids.

The embedding table is padded to a multiple of 8 (264 rows); the ids 259..263 are never
produced by the data and generation never emits them, nor PAD. `TextStream` turns bytes that
arrive a few at a time into text without splitting a UTF-8 character.
"""

import codecs

N_BYTES = 256
BOS = 256  # beginning of sequence (reserved; the loader does not insert it)
EOS = 257  # end of document
PAD = 258  # padding; never a training target, never generated
VOCAB_SIZE = 264  # 259 real ids padded to a multiple of 8

SPECIAL_NAMES = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}


def table_rows(vocab_size: int) -> int:
    """Rows of the embedding and unembedding tables for `vocab_size` ids: padded to a multiple of 8
    (264 for bytes; a BPE baseline's merges follow from 264 on, `bytemtp.tokens`)."""
    return -(-vocab_size // 8) * 8


class TextStream:
    """Incremental UTF-8: a character split across pieces prints whole; invalid bytes become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
