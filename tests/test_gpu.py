"""The fast paths on CUDA in bf16, where a GPU is present (marked gpu; skipped elsewhere)."""

import dataclasses

import pytest
import torch

from bytemtp import config as C
from bytemtp.model import ByteMTP, KVCache
from bytemtp.step import forward_backward, plain_forward_backward

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_memory_efficient_gradients_equal_plain_in_bf16(head_type):
    cfg = dataclasses.replace(C.tiny().model, head_type=head_type)
    model = ByteMTP(cfg).cuda()
    ids = torch.randint(0, 256, (4, cfg.seq_len + cfg.n_future), device="cuda")
    grads = []
    for fn in (plain_forward_backward, forward_backward):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fn(model, ids, loss_cfg=C.LossConfig())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=2e-3, rtol=2e-2, msg=name)


def test_cached_logits_equal_full_sequence_on_cuda():
    model = ByteMTP(C.tiny().model).cuda().eval()
    ids = torch.randint(0, 256, (2, 40), device="cuda")
    full = model.logits(ids)
    cache = KVCache.for_model(model, batch_size=2)
    got = torch.cat([model.logits(ids[:, :17], cache), model.logits(ids[:, 17:18], cache),
                     model.logits(ids[:, 18:40], cache)], dim=1)
    torch.testing.assert_close(got, full, atol=1e-4, rtol=1e-4)


def test_peak_memory_efficient_below_plain_on_cuda():
    from bytemtp.bench import peak_memory_mb

    efficient = peak_memory_mb("small", "mtp", batch_size=8, device="cuda")
    plain = peak_memory_mb("small", "mtp_plain", batch_size=8, device="cuda")
    assert efficient < plain


def test_stacked_heads_and_per_row_cache_on_cuda():
    model = ByteMTP(dataclasses.replace(C.tiny().model, n_future=4)).cuda().eval()
    ids = torch.randint(0, 256, (3, 30), device="cuda")
    full = model.logits(ids)
    cache = KVCache.for_model(model, batch_size=3)
    model.logits(ids[:, :10], cache)
    cache.rewind([0, 4, 7])
    fed = torch.stack([ids[0, 10:14], ids[1, 6:10], ids[2, 3:7]])
    got = model.logits(fed, cache, heads=4, stacked=model.stack_heads())
    for row, start in enumerate([10, 6, 3]):
        torch.testing.assert_close(got[row], full[row, start:start + 4], atol=1e-4, rtol=1e-4)


def test_batched_decoding_on_cuda_with_a_cuda_generator():
    from bytemtp import decode

    model = ByteMTP(C.tiny().model).cuda().eval()
    prompts = [b"", b"def ", b"x" * 20]
    plain = [decode.generate(model, p, max_bytes=16).output for p in prompts]
    assert [g.output for g in decode.generate_batch(model, prompts, max_bytes=16)] == plain
    gen = torch.Generator(device="cuda").manual_seed(0)
    sampled = decode.generate_batch(model, prompts, max_bytes=16,
                                    sampling=decode.Sampling(temperature=1.0, generator=gen))
    assert all(len(g.output) <= 16 for g in sampled)


def test_tree_and_automatic_drafts_equal_plain_greedy_on_cuda():
    from bytemtp import decode

    model = ByteMTP(C.tiny().model).cuda().double().eval()
    prompts = [b"", b"def ", b"x" * 80]  # the last one slides the window (context 64)
    plain = [decode.generate(model, p, max_bytes=100).output for p in prompts]
    for compile in ("off", "on"):  # eager, and the static step with CUDA graphs
        decoder = decode.Decoder(model, compile=compile)
        for draft in ("auto", "tree-4", "chain-8", "plain"):
            got = decoder.generate(prompts, max_bytes=100, draft=draft)
            assert [g.output for g in got] == plain, (compile, draft)
