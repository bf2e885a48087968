"""The static decode step (bytemtp.decoding.compiled) against its references: the eager
`ByteMTP.logits` pass, and plain greedy decoding; compiled and uncompiled, on a fitted model whose
drafts are accepted. Also when `auto` compiles (README's thresholds), and the compile-cost record:
no content of the compile cache breaks decoding."""


import json
import pathlib
import re
import threading
import types

import pytest
import torch
from doubles import FITTED, FLAT, SONGS, fitted_model, seeded_sampling, tiny_model

from bytemtp.decoding import decode
from bytemtp.decoding import calibration
from bytemtp.decoding.calibration import compile_shapes
from bytemtp.decoding.compiled import (Compile, CompilePolicy, StaticStep, cached_costs, head_bucket, head_buckets, node_bucket,
                                      record_costs, record_path, worth_compiling)
from bytemtp.decoding.drafting import DraftTree, PassCosts
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft, Shape
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.model.pass_heads import HeadsInTurn
from bytemtp.vocab import EOS

COMPILED = pytest.mark.xdist_group("processes")  # not beside the torchrun tests (see test_distributed)


def _model(head_type="transformer", seed=0, dtype=torch.float64, **kw) -> ByteMTP:
    return tiny_model(seed, head_type=head_type, **kw).to(dtype).eval()


def test_buckets():
    assert [node_bucket(T) for T in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    assert head_buckets(8) == (1, 2, 4, 8) and head_buckets(6) == (1, 2, 4, 6) and head_buckets(1) == (1,)
    assert [head_bucket(k, 8) for k in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_compile_modes_and_when_auto_compiles():
    assert Compile.parse("on") is Compile.ON and Compile.parse(False) is Compile.OFF
    with pytest.raises(ValueError, match="compile='fast' is not allowed; choose auto, on or off"):
        Compile.parse("fast")
    cpu = torch.device("cpu")
    assert worth_compiling(Compile.ON, device=cpu, work_bytes=1, ready=False)
    assert not worth_compiling(Compile.OFF, device=cpu, work_bytes=10**9, ready=True)
    assert worth_compiling(Compile.AUTO, device=cpu, work_bytes=1000, ready=True)  # compiled already: cheap


def _documented_thresholds() -> dict[str, int]:
    """What README.md says `auto` compiles from, in bytes of output by device type."""
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    found = re.search(r"\((\d+) KB of output on a\s+CPU, (\d+) KB on a GPU\)", readme)
    assert found, "README.md no longer says when auto compiles"
    return {"cpu": int(found[1]) * 1024, "cuda": int(found[2]) * 1024}


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # a cuda device object: nothing runs on it
def test_auto_compiles_from_the_documented_output(device, monkeypatch):
    """`auto` at README.md's thresholds (32 KB of output on a CPU, 8 KB on a GPU), one byte
    short of them and past them, through `worth_compiling` and a policy's `settle` (which fixes
    the mode for the job); never under TORCHDYNAMO_DISABLE=1, even when the step is compiled."""
    least = _documented_thresholds()[device]
    dev = torch.device(device)
    for work, want in ((least - 1, False), (least, True), (10 * least, True), (1, False)):
        assert worth_compiling(Compile.AUTO, device=dev, work_bytes=work, ready=False) is want, work
        config = _model().config  # a model that says it lives on the device (only its shape is read)
        model = types.SimpleNamespace(config=config, embed=types.SimpleNamespace(
            weight=types.SimpleNamespace(device=dev, dtype=torch.float32)))
        policy = CompilePolicy(model, HeadsInTurn(model))
        assert policy.settle(batch_size=1, work_bytes=work) is want, work
        assert policy.mode is (Compile.ON if want else Compile.OFF)
        assert policy.worth(1, 10**9 if not want else 1) is want  # settled: the job's share does not matter
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    for ready in (False, True):
        assert not worth_compiling(Compile.AUTO, device=dev, work_bytes=10**9, ready=ready)
    assert worth_compiling(Compile.ON, device=dev, work_bytes=1, ready=False)  # asked for: the step runs
    policy = CompilePolicy(model, HeadsInTurn(model))
    assert not policy.settle(batch_size=1, work_bytes=10 * least) and policy.mode is Compile.OFF


def test_settle_on_a_decoders_compile_policy(monkeypatch):
    """`Decoder.policy.settle` decides once for a job: a short one stays eager whatever its
    calls ask, a long one (or one whose step is recorded as compiled) runs the static step."""
    model = _model()
    least = _documented_thresholds()["cpu"]
    short = decode.Decoder(model)
    assert not short.policy.settle(batch_size=2, work_bytes=least - 1) and short.policy.mode is Compile.OFF
    assert not short.policy.use(2, max_bytes=least) and short.policy.static is None
    long = decode.Decoder(model)
    assert long.policy.settle(batch_size=2, work_bytes=least) and long.policy.mode is Compile.ON
    assert long.policy.use(2, max_bytes=1) and long.policy.static is not None and long.policy.static.compiled
    record_costs(model.decode_heads(), batch_size=2, costs_ms=_GOOD)
    assert decode.Decoder(model).policy.settle(batch_size=2, work_bytes=1)  # compiled already
    assert not decode.Decoder(model).policy.settle(batch_size=3, work_bytes=1)
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    assert not decode.Decoder(model).policy.settle(batch_size=2, work_bytes=10 * least)


def test_stepwise_costs_charge_the_bucket_a_pass_runs_as():
    table = {(k, T): k * 1.0 + T * 0.1 for k in (1, 2, 4, 8) for T in (1, 2, 4, 8, 16)}
    smooth, step = PassCosts(table), PassCosts(table, stepwise=True)
    assert smooth(3, 3) == pytest.approx(3.3) and step(3, 3) == pytest.approx(4.4)
    assert step(4, 5) == step(4, 8) and step(8, 9) == step(8, 16)
    step.observe(3, 3, 9.0)  # a (3, 3) pass ran as (4, 4): it is what (4, 4) costs
    assert step(4, 4) == step(3, 4) == 9.0


@pytest.mark.parametrize("head_type,head_layers", [("transformer", 1), ("transformer", 2), ("causal", 1),
                                                   ("causal", 2), ("linear", 1)])  # linear heads have no layers
def test_static_step_equals_the_eager_pass(head_type, head_layers):
    """Chains and a tree, every bucket (padded or not), rows at different lengths: the static
    step's logits and cache writes equal the eager pass's."""
    model = _model(head_type, head_layers=head_layers, n_layers=2 + 8 * head_layers)
    stacked = model.decode_heads()
    step = StaticStep(model, stacked, compiled=False)
    tree = DraftTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    n = model.config.n_future
    max_len = model.config.seq_len + 16
    for lengths in ([9], [4, 11, 7]):
        B = len(lengths)
        caches = [KVCache.for_model(model, batch_size=B, max_len=max_len) for _ in range(2)]
        prompt = torch.randint(0, 256, (B, 12), generator=torch.Generator().manual_seed(B))
        for cache in caches:
            stacked.logits(prompt, cache, layout=build_layout(model, prompt, cache))
            cache.lengths = list(lengths)
        passes = [(1, 1, None), (2, 2, None), (4, 3, None), (n, 5, None), (n, 7, tree), (n, 16, None)]
        for heads, T, shape in passes:
            ids = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(T))
            kw = {} if shape is None else {"depths": list(shape.depths), "ancestors": shape.ancestors}
            want = stacked.logits(ids, caches[0], heads=heads,
                                layout=build_layout(model, ids, caches[0], drafts=True, **kw))
            got = step(ids, caches[1], heads=heads, **({} if shape is None else
                                                       {"depths": shape.depths, "ancestors": shape.ancestors}))
            assert got.shape == want.shape == (B, T, heads, want.shape[-1])
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
            assert caches[0].lengths == caches[1].lengths
            layers = model.config.trunk_layers + heads * model.config.layers_per_head
            for b in range(B):  # the slots this pass wrote, in the layers it ran
                end = caches[0].lengths[b]
                torch.testing.assert_close(caches[1].k[:layers, b, :, :end], caches[0].k[:layers, b, :, :end])
                torch.testing.assert_close(caches[1].v[:layers, b, :, :end], caches[0].v[:layers, b, :, :end])


def _prompts(seq_len: int) -> list[bytes]:
    """Rows at different lengths, one of them longer than the context (its window slides)."""
    return [b"def f(x):\n    return x", b"o", bytes(range(100, 100 + seq_len + 9)), b"la la la, la la lo\n"]


@pytest.mark.parametrize("head_type,extra", [("transformer", {}), ("transformer", {"value_embeds": 2}),
                                            ("transformer", {"ngram_embeds": 4, "ngram_rows": 64}),
                                            pytest.param("causal", {}, marks=pytest.mark.slow)])
def test_uncompiled_static_decoding_equals_plain_greedy(head_type, extra):
    """Also with value embeddings (model.value_embeds) and hashed n-grams (model.ngram_embeds): the
    static step's trunk looks up the pass's ids, and reads and writes the cache's ids, too."""
    model = _model(head_type, **extra)
    if extra:  # its random tables end every row early with EOS: made rare, the windows slide
        with torch.no_grad():
            for unembed in model.unembed:
                unembed.weight[EOS] = 0.0
    prompts = _prompts(model.config.seq_len)
    want = [decode.generate(model, p, max_bytes=70) for p in prompts]
    decoder = decode.Decoder(model, compile="on")
    decoder.policy.static = StaticStep(model, decoder.pass_heads, compiled=False)
    for kw in ({"draft": "plain"}, {"draft": Draft(3)}, {"draft": "tree-8"}, {}):
        got = decoder.generate(prompts, max_bytes=70, **kw)
        assert [g.output for g in got] == [w.output for w in want], kw
        assert [g.stats.stopped_by for g in got] == [w.stats.stopped_by for w in want]
    assert any(g.stats.slides for g in got)
    draws = []
    for d in (decoder, decode.Decoder(model, compile="off")):  # seeded sampling draws alike
        sampling = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(5))
        draws.append([g.output for g in d.generate(prompts, max_bytes=40, draft=Draft(4), sampling=sampling)])
    assert draws[0] == draws[1]


# --- a fitted model, whose drafts are accepted: chain, padded bucket and tree ----------------------

# A batch of rows at different lengths, the last sliding past the context of 64; three drafts of
# four heads: a chain that fills its bucket (4 nodes), one that is padded (3 nodes run as 4) and
# a tree of up to 16 nodes (every pass costs alike: the largest tree). Compiled, two graphs in all.
_FITTED_PROMPTS = [b"one two th", b"la la la, ", b"0123456789ab", SONGS[0] * 2]
_FITTED_DRAFTS = (Draft(4), Draft(3), Draft(4, Shape.TREE))


def _fitted_decoding_equals_plain_greedy(model, step: StaticStep) -> None:
    """The static step `step` decodes what plain greedy decoding does with each draft, the
    drafts accepted (more than 1.5 bytes a pass), and each of its passes, chain, padded and tree,
    gives the eager pass's logits and cache slots."""
    want = [decode.generate(model, p, max_bytes=60) for p in _FITTED_PROMPTS]
    decoder = decode.Decoder(model, costs=FLAT, compile="on")
    decoder.policy.static = step
    for draft in _FITTED_DRAFTS:
        got = decoder.generate(_FITTED_PROMPTS, max_bytes=60, draft=draft)
        assert [g.output for g in got] == [w.output for w in want], draft
        assert [g.stats.stopped_by for g in got] == [w.stats.stopped_by for w in want], draft
        per_pass = sum(g.stats.bytes_out for g in got) / sum(g.stats.forward_passes for g in got)
        assert per_pass > 1.5, (draft, per_pass)
    assert any(g.stats.slides for g in got)
    tree = DraftTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])
    assert tree.T == 9 and tree.depth == 4  # padded to 16 nodes
    for T, shape in ((4, None), (3, None), (tree.T, tree)):  # as decoding runs them: in inference mode
        _pass_equals_eager(model, step, heads=4, T=T, tree=shape, lengths=[20, 9, 33, 60 - T])


@torch.inference_mode()
def _pass_equals_eager(model, step: StaticStep, *, heads: int, T: int, tree: DraftTree | None,
                       lengths: list[int]) -> None:
    """One pass of the static step against the eager `ByteMTP.logits`, on rows at `lengths`:
    its logits and the cache slots it wrote."""
    B, stacked = len(lengths), step.pass_heads
    caches = [KVCache.for_model(model, batch_size=B, max_len=model.config.seq_len + 16) for _ in range(2)]
    prompt = torch.tensor([list((SONGS[0] * 2)[:max(lengths)])] * B)
    for cache in caches:
        stacked.logits(prompt, cache, layout=build_layout(model, prompt, cache))
        cache.lengths = list(lengths)
    ids = torch.tensor([list(b"o la")[:1] + list(SONGS[b % 3][:T - 1]) for b in range(B)])
    kw = {} if tree is None else {"depths": list(tree.depths), "ancestors": tree.ancestors}
    want = stacked.logits(ids, caches[0], heads=heads,
                        layout=build_layout(model, ids, caches[0], drafts=True, **kw))
    got = step(ids, caches[1], heads=heads, **({} if tree is None else
                                               {"depths": tree.depths, "ancestors": tree.ancestors}))
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    layers = model.config.trunk_layers + heads * model.config.layers_per_head
    for b, end in enumerate(caches[0].lengths):
        torch.testing.assert_close(caches[1].k[:layers, b, :, :end], caches[0].k[:layers, b, :, :end])
        torch.testing.assert_close(caches[1].v[:layers, b, :, :end], caches[0].v[:layers, b, :, :end])


@pytest.mark.slow
@FITTED
@pytest.mark.usefixtures("one_thread")
def test_uncompiled_static_decoding_of_a_fitted_model_equals_plain_greedy():
    model = fitted_model(0, "transformer")
    _fitted_decoding_equals_plain_greedy(model, StaticStep(model, model.decode_heads(), compiled=False))


@pytest.mark.slow
@COMPILED  # a fitted model of its own in this test process (the fit is made once a process)
@pytest.mark.usefixtures("one_thread")
def test_compiled_decoding_of_a_fitted_model_equals_plain_greedy_and_the_eager_pass():
    """Through inductor (two graphs): the fitted model's drafts accepted, on chain, padded and
    tree passes, output equal to plain greedy decoding and every pass to the eager one; seeded
    sampling draws what the eager step draws."""
    model = fitted_model(0, "transformer")  # float64: the seeded draws do not hinge on rounding
    step = StaticStep(model, model.decode_heads())
    _fitted_decoding_equals_plain_greedy(model, step)
    assert step.graphs == 2 and step.stats()["compile_s"] > 0, step.stats()
    draws = []
    for compile_mode in ("on", "off"):
        decoder = decode.Decoder(model, compile=compile_mode)
        decoder.policy.static = step if compile_mode == "on" else None
        draws.append([g.output for g in decoder.generate(_FITTED_PROMPTS, max_bytes=40, draft=Draft(4),
                                                         sampling=seeded_sampling(5))])
    assert draws[0] == draws[1] and step.graphs == 2


def test_costs_measured_on_the_static_step_serve_the_next_process(tmp_path, monkeypatch):
    """The chooser sees the static step's costs, by bucket; they are recorded beside the compile
    cache, and a later decoder of a model of the same shape takes them (and `auto` counts the
    step as compiled) instead of measuring again."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = _model()
    first = decode.Decoder(model, compile="on")
    first.policy.static = StaticStep(model, first.pass_heads, compiled=False)
    assert not first.policy.static.ready(2)
    costs = first.pass_costs(2, static=True)
    assert costs.stepwise and costs(3, 3) == costs(4, 4) and costs(1, 1) > 0
    assert costs is not first.pass_costs(2)  # the eager step's are its own

    def never(*args, **kw):
        raise AssertionError("measured again")

    monkeypatch.setattr(calibration, "measure_pass_costs", never)
    other = _model(seed=1)  # other weights, same shape: the same graphs
    later = decode.Decoder(other)  # auto
    assert later.policy.use(2, max_bytes=8)  # little work, but the step is compiled already
    assert later.pass_costs(2, static=True).to_dict() == costs.to_dict()
    assert not decode.Decoder(other).policy.use(3, max_bytes=8)  # another batch size is not


# --- the compile-cost record: no content of the cache breaks decoding ----------------------------


def _record(model, costs_ms: dict | None = None, **fields) -> dict:
    """A valid record of `model`'s step at batch size 2 (stacked heads), as `record_costs` writes
    it, with `fields` replaced."""
    path = record_path(model.decode_heads(), batch_size=2)
    record_costs(model.decode_heads(), batch_size=2, costs_ms=_GOOD if costs_ms is None else costs_ms)
    return {**json.loads(path.read_text()), **fields}


_COSTS = PassCosts({(k, T): 1.0 + k * 0.1 + T * 0.01 for k in (1, 2, 4, 8) for T in (1, 2, 4, 8, 16)},
                   stepwise=True)
_GOOD = _COSTS.to_dict()
BAD_RECORDS = {  # what a user's cache may hold, by what it does today
    "no costs": lambda m: _record(m, costs_ms={}),  # IndexError
    "a string cost": lambda m: _record(m, costs_ms={**_GOOD, "1x1": "0.5"}),  # TypeError
    "a bad key": lambda m: _record(m, costs_ms={**_GOOD, "one-by-one": 0.5}),  # ValueError
    "a list of costs": lambda m: _record(m, costs_ms=list(_GOOD.items())),  # AttributeError
    "a list": lambda m: [1, 2],
    "null": lambda m: None,
    "a cost of nan": lambda m: _record(m, costs_ms={**_GOOD, "2x4": float("nan")}),
    "a cost of zero": lambda m: _record(m, costs_ms={**_GOOD, "2x4": 0}),
    "a boolean cost": lambda m: _record(m, costs_ms={**_GOOD, "2x4": True}),
    "a grid point missing": lambda m: _record(m, costs_ms={k: v for k, v in _GOOD.items() if k != "4x8"}),
    "too few heads": lambda m: _record(m, costs_ms={k: v for k, v in _GOOD.items() if not k.startswith("8x")}),
    "another torch": lambda m: _record(m, key=[*_record(m)["key"][:3], "1.0.0", *_record(m)["key"][4:]]),
    "another CPU": lambda m: _record(m, machine="cpu: a machine that shares the cache"),
    "another model's": lambda m: _record(_model(n_future=4)),
    "no machine": lambda m: {k: v for k, v in _record(m).items() if k != "machine"},
    "truncated": lambda m: json.dumps(_record(m))[:200],
    "not UTF-8": lambda m: b"\xff\xfe{" * 10,
    "nested too deep": lambda m: "[" * 100_000,
    "a folder": lambda m: pathlib.Path,
}


def _write_bad(path: pathlib.Path, what) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if what is pathlib.Path:
        path.mkdir()
    elif isinstance(what, bytes):
        path.write_bytes(what)
    else:
        path.write_text(what if isinstance(what, str) else json.dumps(what))


@pytest.mark.parametrize("bad", BAD_RECORDS)
def test_a_bad_record_is_absent_measured_again_and_rewritten(bad, monkeypatch):
    """A record that is malformed, truncated, foreign or unreadable is no record: `auto` does not
    take the step as compiled, the costs are measured again on the step and the record is
    rewritten, and a default decode of that model shape runs."""
    model = _model()
    path = record_path(model.decode_heads(), batch_size=2)
    _write_bad(path, BAD_RECORDS[bad](model))
    assert cached_costs(model.decode_heads(), batch_size=2) is None
    assert not decode.Decoder(model).policy.use(2, max_bytes=8)  # not "compiled already"
    measured = []
    monkeypatch.setattr(calibration, "measure_pass_costs", lambda decoder, batch_size, static=False, **kw:
                        measured.append(static) or _COSTS)
    got = decode.Decoder(model).generate([b"a", b"bc"], max_bytes=8)  # auto, eager: bad record or not
    assert [g.output for g in got] == [decode.generate(model, p, max_bytes=8).output for p in (b"a", b"bc")]
    on = decode.Decoder(model, compile="on")
    on.policy.static = StaticStep(model, on.pass_heads, compiled=False)
    assert on.pass_costs(2, static=True).to_dict() == _GOOD and measured == [False, True]
    if bad != "a folder":  # in its place: left as it is, and measured again next time
        assert cached_costs(model.decode_heads(), batch_size=2) == _GOOD
        assert decode.Decoder(model).policy.use(2, max_bytes=8)


def test_writers_at_once_leave_a_valid_record():
    """Two threads rewrite the record over and over while a third reads it: every read finds
    the whole record (temp file + rename), and a valid record is left."""
    model = _model()
    record_costs(model.decode_heads(), batch_size=2, costs_ms=_GOOD)
    stop, reads = threading.Event(), []

    def write():
        for _ in range(150):
            record_costs(model.decode_heads(), batch_size=2, costs_ms=_GOOD)

    def read():
        while not stop.is_set():
            reads.append(cached_costs(model.decode_heads(), batch_size=2))

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write) for _ in range(2)]
    reader.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert reads and all(r == _GOOD for r in reads), sum(r != _GOOD for r in reads)
    assert cached_costs(model.decode_heads(), batch_size=2) == _GOOD
    assert [p.name for p in record_path(model.decode_heads(), batch_size=2).parent.iterdir()] == \
        [record_path(model.decode_heads(), batch_size=2).name]  # no temp file left behind


def test_tests_use_a_compile_cache_of_their_own(compile_cache):
    assert record_path(_model().decode_heads(), batch_size=1).is_relative_to(compile_cache)


@pytest.mark.slow
@FITTED
def test_compile_shapes_covers_the_lookup_passes_a_decode_runs():
    """The warm-up of a timed decode compiles every shape it will run, the long chains that one
    head verifies for prompt-lookup drafts included (before, the first timed round compiled them)."""
    model = fitted_model(0, "transformer")
    decoder = decode.Decoder(model, compile="on")
    decoder.policy.static = StaticStep(model, decoder.pass_heads, compiled=False)  # records its shapes alike
    # every pass costs alike, so lookup's long chains are chosen (a copy: a run calibrates what it is given here)
    decoder.calibration.add(1, PassCosts(dict(FLAT.table)), static=True)
    compile_shapes(decoder, 1)
    warmed = set(decoder.policy.static._shapes)
    # one head and lookup drafts: every drafted pass is a lookup chain that head 1 verifies
    got = decoder.generate([SONGS[0] * 3 + SONGS[0][:12]], max_bytes=120, draft=Draft(1, lookup=True))[0]
    assert got.stats.lookup_passes > 0
    assert any(k == 1 and t >= 8 for _, k, t in decoder.policy.static._shapes)  # one head over a long chain ran
    assert decoder.policy.static._shapes <= warmed, sorted(decoder.policy.static._shapes - warmed)
