"""How repetitive decoded text is, beside the real continuation of the same prompts: the figures
that say whether a decoding speed was measured on text worth the name. A model that has fallen
into a run of spaces drafts it perfectly, and its bytes per pass and speedup then describe the
loop, not the model's text.

Two figures, both of bytes and neither needing a model: the share of distinct 8-grams, and the
zstd compression ratio. The distinct share is counted within each text (a prompt's continuation)
and pooled over texts: the distinct 8-grams of every text summed, over the 8-grams of every text
summed, so a text weighs by its length and two prompts that share a phrase are not counted as
repeating it. The zstd ratio is of the texts concatenated (bytes over compressed bytes, at zstd's
default level 3, the `zstd` command's, so it can be checked by hand): it sees repeats across
texts too, which a degenerate model produces in every row alike. The trade-off: both figures
are cheap and say nothing of whether the text is right, only whether it is varied; text of a
few hundred bytes compresses less than the same text at length, which is why decoded text is
judged against the real continuation cut to the same lengths rather than against a fixed bar.
"""

from __future__ import annotations

from dataclasses import dataclass

import zstandard

NGRAM = 8  # bytes in the n-grams counted
ZSTD_LEVEL = 3  # zstd's default level, the `zstd` command's


@dataclass(frozen=True)
class RepetitionFigures:
    """How repetitive a set of texts is (`repetition_figures`)."""
    distinct_8grams: float | None  # distinct 8-grams within each text, summed, over all 8-grams (None: none)
    zstd_ratio: float | None  # the texts concatenated: bytes over zstd-compressed bytes; None: no bytes
    bytes: int  # the bytes of all the texts


@dataclass(frozen=True)
class Repetition:
    """Decoded text beside the real continuation of the same prompts, where there is one
    (`measure_repetition`)."""
    decoded: RepetitionFigures
    real: RepetitionFigures | None = None  # the real continuations, each cut to its decoded text's length
    zstd_ratio_over_real: float | None = None  # decoded zstd ratio / real zstd ratio: 1 is as varied as real text

    @classmethod
    def from_json(cls, data: dict) -> Repetition:
        """Its JSON form (`dataclasses.asdict`) read back."""
        def figures(f: dict | None) -> RepetitionFigures | None:
            return None if f is None else RepetitionFigures(**f)
        return cls(decoded=figures(data["decoded"]), real=figures(data.get("real")),
                   zstd_ratio_over_real=data.get("zstd_ratio_over_real"))


def distinct_ngram_share(texts: list[bytes], n: int = NGRAM) -> float | None:
    """The distinct n-grams within each text, summed over texts, over all the texts' n-grams;
    None when no text has n bytes."""
    total = sum(max(0, len(t) - n + 1) for t in texts)
    if not total:
        return None
    return sum(len({t[i:i + n] for i in range(len(t) - n + 1)}) for t in texts) / total


def zstd_ratio(texts: list[bytes]) -> float | None:
    """Bytes of the texts concatenated over their zstd-compressed size; None when there are no bytes."""
    data = b"".join(texts)
    if not data:
        return None
    return len(data) / len(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


def repetition_figures(texts: list[bytes]) -> RepetitionFigures:
    """The distinct 8-gram share (per text, pooled) and the zstd ratio (concatenated) of `texts`."""
    return RepetitionFigures(distinct_8grams=distinct_ngram_share(texts), zstd_ratio=zstd_ratio(texts),
                             bytes=sum(map(len, texts)))


def measure_repetition(decoded: list[bytes], real: list[bytes] | None = None) -> Repetition:
    """How repetitive the decoded texts are, and, given the real continuation of each one's prompt
    (in the same order), the same figures of those continuations, each cut to its decoded text's
    length (a continuation shorter than that, where the document ended, stays as it is), and the
    ratio of the two zstd ratios."""
    figures = repetition_figures(decoded)
    if real is None:
        return Repetition(decoded=figures)
    if len(real) != len(decoded):
        raise ValueError(f"{len(real)} real continuations for {len(decoded)} decoded texts")
    real_figures = repetition_figures([r[:len(d)] for d, r in zip(decoded, real)])
    over = (figures.zstd_ratio / real_figures.zstd_ratio
            if figures.zstd_ratio is not None and real_figures.zstd_ratio is not None else None)
    return Repetition(decoded=figures, real=real_figures, zstd_ratio_over_real=over)
