"""The decoding loop reads the device once a pass: counted with `runtime.host.HostReads` (every
`tolist`, `item`, `int(t)`, `.cpu()` ... and data-dependent op made while decoding), eager and on
the static step, greedy and sampled, plain, chains, trees, the automatic choice and prompt
lookup, at batch 1 and 8. On a GPU each read waits for the queued work, so this is the CPU's
proxy for a pass that is not bound by the host. The rows' own count (`SpeculativeStats.host_reads`,
what `bench decode` reports) must be every read there is."""

import pytest
import torch
from doubles import FITTED, FLAT, SONGS, fitted_model

from bytemtp.decoding import decode
from bytemtp.decoding.compiled import StaticStep
from bytemtp.decoding.sampling import Sampling
from bytemtp.model.pass_heads import PassHeads
from bytemtp.runtime.host import HostReads

DRAFTS = ["plain", "chain-4", "tree-4", "auto", "auto+lookup"]


def _decoder(model, static: bool) -> decode.Decoder:
    decoder = decode.Decoder(model, compile="on" if static else "off", costs=FLAT)
    if static:  # the static step's code, uncompiled: what the compiled graph runs, read op by op
        decoder.policy.static = StaticStep(model, decoder.pass_heads, compiled=False)
    return decoder


def _count(decoder, prompts, *, draft, temperature, monkeypatch):
    """The generations, the reads made, the key draws among them, and the batch's passes (the
    model's runs: eager, or the static step's)."""
    sampling = (Sampling(temperature=temperature, generator=torch.Generator(device="cpu").manual_seed(3))
                if temperature else None)
    passes = []
    for cls, name in ((PassHeads, "logits"), (PassHeads, "run_pass"), (StaticStep, "__call__")):
        monkeypatch.setattr(cls, name, _counting(getattr(cls, name), passes))
    with HostReads() as reads:
        got = decoder.generate(prompts, max_bytes=60, draft=draft, sampling=sampling)
    monkeypatch.undo()
    key_draws = len(prompts) if temperature else 0  # a sampled row draws its key once, when it starts
    return got, reads, key_draws, len(passes)


def _counting(fn, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return counted


@FITTED
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_a_pass_reads_the_device_once(static, batch, temperature, monkeypatch):
    model = fitted_model(0, "transformer")
    prompts = [(SONGS[i % 3] * 3)[i:i + 20 + 9 * i] for i in range(batch)]  # some slide their windows (context 64)
    decoder = _decoder(model, static)
    for draft in DRAFTS:
        got, reads, key_draws, passes = _count(decoder, prompts, draft=draft, temperature=temperature,
                                               monkeypatch=monkeypatch)
        assert reads.syncs == 0, (draft, reads.sites)
        assert reads.reads - key_draws <= passes, (draft, passes, reads.sites)  # prefill, re-warms, slides too
        # each row counts the reads of the passes it took part in: the longest-lived, every one
        assert max(g.stats.host_reads for g in got) <= reads.reads - key_draws, (draft, reads.sites)
        assert max(g.stats.host_reads for g in got) >= max(g.stats.forward_passes for g in got) - 1
        if draft != "plain" and not temperature:
            assert max(g.stats.bytes_out for g in got) > 1.3 * max(g.stats.forward_passes for g in got)
        assert any(g.stats.slides for g in got)  # windows slid (context 64)
        assert all(g.stats.step_s > 0 for g in got)


def test_the_counter_sees_every_kind_of_read():
    """HostReads counts what a loop could wait on: reads of values and data-dependent shapes."""
    x = torch.arange(6.0)
    with HostReads() as reads:
        x.tolist(), x.sum().item(), int(x[0]), float(x[1]), bool(x[2] > 0), x.cpu(), x.numpy()
        x[x > 2], x.nonzero(), torch.unique(x)
        x + 1, x.argmax(), x.topk(2)  # none of these waits
    assert (reads.reads, reads.syncs) == (7, 3)
    assert all("test_host_transfers.py" in site for site in reads.sites)


@pytest.mark.parametrize("design", ["medusa", "hydra"])
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_a_pass_with_draft_heads_reads_the_device_once(design, static, monkeypatch):
    """Draft heads (`--draft medusa|hydra`) draft from the byte head 1 chose at the kept node: they
    run at every node before the pass's picks are read, so the drafts come back with them."""
    from doubles import rare_eos_model

    model = rare_eos_model(0, draft=design)
    decoder = _decoder(model, static)
    for temperature in (0.0, 0.8):
        got, reads, key_draws, passes = _count(decoder, [b"import os\n", b"x = [", b"q" * 7] * 3, draft="chain-4",
                                               temperature=temperature, monkeypatch=monkeypatch)
        assert reads.syncs == 0 and reads.reads - key_draws <= passes, reads.sites
        assert max(g.stats.host_reads for g in got) <= reads.reads - key_draws
        if not temperature:
            assert [g.output for g in got] == [decode.generate(model, p, max_bytes=60).output
                                               for p in [b"import os\n", b"x = [", b"q" * 7] * 3]
