"""The draft strategy as a typed value: one name per strategy, and what the decoder reads from it."""

import dataclasses
import subprocess
import sys

import pytest

from bytemtp.decoding.strategy import BENCHMARK_DRAFTS, DECODE_MODES, EVALUATED_DRAFTS, Draft, Shape

EVERY_DRAFT = [Draft(heads, shape) for heads in (None, 1, 2, 3, 4, 8, "all") for shape in Shape]


@pytest.mark.parametrize("draft", EVERY_DRAFT, ids=str)
def test_every_strategy_round_trips_through_its_name(draft):
    assert Draft.parse(str(draft)) == draft
    assert str(Draft.parse(str(draft))) == str(draft)


def test_the_names_are_those_of_the_benchmark_modes():
    assert {str(d) for d in EVERY_DRAFT} == {"auto", "chain", "tree", "plain", "chain-2", "chain-3", "chain-4",
                                             "chain-8", "chain-all", "tree-2", "tree-3", "tree-4", "tree-8",
                                             "tree-all"}
    assert DECODE_MODES == ("auto", "chain-2", "chain-4", "chain-all", "tree-4", "tree-all")
    assert DECODE_MODES == tuple(str(d) for d in BENCHMARK_DRAFTS)
    assert [str(d) for d in EVALUATED_DRAFTS] == ["chain-all", "tree-all"]
    assert [str(s) for s in Shape] == ["auto", "chain", "tree"]  # generate --draft


def test_a_value_is_normalised_to_the_strategy_it_runs():
    assert Draft(4) == Draft(4, "chain") == Draft.parse("chain-4")  # fixed heads under auto: chains
    assert Draft(1, "tree") == Draft.plain() == Draft.parse("tree-1") == Draft.parse("plain")
    assert Draft(4, "chain").shape == "chain" and Draft(None, "auto").shape is Shape.AUTO


def test_what_the_decoder_reads_from_a_strategy():
    auto, chains, tree_all = Draft(), Draft(shape="chain"), Draft("all", "tree").for_model(8)
    assert auto.trees(True) and not auto.trees(False) and auto.adapts(False)
    assert not chains.trees(True) and chains.adapts(True)
    assert tree_all == Draft(8, "tree") and tree_all.trees(True) and tree_all.adapts(True)
    assert not tree_all.trees(False) and not tree_all.adapts(False)  # sampling drafts the fixed chain
    for fixed in (Draft(4, "chain"), Draft.plain()):
        assert not fixed.trees(True) and not fixed.adapts(True)
    assert [d.max_depth(8) for d in (auto, Draft.plain(), Draft(4))] == [7, 0, 3]
    assert Draft(16, "tree").capped(8) == Draft("all", "tree") and Draft(4).capped(8) == Draft(4)


def test_bad_strategies_name_what_is_allowed():
    with pytest.raises(ValueError, match="chain-K or tree-K"):
        Draft.parse("auto-4")
    with pytest.raises(ValueError, match="choose auto, chain or tree"):
        Draft(2, "bush")
    with pytest.raises(ValueError, match="the model has 8 heads"):
        Draft(9).for_model(8)


def test_the_strategy_needs_no_torch():
    """The CLI reads it when it builds its options."""
    code = "import sys, bytemtp.decoding.strategy; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lookup_drafts_are_named_with_a_suffix():
    for draft in EVERY_DRAFT:
        both = dataclasses.replace(draft, lookup=True)
        assert Draft.parse(str(both)) == both and str(both) == str(draft) + "+lookup"
    assert Draft.parse("auto+lookup") == Draft(lookup=True) and Draft.parse("plain+lookup").heads == 1
    assert Draft(99, "tree", lookup=True).capped(8) == Draft("all", "tree", lookup=True)
    assert Draft("all", lookup=True).for_model(8) == Draft(8, lookup=True)
    with pytest.raises(ValueError, match="lookup"):
        Draft.parse("lookup")
