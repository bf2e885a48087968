"""The fast paths on CUDA in bf16, where a GPU is present (marked gpu; skipped elsewhere).

Every model and input is drawn from a seeded generator, so a failure reproduces."""

import copy
import dataclasses

import pytest
import torch
from doubles import FITTED, SONGS, build_model, fitted_model, generate_batch

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.decoding.sampling import Sampling
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.training.step import forward_backward, plain_forward_backward

pytestmark = pytest.mark.gpu

# bf16 autocast leaves each parameter's gradient about 1% from the float64 one (0.7-0.9% in a CPU
# bf16 autocast analogue of this test); one whose gradient is 10% off exceeds this by far
BF16_GRAD_ERROR = 0.05


def _model(cfg, seed: int = 0) -> ByteMTP:
    return build_model(cfg, seed).cuda()


def _ids(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed)).cuda()


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.double() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_memory_efficient_gradients_equal_plain_in_bf16(head_type):
    """Both steps in bf16 against the plain step in float64, parameter by parameter, by the
    relative norm of the difference: an error confined to one head is not lost among the others."""
    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type)
    model = _model(cfg)
    ids = _ids(4, cfg.seq_len + cfg.n_future)
    reference = copy.deepcopy(model).double()
    plain_forward_backward(reference, ids, loss_cfg=C.LossConfig())
    want = _grads(reference)
    for fn in (plain_forward_backward, forward_backward):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fn(model, ids, loss_cfg=C.LossConfig())
        got = _grads(model)
        for name, g in want.items():
            error = float((got[name] - g).norm() / g.norm())
            assert error < BF16_GRAD_ERROR, (fn.__name__, name, error)


def test_cached_logits_equal_full_sequence_on_cuda():
    model = _model(config_io.tiny().model).eval()
    ids = _ids(2, 40)
    full = model.logits(ids, layout=build_layout(model, ids))
    cache = KVCache.for_model(model, batch_size=2)
    got = torch.cat([model.logits(ids[:, :17], cache, layout=build_layout(model, ids[:, :17], cache)),
                     model.logits(ids[:, 17:18], cache, layout=build_layout(model, ids[:, 17:18], cache)),
                     model.logits(ids[:, 18:40], cache, layout=build_layout(model, ids[:, 18:40], cache))], dim=1)
    torch.testing.assert_close(got, full, atol=1e-4, rtol=1e-4)


def test_peak_memory_efficient_below_plain_on_cuda():
    from bytemtp.experiments.step_bench import peak_memory_mb

    efficient = peak_memory_mb("small", "mtp", batch_size=8, device="cuda")
    plain = peak_memory_mb("small", "mtp_plain", batch_size=8, device="cuda")
    assert efficient < plain


def test_stacked_heads_and_per_row_cache_on_cuda():
    model = _model(dataclasses.replace(config_io.tiny().model, n_future=4)).eval()
    ids = _ids(3, 30)
    full = model.logits(ids, layout=build_layout(model, ids))
    cache = KVCache.for_model(model, batch_size=3)
    model.logits(ids[:, :10], cache, layout=build_layout(model, ids[:, :10], cache))
    cache.rewind([0, 4, 7])
    fed = torch.stack([ids[0, 10:14], ids[1, 6:10], ids[2, 3:7]])
    got = model.decode_heads().logits(fed, cache, heads=4, layout=build_layout(model, fed, cache))
    for row, start in enumerate([10, 6, 3]):
        torch.testing.assert_close(got[row], full[row, start:start + 4], atol=1e-4, rtol=1e-4)


def test_batched_decoding_on_cuda_with_a_cuda_generator():
    from bytemtp.decoding import decode

    model = _model(config_io.tiny().model).eval()
    prompts = [b"", b"def ", b"x" * 20]
    plain = [decode.generate(model, p, max_bytes=16).output for p in prompts]
    assert [g.output for g in generate_batch(model, prompts, max_bytes=16)] == plain
    gen = torch.Generator(device="cuda").manual_seed(0)
    sampled = generate_batch(model, prompts, max_bytes=16,
                                    sampling=Sampling(temperature=1.0, generator=gen))
    assert all(len(g.output) <= 16 for g in sampled)


@FITTED
def test_tree_and_automatic_drafts_equal_plain_greedy_on_cuda():
    """On a model fitted to songs, whose drafts are often right (an untrained model's never are),
    so that trees, chains and the automatic choice accept drafts, eager and compiled."""
    from bytemtp.decoding import decode

    model = copy.deepcopy(fitted_model(0, "transformer")).cuda()  # float64; the shared one stays on the CPU
    prompts = [b"", b"one t", (b"".join(SONGS) * 2)[:80]]  # the last one slides the window (context 64)
    plain = [decode.generate(model, p, max_bytes=100).output for p in prompts]
    for compile in ("off", "on"):  # eager, and the static step with CUDA graphs
        decoder = decode.Decoder(model, compile=compile)
        for draft in ("auto", "tree-4", "chain-8", "plain"):
            got = decoder.generate(prompts, max_bytes=100, draft=draft)
            assert [g.output for g in got] == plain, (compile, draft)
            if draft != "plain":  # the drafts were right often enough to matter
                per_pass = sum(g.stats.bytes_out for g in got) / sum(g.stats.forward_passes for g in got)
                assert per_pass > 1.5, (compile, draft, per_pass)
