"""The byte tokenizer of a bytemtp model in Hugging Face `transformers`.

Text is its UTF-8 bytes: ids 0..255 are the byte values themselves, 256 `<bos>`, 257 `<eos>` (end
of document), 258 `<pad>`, as in bytemtp.vocab. Nothing is normalised. A str carries arbitrary
bytes through `surrogateescape` (`data.decode("utf-8", "surrogateescape")` encodes back to exactly
`data`). Special names in the text are not special: "<eos>" in a string is its five bytes, since a
byte model's text may contain anything; special ids enter only as ids, or through `document_start`.

bytemtp trains on documents that each follow an EOS, and its own decoding puts EOS before a
prompt. The tokenizer adds nothing by default (ids are the text's bytes); with
`document_start=True` it puts EOS before each text, so a prompt starts a document as in training.

Decoding turns ids back into bytes and reads them as UTF-8, invalid bytes as U+FFFD; special ids
are written by name, or dropped with `skip_special_tokens`. Ids 259..263 pad the embedding table
and are never produced, so they decode to nothing.
"""

from __future__ import annotations

from transformers import AddedToken, PreTrainedTokenizer

N_BYTES = 256
BOS, EOS, PAD = 256, 257, 258


class ByteMTPTokenizer(PreTrainedTokenizer):
    """UTF-8 bytes as ids, with bytemtp's three special ids; pads on the left for batched generation."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, bos_token: str = "<bos>", eos_token: str = "<eos>", pad_token: str = "<pad>",
                 document_start: bool = False, **kwargs):
        self.document_start = document_start
        self._added_tokens_decoder = {i: AddedToken(str(name), special=True, normalized=False)
                                      for i, name in ((BOS, bos_token), (EOS, eos_token), (PAD, pad_token))}
        kwargs.setdefault("padding_side", "left")
        kwargs.setdefault("split_special_tokens", True)
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(bos_token=bos_token, eos_token=eos_token, pad_token=pad_token,
                         document_start=document_start, **kwargs)

    @property
    def vocab_size(self) -> int:
        """The byte ids; the special ids follow them (len(tokenizer) counts both)."""
        return N_BYTES

    def get_vocab(self) -> dict[str, int]:
        return {**{chr(i): i for i in range(N_BYTES)}, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        """One token a byte, named by the character of the same number (as ByT5 does)."""
        return [chr(b) for b in text.encode("utf-8", "surrogateescape")]

    def _convert_token_to_id(self, token: str) -> int:
        if len(token) != 1 or ord(token) >= N_BYTES:
            raise ValueError(f"{token!r} is not a token of the byte tokenizer: one character 0..255 (a byte), "
                             "or <bos>, <eos>, <pad>")
        return ord(token)

    def _convert_id_to_token(self, index: int) -> str:
        return chr(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self._decode(self.convert_tokens_to_ids(tokens))

    def _decode(self, token_ids: int | list[int], skip_special_tokens: bool = False, **kwargs) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else token_ids
        data = bytearray()
        for i in ids:
            if i < N_BYTES:
                data.append(i)
            elif i in self._added_tokens_decoder and not skip_special_tokens:
                data += self._added_tokens_decoder[i].content.encode()
        return data.decode("utf-8", errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0: list[int],
                                         token_ids_1: list[int] | None = None) -> list[int]:
        """The ids of a text (or of two, one document each), after EOS when `document_start`."""
        start = [EOS] if self.document_start else []
        return start + token_ids_0 + ([] if token_ids_1 is None else start + token_ids_1)

    def get_special_tokens_mask(self, token_ids_0: list[int], token_ids_1: list[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        if already_has_special_tokens:
            return [int(i >= N_BYTES) for i in token_ids_0 + (token_ids_1 or [])]
        start = [1] if self.document_start else []
        return start + [0] * len(token_ids_0) + ([] if token_ids_1 is None else start + [0] * len(token_ids_1))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        return ()  # the vocabulary is the 256 byte values: no file
