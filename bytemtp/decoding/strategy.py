"""The draft strategy: how decoding drafts, as one typed value, and the named sets of them.

A `Draft` is a number of heads (None: chosen each pass; 1: plain decoding; k; or "all"), a
`Shape` (auto, chain, tree) and whether prompt-lookup drafts join the heads' (`lookup`). What the
decoder does with it is decided here and nowhere else: whether it drafts trees (`trees`), whether
its passes are chosen from the acceptance profile and the measured costs (`adapts`, which also
says whether it waits for costs to be measured), and how many depths its heads may draft
(`max_depth`). Its text form is its name (`parse`, `str`), one name per strategy, so that
`parse(str(x)) == x`: a value is normalised when made (with fixed heads, auto drafts chains; one
head drafts nothing from the heads), so two names never mean the same strategy. Lookup drafts
need pass costs to weigh a deeper chain: a fixed draft with lookup measures them on its first
lookup pass.

A new strategy is a new `Shape` (or a new heads value) with its rule in these methods; the
CLI's `--draft` (every command that decodes reads it with `parse`; `bench decode`'s default is
`DECODE_MODES`), the benchmark's modes and the drafts that evaluation decodes (`EVALUATED_DRAFTS`)
are read from here.
No torch: the CLI reads this module when it builds its options.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

LOOKUP_SUFFIX = "+lookup"  # a draft's name with prompt-lookup drafts too


class Shape(enum.StrEnum):
    """The shape of a pass's draft."""

    AUTO = "auto"  # trees where they pay, chains otherwise (with fixed heads: chains)
    CHAIN = "chain"  # chains only
    TREE = "tree"  # with fixed heads: the best tree of that depth; without, as auto


@dataclass(frozen=True)
class Draft:
    """How decoding drafts, as one value: `heads` None chooses the heads and the draft each pass
    from measured costs and acceptance (`drafting.choose`); 1 decodes plainly, one byte a pass with
    the next-byte head alone; k > 1 runs k heads every pass; "all" runs all of the model's heads.
    `shape`: see `Shape`. Sampling always drafts chains (one draft a position, each drawn with the
    noise of its position: `sampling.verify_sampled`).

    `lookup`: greedy rows may also draft prompt-lookup bytes (the bytes that followed the last
    earlier occurrence of their newest bytes, `lookup`), in place of the heads' top-rank chain and
    deeper than the heads reach, where they promise more bytes a second; even plain decoding may.

    Its text form is the name of a benchmark mode: plain, auto, chain (automatic chains), tree,
    and chain-K or tree-K, K a number of heads or all, each with "+lookup" to draft lookup bytes
    too (`parse`, `str`)."""

    heads: int | str | None = None
    shape: Shape = Shape.AUTO
    lookup: bool = False

    def __post_init__(self) -> None:
        if self.shape not in list(Shape):
            raise ValueError(f"draft shape {self.shape!r} is not allowed; choose auto, chain or tree")
        if not (self.heads is None or self.heads == "all" or isinstance(self.heads, int) and self.heads >= 1):
            raise ValueError(f"heads={self.heads!r} is not allowed; expected a number >= 1, 'all' or None (automatic)")
        shape = Shape(self.shape)
        if self.heads == 1 or self.heads is not None and shape is Shape.AUTO:
            shape = Shape.CHAIN  # one head drafts nothing; fixed heads under auto draft chains
        object.__setattr__(self, "shape", shape)

    @classmethod
    def plain(cls) -> Draft:
        return cls(heads=1, shape=Shape.CHAIN)

    @classmethod
    def parse(cls, text: str) -> Draft:
        """A mode name (see the class docstring) as a Draft; ValueError naming the allowed forms."""
        name = text.strip()
        lookup = name.endswith(LOOKUP_SUFFIX)
        name = name.removesuffix(LOOKUP_SUFFIX)
        shape, _, k = name.partition("-")
        if name == "plain":
            return cls(heads=1, shape=Shape.CHAIN, lookup=lookup)
        if shape in list(Shape) and not k:
            return cls(shape=Shape(shape), lookup=lookup)
        if shape in (Shape.CHAIN, Shape.TREE) and (k == "all" or k.isdigit() and int(k) >= 1):
            return cls(heads=k if k == "all" else int(k), shape=Shape(shape), lookup=lookup)
        raise ValueError(f"{text!r} is not a draft; use plain, auto, chain, tree, chain-K or tree-K "
                         f"(K a number of heads or all), each maybe with {LOOKUP_SUFFIX}")

    def __str__(self) -> str:
        if self.heads == 1:
            name = "plain"
        else:
            name = str(self.shape) if self.heads is None else f"{self.shape}-{self.heads}"
        return name + LOOKUP_SUFFIX if self.lookup else name

    def for_model(self, n_future: int) -> Draft:
        """This draft for a model of n_future heads ("all" resolved): the one check of the head count."""
        heads = n_future if self.heads == "all" else self.heads
        if heads is not None and heads > n_future:
            raise ValueError(f"heads={heads} is not allowed; the model has {n_future} heads (1..{n_future})")
        return dataclasses.replace(self, heads=heads) if heads != self.heads else self

    def capped(self, n_future: int) -> Draft:
        """This draft with more heads than the model has run as all of them (a benchmark mode)."""
        return dataclasses.replace(self, heads="all") if isinstance(self.heads, int) and self.heads > n_future else self

    # --- what the decoder does with it (heads resolved by `for_model`) ------------------------

    def trees(self, greedy: bool) -> bool:
        """Whether passes may draft trees: greedy only, never under chain, and with fixed heads
        only under tree."""
        return greedy and self.shape is not Shape.CHAIN and (self.heads is None or self.shape is Shape.TREE)

    def adapts(self, greedy: bool) -> bool:
        """Whether passes are chosen from the acceptance profile and the measured pass costs
        (re-planned as they change, and calibrating the costs); else every pass is the fixed
        chain of `heads`, and decoding never waits for costs to be measured."""
        return self.heads is None or self.trees(greedy)

    def max_depth(self, n_future: int) -> int:
        """Depths a pass may draft (the length of the acceptance statistics)."""
        return 0 if self.heads == 1 else (self.heads or n_future) - 1


# what `bench decode` compares with plain decoding by default, and their names (`--draft`)
BENCHMARK_DRAFTS = (Draft(), Draft(2, Shape.CHAIN), Draft(4, Shape.CHAIN), Draft("all", Shape.CHAIN),
                    Draft(4, Shape.TREE), Draft("all", Shape.TREE))
DECODE_MODES = tuple(str(d) for d in BENCHMARK_DRAFTS)
# the fixed drafts whose bytes per pass evaluation measures (a chain and a tree of all heads)
EVALUATED_DRAFTS = (Draft("all", Shape.CHAIN), Draft("all", Shape.TREE))
