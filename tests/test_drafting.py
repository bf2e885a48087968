"""Cost-aware drafting and tree drafts (bytemtp.decoding.drafting), each against its slow reference:
plain greedy decoding (`decode.generate`), which knows nothing of drafts, trees or costs."""

import pytest
import torch
from doubles import CPU_LIKE, FITTED, FLAT, SONGS, TEXT, ScriptedModel, fitted_model, generate_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import AcceptanceProfile, Choice, DraftTree, PassCosts, best_tree, choose
from bytemtp.decoding.strategy import Draft

pytestmark = pytest.mark.usefixtures("one_thread")


# --- the pieces ---------------------------------------------------------------------------------

def test_tree_from_paths_puts_the_top_chain_first_and_parents_before_children():
    tree = DraftTree.from_paths([(1,), (0,), (0, 0), (1, 0), (0, 1), (0, 0, 0)])
    assert tree.depths[:4] == (0, 1, 2, 3) and tree.ranks[:4] == (0, 0, 0, 0)
    assert all(p < i for i, p in enumerate(tree.parents) if i)
    see = tree.ancestors
    assert see.sum(1).tolist() == [d + 1 for d in tree.depths]  # each node sees its path
    assert tree.truncated(1).depths == (0, 1, 1)
    assert DraftTree.chain(3).is_chain and not tree.is_chain
    assert tree.describe() == "tree of 6 (2-3-1)"


def test_profile_learns_and_forgets_its_prior():
    profile = AcceptanceProfile(4)
    assert 0.5 < profile.p(1, 0) < 0.7
    for _ in range(50):
        profile.record(1, None)
    assert profile.p(1, 0) < 0.05
    for _ in range(200):
        profile.record(2, 1)
    assert profile.p(2, 1) > 0.9 and profile.p(2, 0) < 0.05


def test_best_tree_is_the_most_likely_prefix_closed_set():
    profile = AcceptanceProfile(4, strength=1.0, prior=[0.8, 0.5, 0.3])
    nodes = best_tree(profile, 3, 6, ranks=4)
    paths = [p for p, _ in nodes]
    assert paths[0] == (0,) and all(p[:-1] in paths or len(p) == 1 for p in paths)
    probs = [q for _, q in nodes]
    assert probs == sorted(probs, reverse=True)
    assert probs[1] == pytest.approx(0.8 * 0.5)


def test_choice_falls_back_to_plain_when_heads_are_never_right():
    profile = AcceptanceProfile(8)
    for depth in range(1, 8):
        for _ in range(100):
            profile.record(depth, None)
    got = choose(profile, CPU_LIKE, max_heads=8, tree=True)
    assert got.heads == 1 and got.tree.T == 1 and got.speedup == pytest.approx(1.0)


def test_choice_grows_with_acceptance_and_cheap_passes():
    good = AcceptanceProfile(8, prior=[0.9] * 7)
    assert choose(good, FLAT, max_heads=8, tree=False).tree.depth == 7  # free passes: draft all
    cpu = choose(good, CPU_LIKE, max_heads=8, tree=True)
    assert cpu.heads > 2 and cpu.speedup > 1.5
    assert choose(good, CPU_LIKE, max_heads=8, tree=False, heads=3).heads == 3


def test_pass_costs_interpolate():
    costs = PassCosts({(1, 1): 1.0, (1, 3): 2.0, (3, 1): 3.0, (3, 3): 5.0})
    assert costs(2, 2) == pytest.approx((1 + 2 + 3 + 5) / 4)
    assert costs(8, 8) == 5.0 and costs.ratio(3, 1) == 3.0


# --- cost-aware decoding against plain decoding --------------------------------------------------

def test_auto_settles_on_plain_decoding_when_drafts_are_never_right():
    plain = decode.generate(ScriptedModel(TEXT * 4, lambda j: False), b"", max_bytes=100)
    model = ScriptedModel(TEXT * 4, lambda j: False)
    got = generate_batch(model, [b""], max_bytes=100, draft="chain", costs=CPU_LIKE)[0]
    assert got.output == plain.output
    used = got.stats.heads_used
    assert used.get(1, 0) >= 0.8 * sum(used.values())  # a few exploring passes, then plain
    assert got.stats.forward_passes <= plain.stats.forward_passes


def test_auto_drafts_long_chains_when_drafts_are_always_right():
    model = ScriptedModel(TEXT * 3, lambda j: True)
    got = generate_batch(model, [b""], max_bytes=70, draft="chain", costs=FLAT)[0]
    assert got.output == (TEXT * 3)[:70]
    assert got.stats.bytes_per_forward > 5 and max(got.stats.heads_used) == 8


@pytest.mark.slow
@FITTED
def test_a_decoder_measures_costs_once_and_keeps_its_profile():
    model = fitted_model(0, "transformer")
    dec = decode.Decoder(model)
    a = dec.generate([b"one t"], max_bytes=30)[0]
    costs = dec.pass_costs(1)
    assert costs is dec.pass_costs(1) and costs(1, 1) > 0
    b = dec.generate([b"one t"], max_bytes=30)[0]
    c = dec.generate([b"one t"], max_bytes=30, draft=Draft(4))[0]  # drafts for sure: the profile learns
    assert a.output == b.output == c.output == decode.generate(model, b"one t", max_bytes=30).output
    assert sum(dec.profiles[True].trials) > 0


@pytest.mark.slow
@FITTED
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1), head_type=st.sampled_from(["transformer", "linear", "causal"]),
       prompts=st.lists(st.one_of(st.binary(max_size=30), st.sampled_from(SONGS)), min_size=1, max_size=3),
       mode=st.sampled_from([("auto", None), ("tree", 4), ("tree", 8), ("chain", None)]),
       costs=st.sampled_from([FLAT, CPU_LIKE]), max_bytes=st.integers(0, 30))
def test_tree_and_auto_greedy_equal_plain_greedy(seed, head_type, prompts, mode, costs, max_bytes):
    model = fitted_model(seed, head_type)
    draft, heads = mode
    batch = generate_batch(model, prompts, max_bytes=max_bytes, draft=Draft(heads, draft), costs=costs)
    for p, got in zip(prompts, batch):
        ref = decode.generate(model, p, max_bytes=max_bytes)
        assert (got.output, got.stats.stopped_by) == (ref.output, ref.stats.stopped_by)
        assert got.stats.forward_passes <= ref.stats.forward_passes + 0  # never more passes
        assert all(0 <= a <= d for a, d in zip(got.stats.accepted, got.stats.drafted))


@pytest.mark.slow
@FITTED
def test_trees_accept_more_bytes_per_pass_than_chains_on_a_fitted_model():
    model = fitted_model(1, "transformer")
    prompts = [b"one two", b"la la", b"0123", b"four five"]
    chain = generate_batch(model, prompts, max_bytes=40, draft=Draft(4))
    tree = generate_batch(model, prompts, max_bytes=40, draft=Draft(4, "tree"), costs=FLAT)
    assert [g.output for g in chain] == [g.output for g in tree]
    rate = lambda gens: sum(g.stats.bytes_out for g in gens) / sum(g.stats.forward_passes for g in gens)  # noqa: E731
    assert rate(tree) > rate(chain)  # here 160 bytes in 58 passes against 70: second guesses were right
    assert any(shape.startswith("tree") for g in tree for shape in g.stats.shapes)


# --- exploring: a shape that lost to plain decoding is tried again ---------------------------------

def _replans(costs, profile, n, rate_of):
    """Re-plan n times; after each, run the chosen shape's passes (16), whose true rate is
    `rate_of(k)` bytes a second; the re-plans that chose speculation."""
    spec = []
    for i in range(n):
        got = choose(profile, costs, max_heads=8, tree=False)
        seconds = costs.predicted(got.heads, got.tree.T)
        for _ in range(16):
            costs.observe(got.heads, got.tree.T, seconds, bytes_per_row=rate_of(got.heads) * seconds)
        if got.heads > 1:
            spec.append(i)
    return spec


def _lost_once():
    costs = PassCosts(dict(CPU_LIKE.table))
    profile = AcceptanceProfile(8, prior=[0.9] * 7)
    got = choose(profile, costs, max_heads=8, tree=False)
    assert got.heads > 1
    costs.realized[1, 1], costs.realized[got.heads, got.tree.T] = 1.0, 0.5  # it ran slowly once
    return costs, profile


def test_the_chooser_retries_a_lost_shape_less_often_as_losses_accumulate():
    costs, profile = _lost_once()
    spec = _replans(costs, profile, 100, lambda k: 1.0 if k == 1 else 0.8)  # it keeps losing
    gaps = [b - a for a, b in zip(spec, spec[1:])]
    assert spec[0] <= 3 and len(spec) >= 4  # retried soon, and again
    assert gaps == sorted(gaps) and gaps[-1] >= 4 * gaps[0]  # ever less often
    assert len(spec) <= 8  # a shape that keeps losing costs few passes


def test_the_chooser_settles_on_a_shape_that_has_become_better():
    costs, profile = _lost_once()
    spec = _replans(costs, profile, 40, lambda k: 1.0 if k == 1 else 2.0)  # now it wins
    assert spec[0] <= 3 and spec == list(range(spec[0], 40))  # retried, then kept
    assert not costs.retries.losses


def test_after_a_loss_a_shape_with_no_figure_of_its_own_waits_for_the_retry_too():
    """One back-off for all speculation: when the shape that ran lost, the next shape the chooser
    prefers (which has never run) does not run at once, but at the retry."""
    costs, _ = _lost_once()
    lost = next(key for key in costs.realized if key != (1, 1))
    other = AcceptanceProfile(8, prior=[0.9, 0.9] + [0.01] * 5)  # now a short chain is best
    shapes = []
    for _ in range(4):
        got = choose(other, costs, max_heads=8, tree=False)
        shapes.append(got.heads)
    assert shapes[0] == 1  # waits, though its own shape never lost
    spec = [k for k in shapes if k > 1]
    assert spec and costs._key(spec[0], spec[0]) != lost  # the retry runs the shape preferred now


def test_a_window_records_what_its_plan_delivered_over_the_loop_s_whole_time():
    """`loop.Window`: bytes the rows emitted, per row live when it opened, over the wall time
    between two re-plans, into the costs' realized rate of the plan's shape; nothing for a window
    that compiled a shape or ran fewer than 4 passes."""
    import time

    from bytemtp.decoding.batch import Batch, Row
    from bytemtp.decoding.generation import Output, SpeculativeStats
    from bytemtp.decoding.loop import Window
    from bytemtp.model.kvcache import KVCache

    def batch():
        rows = [Row(b"p", Output(SpeculativeStats(), max_bytes=100, stop=(), on_bytes=None)) for _ in range(2)]
        costs = PassCosts(dict(CPU_LIKE.table))
        cache = KVCache(n_layers=1, batch_size=2, max_len=8, n_attn_heads=1, head_dim=2, device="cpu",
                        dtype=torch.float32)
        return Batch(rows, cache, warm=8, n_future=8, profiles=None, costs=costs), costs

    chain = Choice(4, DraftTree.chain(3), 2.0, 1.5)
    state, costs = batch()
    window = Window(state, chain)
    t0 = time.perf_counter()
    for row in state.rows:
        row.out.data += b"abcdef"
    window.passes = 4
    time.sleep(0.05)
    window.close(state)
    seconds = time.perf_counter() - t0
    assert costs.realized[costs._key(4, 4)] == pytest.approx(6 / seconds, rel=0.2)
    assert costs.runs[costs._key(4, 4)] == 1
    for compiled, passes in ((True, 4), (False, 3)):
        state, costs = batch()
        window = Window(state, chain)
        state.compiled, window.passes = compiled, passes
        window.close(state)
        assert not costs.realized
