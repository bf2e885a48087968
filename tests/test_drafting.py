"""Cost-aware drafting and tree drafts (bytemtp.decoding.drafting), each against its slow reference:
plain greedy decoding (`decode.generate`), which knows nothing of drafts, trees or costs."""

import pytest
import torch
from doubles import CPU_LIKE, FITTED, FLAT, SONGS, TEXT, ScriptedModel, fitted_model, generate_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytemtp.decoding import decode, loop
from bytemtp.decoding.drafting import (EXPLORE_PASSES, MAX_BACKOFF, PLAIN_WINDOWS, PLAN_PASSES, REMEASURE,
                                      AcceptanceProfile, Arbiter, Choice,
                                      DraftTree, PassCosts, best_tree, choose)
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

class _Clock:
    """Time that passes only inside the model's passes, as much as the given costs say a pass costs:
    the arbiter's windows measure those costs whatever else loads the machine."""
    now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def scripted_time(monkeypatch):
    """`timed(model, costs)`: the model's passes advance a fake clock that decoding reads."""
    clock = _Clock()
    monkeypatch.setattr(decode, "time", clock)
    monkeypatch.setattr(loop, "time", clock)

    def timed(model, costs):
        passes = model.logits

        def logits(ids, cache, heads=None, **kw):
            clock.now += costs.predicted(heads or model.config.n_future, ids.shape[1])
            return passes(ids, cache, heads, **kw)

        model.logits = logits
        return model
    return timed


def test_auto_settles_on_plain_decoding_when_drafts_are_never_right(scripted_time):
    plain = decode.generate(ScriptedModel(TEXT * 4, lambda j: False), b"", max_bytes=100)
    model = scripted_time(ScriptedModel(TEXT * 4, lambda j: False), CPU_LIKE)
    got = generate_batch(model, [b""], max_bytes=100, draft="chain", costs=CPU_LIKE)[0]
    assert got.output == plain.output
    used = got.stats.heads_used
    assert used.get(1, 0) >= 0.8 * sum(used.values())  # a few exploring passes, then plain
    assert got.stats.forward_passes <= plain.stats.forward_passes


def test_auto_drafts_long_chains_when_drafts_are_always_right(scripted_time):
    model = scripted_time(ScriptedModel(TEXT * 3, lambda j: True), FLAT)
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


# --- the arbiter: plain decoding against speculation, on what each delivered ---------------------

def _windows(arbiter, n, rate_of, *, plain_s=1.0, rewarm_s=0.0):
    """n windows, each running what the arbiter says; a window of p passes lasts p * plain_s
    seconds and delivers `rate_of(speculative)` bytes a row a second (a switch to speculation
    costs `rewarm_s` more); the arms each window ran."""
    arms, speculating = [], False
    for _ in range(n):
        spec, passes = arbiter.arm()
        seconds = passes * plain_s
        arbiter.record(speculative=spec, rate=rate_of(spec), seconds=seconds,
                       rewarm_s=rewarm_s if spec and not speculating else 0.0)
        arms.append(spec)
        speculating = spec
    return arms


def test_plain_decoding_is_measured_first_and_speculation_that_wins_runs_on():
    arbiter, P = Arbiter(), PLAIN_WINDOWS
    arms = _windows(arbiter, 24, lambda spec: 2.0 if spec else 1.0, rewarm_s=3.0)
    assert arms[:P] == [False] * P and all(arms[P:P + REMEASURE])  # plain measured, speculation tried, then kept
    assert arms[P + REMEASURE] is False and all(arms[P + REMEASURE + 1:P + 2 * REMEASURE + 1])  # plain measured again
    assert arbiter.winning and arbiter.balance_s > 0


def test_no_one_plain_window_sets_the_plain_figure():
    """The median of the last three plain windows: one read at half speed (a busy moment) moves
    nothing, so a speculator at 0.9x plain is not judged a winner on it."""
    arbiter = Arbiter()
    for rate in (0.5, 1.0, 1.0):
        arbiter.record(speculative=False, rate=rate, seconds=4.0)
    assert arbiter.plain == 1.0
    arbiter.record(speculative=True, rate=0.9, seconds=4.0)
    assert not arbiter.winning and arbiter.balance_s < 0
    arbiter.record(speculative=False, rate=3.0, seconds=4.0)  # nor one fast window
    assert arbiter.plain == 1.0


def test_a_lost_try_holds_the_next_back_for_a_bounded_while():
    """One unlucky try (a slide inside it) costs a winner at most a plain window before the next
    try, not the loss over the budget (100 times it here); tries that go on losing wait 1, 2, 4, 8 windows."""
    arbiter = Arbiter(budget=0.01)  # the loss over the budget: 300 seconds, 19 plain windows
    for _ in range(PLAIN_WINDOWS):
        arbiter.record(speculative=False, rate=1.0, seconds=16.0)
    arbiter.balance_s = 100.0  # credit enough that the budget is no bound here
    arbiter.record(speculative=True, rate=0.25, seconds=4.0)  # lost 3 seconds
    assert arbiter.losses == 1 and arbiter.arm() == (False, PLAN_PASSES)
    arbiter.record(speculative=False, rate=1.0, seconds=16.0)  # one plain window later
    assert arbiter.arm() == (True, EXPLORE_PASSES)
    waits = []
    for _ in range(6):  # losing again and again: the waits double up to MAX_BACKOFF windows
        arbiter.record(speculative=True, rate=0.25, seconds=4.0)
        n = 0
        while not arbiter.arm()[0]:
            arbiter.record(speculative=False, rate=1.0, seconds=16.0)
            n += 1
        waits.append(n)
    assert waits == [2, 4, 8, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]


def test_what_speculation_costs_outside_its_windows_is_charged():
    """Calibration, prefills of every head and a call's short last window count in the balance."""
    arbiter = Arbiter()
    arbiter.charge(2.0)
    assert arbiter.balance_s == -2.0 and arbiter.total_s == 2.0
    for _ in range(PLAIN_WINDOWS):
        arbiter.record(speculative=False, rate=1.0, seconds=4.0)
    arbiter.record(speculative=True, rate=0.5, seconds=2.0, short=True)  # 1 second lost, judged on nothing else
    assert arbiter.balance_s == -3.0 and not arbiter.specs and arbiter.losses == 0
    costs = PassCosts(dict(CPU_LIKE.table))
    costs.setup_s = 1.5
    assert costs.arbiter(True, False).balance_s == -1.5  # the first arbiter made pays the calibration
    assert costs.arbiter(False, True).balance_s == 0.0 and costs.arbiter(True, False) is not costs.arbiter(True, True)


def test_a_calibration_that_took_long_holds_no_try_back():
    """Measuring the pass costs is spent whatever comes next: it counts in the balance, but a try may
    still risk the budget (a good speculator is found after it); a prefill of every head, which
    speculation keeps paying, holds tries back as any loss does."""
    for sunk, tries in ((True, True), (False, False)):
        arbiter = Arbiter()
        arbiter.charge(30.0, sunk=sunk)
        for _ in range(PLAIN_WINDOWS):
            arbiter.record(speculative=False, rate=1.0, seconds=16.0)
        assert arbiter.balance_s == -30.0 and arbiter.arm()[0] is tries
        assert arbiter.may_go_on(1.0) is tries and arbiter.holds_back() is not tries


def test_speculation_that_never_pays_costs_at_most_the_budget():
    """Tried again as the budget allows (so heads that start to pay are found), never costing plain
    decoding more than the budget and one try."""
    arbiter = Arbiter(budget=0.02)
    arms = _windows(arbiter, 400, lambda spec: 0.5 if spec else 1.0, rewarm_s=2.0)
    tries = sum(arms)
    assert tries >= 3  # tried again, not given up for ever
    worst_try = EXPLORE_PASSES * 0.5 + 2.0  # a try's seconds lost against plain decoding
    assert -arbiter.balance_s <= 0.02 * arbiter.total_s + worst_try
    gaps = [b - a for a, b in zip([i for i, a in enumerate(arms) if a], [i for i, a in enumerate(arms) if a][1:])]
    assert min(gaps) > 1  # a loss is not tried again at once


def test_heads_that_start_to_pay_are_found_again():
    arbiter, late = Arbiter(budget=0.02), {"pays": False}
    _windows(arbiter, 100, lambda spec: 0.5 if spec else 1.0)
    late["pays"] = True
    arms = _windows(arbiter, 200, lambda spec: (2.0 if late["pays"] else 0.5) if spec else 1.0)
    first = arms.index(True)
    assert first < 60 and sum(arms[first:]) >= len(arms[first:]) * REMEASURE / (REMEASURE + 1) - 1  # found, then kept


def test_choose_speculates_as_the_arbiter_says_with_the_best_shape_that_drafts():
    good = AcceptanceProfile(8, prior=[0.9] * 7)
    arbiter = Arbiter()
    first = choose(good, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter)
    assert first.heads > 1 and first.passes == EXPLORE_PASSES  # promising: tried first, briefly
    arbiter.record(speculative=True, rate=2.0, seconds=4.0)
    for _ in range(PLAIN_WINDOWS):  # then plain is measured, nothing drafted at all
        plain = choose(good, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter, lookup=True)
        assert plain.heads == 1 and not plain.lookup and plain.passes == EXPLORE_PASSES
        arbiter.record(speculative=False, rate=1.0, seconds=4.0)  # ... and the try judged: it won
    kept = choose(good, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter)
    assert kept.heads > 1 and kept.tree.T > 1 and kept.passes == PLAN_PASSES and arbiter.balance_s > 0

    arbiter = Arbiter()
    bad = AcceptanceProfile(8, prior=[0.01] * 7)  # heads that seem never right: plain first
    assert choose(bad, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter).heads == 1
    for _ in range(PLAIN_WINDOWS):
        arbiter.record(speculative=False, rate=1.0, seconds=4.0)
    assert choose(bad, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter, lookup=True).lookup  # lookup may try
    assert choose(bad, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter).heads == 1  # a try would cost
    tried = choose(good, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter)
    assert tried.heads > 1 and tried.passes == EXPLORE_PASSES  # a promising try costs nothing expected
    arbiter.record(speculative=True, rate=0.5, seconds=4.0, rewarm_s=1.0)  # it lost
    assert choose(good, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter).heads == 1  # one budget for every shape
    arbiter.record(speculative=False, rate=1.0, seconds=400.0)  # ... until the budget allows a try again
    assert choose(bad, CPU_LIKE, max_heads=8, tree=False, arbiter=arbiter).heads >= 2


def test_a_window_records_what_its_plan_delivered_over_the_loop_s_whole_time():
    """`loop.Window`: bytes the rows emitted, per row live when it opened, over the wall time
    between two re-plans (its re-warms and the passes that compiled a shape apart), into the costs'
    arbiter; nothing for a window of fewer than 4 passes."""
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
    costs.arbiter().record(speculative=False, rate=1.0, seconds=1.0)
    window = Window(state, chain)
    t0 = time.perf_counter()
    for row in state.rows:
        row.out.data += b"abcdef"
    window.passes, window.rewarm_s = 4, 0.02
    time.sleep(0.05)
    window.close(state)
    seconds = time.perf_counter() - t0 - 0.02
    assert costs.arbiter().specs[-1] == pytest.approx(6 / seconds, rel=0.2)  # its re-warm apart
    assert costs.arbiter().total_s == pytest.approx(1.0 + seconds + 0.02, rel=0.2)
    state, costs = batch()
    window = Window(state, chain)
    window.passes = 3
    window.close(state)
    assert costs.arbiter().total_s > 0 and not costs.arbiter().specs  # too few passes to judge: counted only
    state, costs = batch()
    window = Window(state, chain)
    for row in state.rows:
        row.out.data += b"abcdef"
    window.passes = 4
    time.sleep(0.05)
    state.compile_s += 0.03  # a pass that compiled a shape: its seconds are no rate
    window.close(state)
    assert costs.arbiter().specs[-1] == pytest.approx(6 / (time.perf_counter() - window.t0 - 0.03), rel=0.25)
