"""The decoding loop makes the host wait once a pass: counted where torch dispatches
(`runtime.host.HostTransfers`) on the stand-in accelerator (`runtime.standin`), where every read of
values, every data-dependent shape and every synchronous host-to-device copy is a real transfer.
Eager and on the static step, greedy and sampled, plain, chains, trees, the automatic choice and
prompt lookup, at batch 1 and 8: at most one read a pass, no data-dependent shape, no synchronous
copy. On a GPU each would wait for the queued work, so this is the CPU's proxy for a pass that is not
bound by the host. The rows' own count (`SpeculativeStats.host_reads`) must be every read there is.

The counter is shown catching each kind of transfer (`test_the_counter_sees_every_kind_of_transfer`),
and the loop's budget is shown failing on a read and on a synchronous copy added to each pass.
"""

import copy

import pytest
import torch
from doubles import FITTED, FLAT, SONGS, fitted_model

from bytemtp.decoding import decode
from bytemtp.decoding.compiled import StaticStep
from bytemtp.decoding.picks import Picks
from bytemtp.decoding.sampling import Sampling
from bytemtp.model.pass_heads import PassHeads
from bytemtp.runtime.host import HostTransfers
from bytemtp.runtime.standin import StandIn

DRAFTS = ["plain", "chain-4", "tree-4", "auto", "auto+lookup"]


def _decoder(model, static: bool) -> decode.Decoder:
    decoder = decode.Decoder(model, compile="on" if static else "off", costs=FLAT)
    if static:  # the static step's code, uncompiled: what the compiled graph runs, read op by op
        decoder.policy.static = StaticStep(model, decoder.pass_heads, compiled=False)
    return decoder


def _count(decoder, prompts, *, draft, temperature, monkeypatch):
    """The generations, the transfers made, the key draws among the reads, and the batch's passes
    (the model's runs: eager, or the static step's)."""
    device = decoder.model.embed.weight.device
    sampling = (Sampling(temperature=temperature, generator=torch.Generator(device=device).manual_seed(3))
                if temperature else None)
    passes = []
    for cls, name in ((PassHeads, "logits"), (PassHeads, "run_pass"), (StaticStep, "__call__")):
        monkeypatch.setattr(cls, name, _counting(getattr(cls, name), passes))
    with HostTransfers() as transfers:
        got = decoder.generate(prompts, max_bytes=60, draft=draft, sampling=sampling)
    monkeypatch.undo()
    key_draws = len(prompts) if temperature else 0  # a sampled row draws its key once, when it starts
    return got, transfers, key_draws, len(passes)


def _counting(fn, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return counted


def _check_budget(got, transfers, key_draws, passes, draft):
    assert transfers.syncs == 0 and transfers.copies == 0, (draft, transfers.sites)
    assert transfers.reads - key_draws <= passes, (draft, passes, transfers.sites)  # prefill, re-warms, slides too
    # each row counts the reads of the passes it took part in: the longest-lived, every one
    assert max(g.stats.host_reads for g in got) <= transfers.reads - key_draws, (draft, transfers.sites)
    assert max(g.stats.host_reads for g in got) >= max(g.stats.forward_passes for g in got) - 1


@FITTED
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_a_pass_reads_the_device_once(static, batch, temperature, monkeypatch):
    prompts = [(SONGS[i % 3] * 3)[i:i + 20 + 9 * i] for i in range(batch)]  # some slide their windows (context 64)
    with StandIn() as device:
        model = copy.deepcopy(fitted_model(0, "transformer")).to(device)
        decoder = _decoder(model, static)
        for draft in DRAFTS:
            got, transfers, key_draws, passes = _count(decoder, prompts, draft=draft, temperature=temperature,
                                                       monkeypatch=monkeypatch)
            _check_budget(got, transfers, key_draws, passes, draft)
            if draft != "plain" and not temperature:
                assert max(g.stats.bytes_out for g in got) > 1.3 * max(g.stats.forward_passes for g in got)
            assert any(g.stats.slides for g in got)  # windows slid (context 64)


def test_the_counter_sees_every_kind_of_transfer():
    """Each kind of wait moves the count, on the device; the host alone moves nothing."""
    with StandIn() as device:
        x = torch.arange(6.0, device=device)
        host = torch.arange(6.0, device="cpu")
        kinds = {
            "item": lambda: x.sum().item(), "tolist": lambda: x.tolist(), "cpu": lambda: x.cpu(),
            "to cpu": lambda: x.to("cpu"), "copy_ to host": lambda: torch.empty(6).copy_(x),
            "int": lambda: int(x[0]), "bool": lambda: bool(x[2] > 0), "equal": lambda: torch.equal(x, x),
            "allclose": lambda: torch.allclose(x, x), "numpy": lambda: x.numpy(),
        }
        syncs = {
            "where(cond)": lambda: torch.where(x > 2), "nonzero": lambda: x.nonzero(), "mask index": lambda: x[x > 2],
            "mask assignment": lambda: x.clone().__setitem__(x > 2, 0.0), "unique": lambda: torch.unique(x),
            "repeat_interleave": lambda: torch.repeat_interleave(x.long()), "bincount": lambda: x.long().bincount(),
        }
        copies = {
            "tensor(list, device)": lambda: torch.tensor([1, 2], device=device), "to device": lambda: host.to(device),
            "copy_ from host": lambda: x.clone().copy_(host),
        }
        for expected, group in (("reads", kinds), ("syncs", syncs), ("copies", copies)):
            for name, op in group.items():
                with HostTransfers() as t:
                    op()
                assert (t.reads, t.syncs, t.copies) == tuple(int(k == expected) for k in ("reads", "syncs", "copies")) \
                    or (expected == "reads" and t.reads >= 1 and t.syncs == t.copies == 0), (name, t.sites)
                assert all("test_host_transfers.py" in site for site in t.sites), (name, t.sites)
        with HostTransfers() as t:  # none of these waits
            x + 1, x.argmax(), x.topk(2), x[torch.arange(2, device=device)], host.tolist(), host.sum().item()
            host.pin_memory().to(device, non_blocking=True), torch.repeat_interleave(x.long(), 2)
        assert t.total == 0, t.sites


def test_the_budget_fails_on_a_read_or_a_synchronous_copy_in_a_pass(monkeypatch):
    """The mutants the count exists for: a `.to("cpu")` of the picks beside their one read, and a
    copy of a host list to the device without pinned memory, each once a pass."""
    read = Picks.read.__func__

    def read_twice(cls, picks, rows, **kw):
        picks.to("cpu")
        return read(cls, picks, rows, **kw)

    def read_and_copy(cls, picks, rows, **kw):
        torch.tensor([len(rows)], device=picks.device)
        return read(cls, picks, rows, **kw)

    with StandIn() as device:
        model = copy.deepcopy(fitted_model(0, "transformer")).to(device)
        for mutant, caught in ((read_twice, "reads"), (read_and_copy, "copies")):
            monkeypatch.setattr(Picks, "read", classmethod(mutant))
            got, transfers, key_draws, passes = _count(_decoder(model, False), [SONGS[0]], draft="chain-4",
                                                       temperature=0.0, monkeypatch=monkeypatch)
            with pytest.raises(AssertionError):
                _check_budget(got, transfers, key_draws, passes, "chain-4")
            assert getattr(transfers, caught) >= passes


@pytest.mark.parametrize("design", ["medusa", "hydra"])
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_a_pass_with_draft_heads_reads_the_device_once(design, static, monkeypatch):
    """Draft heads (`--draft medusa|hydra`) draft from the byte head 1 chose at the kept node: they
    run at every node before the pass's picks are read, so the drafts come back with them."""
    from doubles import rare_eos_model

    prompts = [b"import os\n", b"x = [", b"q" * 7] * 3
    model = rare_eos_model(0, draft=design)
    want = [decode.generate(model, p, max_bytes=60).output for p in prompts]
    with StandIn() as device:
        model = copy.deepcopy(model).to(device)
        decoder = _decoder(model, static)
        for temperature in (0.0, 0.8):
            got, transfers, key_draws, passes = _count(decoder, prompts, draft="chain-4", temperature=temperature,
                                                       monkeypatch=monkeypatch)
            _check_budget(got, transfers, key_draws, passes, "chain-4")
            if not temperature:
                assert [g.output for g in got] == want


@FITTED
def test_the_servers_loop_reads_the_device_once_a_pass(monkeypatch):
    """The engine's thread (continuous batching: admissions, removals, greedy and sampled rows side
    by side) makes the host wait once a pass at most, as `generate` does."""
    import threading

    from bytemtp.serving.engine import Engine, GenerateJob
    from bytemtp.runtime import standin

    transfers, runs, done = HostTransfers(), [], []
    run = threading.Thread.run

    def run_counted(self):  # the engine's thread follows the stand-in's rules and is counted
        with standin.modes(), transfers:
            run(self)

    monkeypatch.setattr(threading.Thread, "run", run_counted)
    with StandIn() as device:
        model = copy.deepcopy(fitted_model(0, "transformer")).to(device)
        model.embed.register_forward_pre_hook(lambda *_: runs.append(1))  # a pass runs the embedding once
        engine = Engine(model, decoder=decode.Decoder(model, costs=FLAT), max_batch=3)
        engine.start()
        try:
            finished = threading.Semaphore(0)
            jobs = [GenerateJob(SONGS[i % 3][:5 + i], 20 + 7 * i,
                                Sampling() if i % 2 else Sampling(temperature=0.8, generator=torch.Generator(
                                    device=device).manual_seed(i)),
                                on_done=lambda g: (done.append(g), finished.release()))
                    for i in range(5)]
            engine.submit(*jobs)
            for _ in jobs:
                assert finished.acquire(timeout=120), "a request never finished"
        finally:
            engine.close()
    sampled = sum(1 for j in jobs if not j.sampling.greedy)  # each draws its key once
    assert len(done) == 5 and transfers.syncs == 0 and transfers.copies == 0, transfers.sites
    assert transfers.reads - sampled <= len(runs), (len(runs), transfers.sites)
