"""Vocabularies: byte ids (the product) and a byte-level BPE (the baseline of `bench tokens`).

Byte ids 0..255 are the byte values, then three special ids. The embedding table is padded to a
multiple of 8 (264 rows); the ids 259..263 are never produced by the data and generation never
emits them, nor PAD. `TextStream` turns bytes that arrive a few at a time into text without
splitting a UTF-8 character.

A BPE vocabulary keeps the byte ids and puts its merged tokens after them, from 264 on, so every
byte is still a token of its own, the special ids mean what they mean for bytes, and a model over
tokens is the byte model with a bigger table (`ModelConfig.vocab_size`).

The BPE is Hugging Face `tokenizers` (an optional extra, `pip install 'bytemtp[tokens]'`, imported
only when a BPE is used), trained on the documents it is given (the train split) and lossless for
any bytes: a document's bytes are read as Latin-1 characters (one a byte, NUL and invalid UTF-8
included), split before merging by GPT-2's pattern (words with their leading space, digits,
punctuation, whitespace), and merged over the 256 byte characters; a token's bytes are its
characters written back as Latin-1. GPT-2's byte-level BPE splits the same way, except that it
reads non-ASCII text as Unicode characters first. The file is the tokenizer's own JSON
(`tokenizer.json`); the ids above are derived from it (a one-character token is its byte, the
others follow in the file's order), so the file is all a checkpoint keeps.

`Vocabulary.lengths` gives the bytes each id stands for (EOS counts as one, as bits per byte of a
byte model count it): nats summed over a text's tokens, divided by the bytes they stand for, are
bits per byte of the same bytes for either vocabulary.
"""

import codecs
import functools
import os
from pathlib import Path
from typing import Iterable

N_BYTES = 256
BOS = 256  # beginning of sequence (reserved; the loader does not insert it)
EOS = 257  # end of document
PAD = 258  # padding; never a training target, never generated
VOCAB_SIZE = 264  # 259 real ids padded to a multiple of 8

SPECIAL_NAMES = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}


def table_rows(vocab_size: int) -> int:
    """Rows of the embedding and unembedding tables for `vocab_size` ids: padded to a multiple of 8
    (264 for bytes; a BPE baseline's merges follow from 264 on, `bytemtp.vocab`)."""
    return -(-vocab_size // 8) * 8


def emitted(vocab_size: int = PAD + 1) -> list[bool]:
    """Which ids of the table of a vocabulary of `vocab_size` ids (`ModelConfig.vocab_size`; the
    table has `table_rows(vocab_size)` rows) generation may emit: the bytes, EOS and a BPE
    baseline's merged tokens (264 up to vocab_size); never BOS, PAD or the table's padding (259..263,
    and a BPE table's rows from vocab_size on, 300..303 for 300 ids). The size, not the table's
    rows, says where the padding starts. Decoding ranks only these, and a draft head reads only
    these as the id drafted before it."""
    return [i < N_BYTES or i == EOS or VOCAB_SIZE <= i < vocab_size for i in range(table_rows(vocab_size))]


class TextStream:
    """Incremental UTF-8: a character split across pieces prints whole; invalid bytes become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


# --- vocabularies: the bytes and the BPE baseline ---------------------------------------------

FIRST_MERGE = VOCAB_SIZE  # the first id of a merged token
# GPT-2's pre-tokenization (tiktoken's r50k pattern): words, numbers and punctuation with their
# leading space, runs of whitespace
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; the message names the file and the fix."""


class Vocabulary:
    """The bytes: every id a byte, the identity on text."""

    path = ""  # the tokenizer file ("" for bytes)
    size = PAD + 1  # ids in use: the bytes and the three special ids

    @property
    def is_bytes(self) -> bool:
        return True

    @property
    def pieces(self) -> list[bytes] | None:
        """The bytes of each id, or None for the byte vocabulary (each id its own byte)."""
        return None

    @property
    def lengths(self) -> list[int]:
        """Bytes each id stands for (table_rows(size) of them; EOS 1, the other special ids 0)."""
        out = [1] * N_BYTES + [0] * (table_rows(self.size) - N_BYTES)
        out[EOS] = 1
        return out

    def encode(self, data: bytes) -> list[int]:
        return list(data)

    def encode_many(self, docs: list[bytes]) -> list[list[int]]:
        return [list(d) for d in docs]

    def decode(self, ids: Iterable[int]) -> bytes:
        return bytes(i for i in ids if i < N_BYTES)

    def describe(self) -> str:
        return "bytes"


BYTES = Vocabulary()


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise TokenizerError("a BPE vocabulary needs Hugging Face tokenizers: pip install 'bytemtp[tokens]'") from None
    return tokenizers


class BPE(Vocabulary):
    """A byte-level BPE read from a `tokenizers` JSON file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        tk = _tokenizers()
        self.path = str(path)
        try:
            self._tok = tk.Tokenizer.from_file(self.path)
        except Exception as e:  # noqa: BLE001 - the library raises bare Exceptions on bad files
            raise TokenizerError(f"{path} is not a tokenizers JSON file ({e}); make one with "
                                 "bytemtp bench tokens, or pass the tokenizer.json of a token run") from None
        hf_vocab = self._tok.get_vocab()
        singles = {tok: i for tok, i in hf_vocab.items() if len(tok) == 1}
        if len(singles) != N_BYTES or any(ord(c) >= N_BYTES for c in singles):
            raise TokenizerError(f"{path} is not a byte-level BPE over the 256 Latin-1 characters "
                                 f"(it has {len(singles)} one-character tokens); make one with bytemtp bench tokens")
        merged = sorted((i, tok) for tok, i in hf_vocab.items() if len(tok) > 1)
        self.size = FIRST_MERGE + len(merged)
        self._to_ours = [0] * len(hf_vocab)
        self._pieces = [bytes([i]) for i in range(N_BYTES)] + [b""] * (FIRST_MERGE - N_BYTES)
        for tok, i in singles.items():
            self._to_ours[i] = ord(tok)
        for rank, (i, tok) in enumerate(merged):
            self._to_ours[i] = FIRST_MERGE + rank
            self._pieces.append(tok.encode("latin-1"))

    @property
    def is_bytes(self) -> bool:
        return False

    @property
    def pieces(self) -> list[bytes]:
        return self._pieces

    @property
    def lengths(self) -> list[int]:
        out = [len(p) for p in self._pieces] + [0] * (table_rows(self.size) - self.size)
        out[EOS] = 1
        return out

    def encode(self, data: bytes) -> list[int]:
        to_ours = self._to_ours
        return [to_ours[i] for i in self._tok.encode(bytes(data).decode("latin-1")).ids]

    def encode_many(self, docs: list[bytes]) -> list[list[int]]:
        to_ours = self._to_ours
        encoded = self._tok.encode_batch([bytes(d).decode("latin-1") for d in docs])
        return [[to_ours[i] for i in e.ids] for e in encoded]

    def decode(self, ids: Iterable[int]) -> bytes:
        pieces = self._pieces
        return b"".join(pieces[i] for i in ids if i < len(pieces))

    def describe(self) -> str:
        return f"byte-level BPE of {self.size} ids ({self.size - FIRST_MERGE} merges), {self.path}"


def train_bpe(docs: Iterable[bytes], *, vocab_size: int, path: str | os.PathLike) -> BPE:
    """Train a byte-level BPE of `vocab_size` ids (the 264 byte ids and vocab_size - 264 merges,
    fewer where the text has no more pairs to merge) on `docs` and write it to `path`."""
    if vocab_size <= FIRST_MERGE:
        raise TokenizerError(f"vocab_size={vocab_size} leaves no room for merges: the byte ids take "
                             f"{FIRST_MERGE}; ask for more")
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(SPLIT_PATTERN), behavior="isolated")
    alphabet = [chr(i) for i in range(N_BYTES)]
    trainer = tk.trainers.BpeTrainer(vocab_size=N_BYTES + vocab_size - FIRST_MERGE, initial_alphabet=alphabet,
                                     special_tokens=[], show_progress=False)
    tok.train_from_iterator((bytes(d).decode("latin-1") for d in docs), trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return BPE(path)


def load_vocabulary(path: str | os.PathLike | None) -> Vocabulary:
    """The vocabulary a tokenizer file describes (read once per file and version); bytes for None or ""."""
    if not path:
        return BYTES
    if not Path(path).is_file():
        raise TokenizerError(f"{path}: no such tokenizer file; pass the tokenizer.json that "
                             "bytemtp bench tokens wrote, or leave data.tokenizer empty for bytes")
    stat = Path(path).stat()
    return _load_bpe(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load_bpe(path: str, mtime_ns: int, size: int) -> BPE:
    return BPE(path)


def check_vocab_size(vocab: Vocabulary, vocab_size: int) -> None:
    """The model's vocab_size must be the vocabulary's: one line naming both otherwise."""
    if vocab_size != vocab.size:
        raise TokenizerError(f"model.vocab_size={vocab_size} but the vocabulary ({vocab.describe()}) has "
                             f"{vocab.size} ids; set model.vocab_size={vocab.size}")
