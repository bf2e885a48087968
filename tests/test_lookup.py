"""Prompt-lookup drafts (`bytemtp.decoding.lookup`): the matcher against a brute-force reference,
the lookup profile, and the choice of a pass's tree and of each row's source."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bytemtp.decoding.drafting import MAX_NODES, AcceptanceProfile, DraftTree, PassCosts, accepted_run
from bytemtp.decoding.lookup import (LookupProfile, Match, RowDraft, chain_length, extended, find,
                                     plan_pass, substitute)


def _reference(history: bytes, max_draft: int, lo: int = 2, hi: int = 8) -> Match | None:
    """The longest suffix (hi down to lo bytes) with an earlier occurrence, at the latest one."""
    n = len(history)
    for m in range(min(hi, n - 1), lo - 1, -1):
        for start in range(n - m - 1, -1, -1):  # an occurrence ending before the last byte
            if history[start:start + m] == history[n - m:]:
                return Match(m, history[start + m:start + m + max_draft])
    return None


def test_no_match():
    assert find(b"") is None and find(b"a") is None and find(b"abcdefg") is None
    assert find(b"abcab"[:-1]) is None  # "abca": the 2-byte suffix "ca" never occurs earlier
    assert find(b"xyxab", min_ngram=3) is None  # only a 2-byte match ("ab" is new, "x" too short)


def test_the_longest_suffix_wins_over_a_later_shorter_one():
    history = b"abcd1" + b"..cd2" + b"abcd"
    assert find(history) == Match(4, b"1..cd2abcd"[:15])


def test_the_latest_occurrence_wins():
    assert find(b"ab1ab2ab") == Match(2, b"2ab")
    assert find(b"xab1xab2xab", max_draft=1) == Match(3, b"2")


def test_the_draft_stops_at_the_end_of_the_bytes_and_at_max_draft():
    assert find(b"abXYab") == Match(2, b"XYab")
    assert find(b"abXYab", max_draft=3) == Match(2, b"XYa")
    assert find(b"aaaa") == Match(3, b"a")  # overlapping: the latest earlier "aaa" ends one byte before
    assert find(b"0123456789" * 2) == Match(8, b"0123456789")  # a suffix of 8 bytes at most


@settings(max_examples=300, deadline=None)
@given(history=st.binary(max_size=60).map(lambda b: bytes(x % 4 for x in b)), max_draft=st.integers(1, 6))
def test_find_equals_the_brute_force_reference(history, max_draft):
    assert find(history, max_draft=max_draft) == _reference(history, max_draft)


def test_the_lookup_profile_learns_by_match_length_and_depth():
    lookups = LookupProfile()
    short, long = Match(2, b"abcdef"), Match(8, b"abcdef")
    before = lookups.expected(long, 6)
    assert before[0] == 0.0 and len(before) == 7 and before == sorted(before)
    assert len(lookups.expected(long, 20)) == 7  # no deeper than the draft
    for _ in range(50):
        lookups.record(short, offered=6, accepted=0)
        lookups.record(long, offered=6, accepted=6)
    assert lookups.expected(short, 6)[-1] < 0.1 < 5.0 < lookups.expected(long, 6)[-1]
    lookups.record(long, offered=3, accepted=3)  # nothing deeper than offered was tried
    assert lookups.by_length[8].trials[3] < lookups.by_length[8].trials[2]


def test_extended_deepens_the_top_rank_chain():
    tree = DraftTree.from_paths([(0,), (1,), (0, 0)])
    deeper = extended(tree, 5)
    assert chain_length(tree) == 2 and chain_length(deeper) == 5 and deeper.T == tree.T + 3
    assert sorted(zip(deeper.depths, deeper.ranks)) == sorted([(0, 0), (1, 0), (1, 1), (2, 0), (3, 0), (4, 0), (5, 0)])
    assert extended(DraftTree.chain(0), 3) == DraftTree.chain(3)
    wide = DraftTree.from_paths([(0,)] + [(r,) for r in range(1, 8)] + [(0, r) for r in range(7)])  # 15 nodes
    assert extended(wide, 4) == DraftTree.chain(4)  # no room: a plain chain


_FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})
_STEEP = PassCosts({(1, 1): 1.0, (1, 16): 16.0, (8, 1): 1.0, (8, 16): 16.0})


def test_plan_pass_deepens_the_chain_for_a_long_match_when_it_pays():
    heads, lookups = AcceptanceProfile(4), LookupProfile()
    tree = DraftTree.chain(3)
    match = RowDraft(limit=100, heads_depth=3, heads=heads, match=Match(8, bytes(range(12))))
    plain = RowDraft(limit=100, heads_depth=3, heads=heads, match=None)
    got, uses = plan_pass(tree, [match, plain, None], heads=4, costs=_FLAT, lookups=lookups)
    assert got.is_chain and got.depth == 12 and uses == [True, False, False]
    got, uses = plan_pass(tree, [match, plain], heads=4, costs=_STEEP, lookups=lookups)
    assert got.depth < 12  # sixteen nodes cost sixteen plain passes: not worth it
    got, uses = plan_pass(tree, [match, plain], heads=4, costs=None, lookups=lookups)
    assert got == tree and uses == [True, False]  # no costs: the heads' tree, lookup bytes in its chain


def test_plan_pass_keeps_the_heads_where_they_promise_more():
    heads, lookups = AcceptanceProfile(4, prior=[0.99] * 3, strength=100.0), LookupProfile()
    for _ in range(50):
        lookups.record(Match(2, b"xyz"), offered=3, accepted=0)
    row = RowDraft(limit=100, heads_depth=3, heads=heads, match=Match(2, b"xyz"))
    got, uses = plan_pass(DraftTree.chain(3), [row], heads=4, costs=_FLAT, lookups=lookups)
    assert got == DraftTree.chain(3) and uses == [False]


def test_substitute_and_accepted_run():
    cand = [[1, 2], [3, 4]]
    assert substitute(cand, b"\x09\x08\x07", 4, filler=0) == [[9, 2], [8, 4], [7], [0]]
    assert substitute(cand, None, 3, filler=5) == [[1, 2], [3, 4], [5]]
    assert substitute(cand, b"\x09", 2, filler=0) == [[9, 2], [3, 4]]
    tree = DraftTree.from_paths([(0,), (0, 0), (0, 0, 0), (1,)])
    top = [i for i, r in enumerate(tree.ranks) if r == 0]
    assert accepted_run(top, tree, 3) == 3 and accepted_run(top, tree, 2) == 2
    assert accepted_run([0, tree.ranks.index(1)], tree, 3) == 0
    assert MAX_NODES == 16


def test_find_on_tens_of_kb():
    history = random.Random(0).randbytes(30_000)
    got = find(history + history[100:130])
    assert got is not None and got.length == 8 and got.draft == history[130:145]
