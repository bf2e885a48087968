import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.evaluation.evaluate import evaluate
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.training.optimizer import set_trainable
from bytemtp.training.step import forward_backward, plain_forward_backward
from bytemtp.vocab import EOS


def _grads(model):
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("head_type,mlp", [("transformer", "swiglu"), ("transformer", "gelu"), ("linear", "swiglu"),
                                          ("causal", "swiglu"), ("causal", "gelu")])  # linear heads have no MLP
@pytest.mark.parametrize("unembed", ["shared", "replicated"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("teacher", [False, True])
@pytest.mark.parametrize("doc_mask", [False, True])
def test_memory_efficient_gradients_equal_plain(head_type, mlp, unembed, dropout, teacher, doc_mask):
    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type, mlp=mlp, unembed=unembed, dropout=dropout,
                              n_future=4, head_layers=2, n_layers=10, doc_mask=doc_mask)
    model = ByteMTP(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 256, (3, 24 + 4), generator=torch.Generator().manual_seed(1))
    ids[0, 7] = ids[2, 15] = EOS
    loss_cfg = C.LossConfig(head_weights="geometric", **(
        {"teacher_weight": 0.7, "teacher_temperature": 0.5, "draft_data_weight": 0.4} if teacher else {}))

    torch.manual_seed(5)
    plain = plain_forward_backward(model, ids, loss_cfg=loss_cfg, scale=0.5)
    plain_grads = _grads(model)
    torch.manual_seed(5)
    efficient = forward_backward(model, ids, loss_cfg=loss_cfg, scale=0.5)
    efficient_grads = _grads(model)

    torch.testing.assert_close(efficient.total, plain.total)
    torch.testing.assert_close(efficient.head_loss, plain.head_loss)
    torch.testing.assert_close(efficient.head_kl, plain.head_kl)
    torch.testing.assert_close(efficient.head_agreement, plain.head_agreement)
    assert (efficient.head_kl[1:] > 0).all() == teacher
    assert torch.equal(efficient.head_count, plain.head_count)
    for name, g in plain_grads.items():
        assert g.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(efficient_grads[name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert not efficient.total.requires_grad and not plain.total.requires_grad


@pytest.mark.parametrize("head_type", ["transformer", "linear", "causal"])
@pytest.mark.parametrize("teacher", [False, True])
def test_heads_of_weight_0_do_not_run_and_get_the_references_zero_gradients(head_type, teacher):
    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type, n_future=4, head_layers=1, n_layers=8)
    model = ByteMTP(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 256, (3, 24 + 4), generator=torch.Generator().manual_seed(1))
    ids[1, 9] = EOS
    loss_cfg = C.LossConfig(**({"teacher_weight": 0.5} if teacher else {}))
    weights = [1.0, 0.0, 0.5, 0.0]  # a head schedule's weights this step
    calls = [0] * 4
    for k, head in enumerate(model.heads):
        head.register_forward_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))

    plain = plain_forward_backward(model, ids, loss_cfg=loss_cfg, scale=0.5, weights=weights)
    plain_grads = _grads(model)
    calls[:] = [0] * 4
    efficient = forward_backward(model, ids, loss_cfg=loss_cfg, scale=0.5, weights=weights)
    efficient_grads = _grads(model)

    # independent heads skip both heads of weight 0; causal heads run up to the last head with weight
    # (each twice: without a graph, then again for its backward)
    assert [c > 0 for c in calls] == ([True, True, True, False] if head_type == "causal" else [True, False, True, False])
    torch.testing.assert_close(efficient.total, plain.total)
    ran, skipped = ([0, 1, 2], [3]) if head_type == "causal" else ([0, 2], [1, 3])
    torch.testing.assert_close(efficient.head_loss[ran], plain.head_loss[ran])
    assert efficient.head_loss[skipped].isnan().all() and efficient.head_accuracy[skipped].isnan().all()
    assert efficient.head_agreement[skipped].isnan().all()
    names = [n for n, _ in model.named_parameters() if n.startswith(tuple(f"heads.{k}." for k in skipped))]
    names += [f"unembed.{k}.weight" for k in skipped]
    # skipped: no gradient in either step, so the optimizer leaves them (zeros would move them under Muon)
    assert names and all(efficient_grads[n] is None and plain_grads[n] is None for n in names)
    for name, g in plain_grads.items():
        if name not in names:
            torch.testing.assert_close(efficient_grads[name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert any(plain_grads[n].abs().sum() > 0 for n in plain_grads if n.startswith("heads.2."))


def test_head_weights_must_give_head_1_a_weight():
    model = ByteMTP(dataclasses.replace(config_io.tiny().model, n_future=2, n_layers=4))
    ids = torch.randint(0, 256, (1, 16 + 2))
    with pytest.raises(ValueError, match="expected 2 head weights, the first above 0"):
        forward_backward(model, ids, loss_cfg=C.LossConfig(), weights=[0.0, 1.0])


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_a_frozen_trunk_and_head_1_train_only_the_draft_heads_as_the_reference_does(head_type):
    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type, n_future=4, head_layers=1, n_layers=6)
    model = ByteMTP(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    set_trainable(model, "draft-heads")  # what tune-heads trains: heads 2..n and their unembeddings
    ids = torch.randint(0, 256, (2, 20 + 4), generator=torch.Generator().manual_seed(1))
    loss_cfg = C.LossConfig(teacher_weight=1.0, draft_data_weight=0.0)
    plain = plain_forward_backward(model, ids, loss_cfg=loss_cfg)
    plain_grads = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    efficient = forward_backward(model, ids, loss_cfg=loss_cfg)
    torch.testing.assert_close(efficient.total, plain.total)
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            torch.testing.assert_close(p.grad, plain_grads[name], atol=1e-6, rtol=1e-5, msg=name)
        else:
            assert p.grad is None and plain_grads[name] is None, name


def test_gradients_accumulate_across_calls():
    model = ByteMTP(config_io.tiny().model)
    ids = torch.randint(0, 256, (2, 40 + 8))
    loss_cfg = C.LossConfig()
    forward_backward(model, ids, loss_cfg=loss_cfg)
    once = _grads(model)
    forward_backward(model, ids, loss_cfg=loss_cfg, scale=0.5)
    forward_backward(model, ids, loss_cfg=loss_cfg, scale=0.5)
    for name, g in _grads(model).items():
        torch.testing.assert_close(g, once[name], msg=name)


def _predicted_ids(model, rows: int, length: int, generator) -> torch.Tensor:
    """Windows whose byte n is what head j (1-based, j = 1 + n % 4) predicted j positions before,
    every fifth one a random byte instead: each of the first four heads is right at some positions
    and wrong at others."""
    out = []
    with torch.no_grad():
        for _ in range(rows):
            ids = [int(torch.randint(0, 256, (1,), generator=generator))]
            while len(ids) < length:
                n = len(ids)
                j = min(1 + n % 4, n)
                seq = torch.tensor([ids[:n - j + 1]])
                logits = model.logits(seq, heads=j, layout=build_layout(model, seq))
                predicted = int(logits[0, -1, j - 1, :256].argmax())
                ids.append(predicted if n % 5 else int(torch.randint(0, 256, (1,), generator=generator)))
            out.append(ids)
    return torch.tensor(out)


def test_step_reports_per_head_figures():
    """Each head's loss, nats, accuracy, count and agreement with head 1, recomputed from the
    logits: head k (0-based) at position t predicts ids[t + k + 1], and agrees with head 1 when
    its greedy byte is head 1's at t + k."""
    model = ByteMTP(config_io.tiny().model)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    B, T, K = 2, 16, model.config.n_future
    ids = _predicted_ids(model, B, T + K, torch.Generator().manual_seed(1))
    out = forward_backward(model, ids, loss_cfg=C.LossConfig())
    with torch.no_grad():
        logits = model.logits(ids[:, :T], layout=build_layout(model, ids[:, :T]))  # (B, T, K, V)
    greedy = logits.argmax(-1)  # (B, T, K)
    for k in range(K):
        target = ids[:, k + 1:k + 1 + T]
        nats = F.cross_entropy(logits[:, :, k].flatten(0, 1), target.flatten(), reduction="sum")
        torch.testing.assert_close(out.head_nats[k], nats)
        torch.testing.assert_close(out.head_loss[k], nats / (B * T))
        assert out.head_count[k] == B * T
        assert out.head_accuracy[k] == (greedy[:, :, k] == target).float().mean(), k
        agree = (greedy[:, :T - k, k] == greedy[:, k:, 0]).float().mean()
        assert out.head_agreement[k] == agree, k
    torch.testing.assert_close(out.total, out.head_loss.sum())  # uniform weights: the plain sum
    assert all(0 < a < 1 for a in out.head_accuracy[:4]) and out.head_agreement[0] == 1


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_evaluation_nats_equal_the_training_loss(head_type, tmp_path):
    """evaluate (what training's validation runs) scores a window as the training step does."""
    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type)
    model = ByteMTP(cfg).eval()
    ids = torch.randint(0, 256, (2, cfg.seq_len + cfg.n_future))
    (tmp_path / "doc.bin").write_bytes(bytes(ids[0, :-1].tolist()))  # one document: the window, EOS last
    window = torch.cat([ids[:1, :-1], torch.tensor([[EOS]])], dim=1)
    evaluated = evaluate(model, str(tmp_path / "doc.bin"), split=None, batches=1, batch_size=1)
    trained = plain_forward_backward(model, window, loss_cfg=C.LossConfig())
    nats = trained.head_nats / trained.head_count
    assert evaluated.bpb == pytest.approx((nats / math.log(2)).tolist(), rel=1e-5)
    assert evaluated.bytes == int(trained.head_count[0])


# --- compiled training (train.compile) against its eager reference ---------------------------


@pytest.mark.slow
@pytest.mark.parametrize("head_type,doc_mask", [("transformer", True), ("causal", False)])
def test_the_compiled_step_gives_the_eager_steps_losses_and_gradients(head_type, doc_mask):
    from bytemtp.training.step import compile_blocks

    cfg = dataclasses.replace(config_io.tiny().model, head_type=head_type, n_future=4, n_layers=6, doc_mask=doc_mask)
    eager, compiled = ByteMTP(cfg), ByteMTP(cfg)
    compiled.load_state_dict(eager.state_dict())
    compile_blocks(compiled)
    loss_cfg = C.LossConfig(teacher_weight=0.5)
    for seed in range(2):  # the second batch runs the graphs the first compiled
        ids = torch.randint(0, 256, (3, 24 + 4), generator=torch.Generator().manual_seed(seed))
        ids[1, 9] = EOS
        want = forward_backward(eager, ids, loss_cfg=loss_cfg, scale=0.5)
        got = forward_backward(compiled, ids, loss_cfg=loss_cfg, scale=0.5, compiled=True)
        torch.testing.assert_close(got.head_loss, want.head_loss, rtol=1e-4, atol=1e-5)
        assert torch.equal(got.head_accuracy, want.head_accuracy)
        assert torch.equal(got.head_agreement, want.head_agreement)
        g_eager, g_compiled = _grads(eager), _grads(compiled)
        assert g_eager.keys() == g_compiled.keys()
        for name, g in g_eager.items():
            torch.testing.assert_close(g_compiled[name], g, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.slow
def test_the_compiled_loss_gives_the_eager_losss_nats_greedy_ids_and_gradients():
    from bytemtp.model.loss import IGNORE, compiled_nats_and_greedy, nats_and_greedy

    logits = torch.randn(2, 50, 264, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 264, (2, 50), generator=torch.Generator().manual_seed(1))
    targets[0, :7] = IGNORE
    results = []
    for core in (nats_and_greedy, compiled_nats_and_greedy):
        x = logits.clone().requires_grad_()
        nats, greedy = core(x, targets)
        nats.backward()
        results.append((nats.detach(), greedy, x.grad))
    (nats, greedy, grad), (c_nats, c_greedy, c_grad) = results
    torch.testing.assert_close(c_nats, nats)
    assert torch.equal(c_greedy, greedy) and torch.equal(greedy, logits.argmax(-1))
    torch.testing.assert_close(c_grad, grad)


def test_compile_choice_compiles_where_it_pays_and_says_why(monkeypatch):
    from bytemtp.training import step

    cpu = torch.device("cpu")

    def choice(**settings):
        return step.compile_choice(C.TrainConfig(**settings), cpu, flops_per_step=1e9, bytes_per_step=1000)

    assert choice(compile="off", max_time=3600) == (False, "off (eager)")
    assert choice(compile="on", steps=2) == (True, "on")
    assert choice(steps=100) == (False, "auto: off (a short run: 100 steps, 1.0e+11 FLOP, under 2e+12)")
    assert choice(steps=5000) == (True, "auto: on (5,000 steps, 5.0e+12 FLOP)")
    assert choice(max_bytes=5_000_000) == (True, "auto: on (5,000 steps, 5.0e+12 FLOP)")
    assert choice(max_time=540) == (True, "auto: on (a time budget of 540 s)")
    assert choice(max_time=30) == (False, "auto: off (a short run: 0 steps, 0.0e+00 FLOP, under 2e+12)")
    assert choice() == (True, "auto: on (no step limit)")
    monkeypatch.setattr("shutil.which", lambda name: None)  # no C++ compiler for inductor
    assert choice(max_time=540) == (False, "auto: off (no C++ compiler (g++ or clang++) for inductor)")
    with pytest.raises(ValueError, match=r"^train.compile=on cannot compile here: no C\+\+ compiler"):
        choice(compile="on")


def test_train_compile_takes_auto_on_off_and_an_older_runs_true_or_false():
    from bytemtp import config_io

    assert C.TrainConfig().compile == "auto"
    data = config_io.to_dict(C.Config())
    for old, new in ((True, "on"), (False, "off")):
        data["train"]["compile"] = old
        assert config_io.from_dict(C.Config, data).train.compile == new
    with pytest.raises(ValueError, match=r"train.compile='yes' is not allowed; choose one of auto, on, off"):
        config_io.resolve("tiny", overrides=["train.compile=yes"])
