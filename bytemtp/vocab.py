"""Byte vocabulary: ids 0..255 are the byte values, then three special ids.

The embedding table is padded to a multiple of 8 (264 rows); the ids 259..263 are never
produced by the data and generation never emits them, nor PAD.
"""

N_BYTES = 256
BOS = 256  # beginning of sequence (reserved; the loader does not insert it)
EOS = 257  # end of document
PAD = 258  # padding; never a training target, never generated
VOCAB_SIZE = 264  # 259 real ids padded to a multiple of 8

SPECIAL_NAMES = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
