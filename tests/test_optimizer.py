"""The optimizer (bytemtp.training.optimizer): which parameters Muon and AdamW take, the learning
rate of each, the mixed optimizer's state, and runs with the new options resuming bit for bit."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_runs import loss_lines, read_metrics, tiny_cfg

import bytemtp.training.train as train_lib
from bytemtp import config_io
from bytemtp.config import TrainConfig
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import CheckpointError, latest_checkpoint, load_optimizer_state
from bytemtp.training.optimizer import Mixed, build_optimizer, set_lr, set_trainable

CPU = torch.device("cpu")


def _model() -> ByteMTP:
    model = ByteMTP(config_io.tiny().model)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    return model


def _names(model: ByteMTP, params) -> set[str]:
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {name_of[id(p)] for p in params}


def test_muon_takes_the_trunks_and_heads_matrices_and_adamw_the_rest():
    model = _model()
    opt = build_optimizer(model, TrainConfig(optimizer="muon"), CPU)
    assert isinstance(opt, Mixed) and list(opt.optimizers) == ["adamw", "muon"]
    muon = _names(model, opt.optimizers["muon"].param_groups[0]["params"])
    adamw = _names(model, [p for g in opt.optimizers["adamw"].param_groups for p in g["params"]])
    every = {n for n, _ in model.named_parameters()}
    assert muon | adamw == every and not muon & adamw
    assert muon == {n for n, p in model.named_parameters() if p.dim() == 2 and n.startswith(("trunk.", "heads."))}
    assert any(".attn.qkv." in n for n in muon) and any(".mlp.out." in n for n in muon)
    assert {"embed.weight", "unembed.0.weight"} <= adamw and any(n.endswith("norm.weight") for n in adamw)
    # weight decay on AdamW's matrices only, as with AdamW alone
    decay = {g["weight_decay"]: _names(model, g["params"]) for g in opt.optimizers["adamw"].param_groups}
    assert "embed.weight" in decay[0.1] and all(n.endswith("norm.weight") for n in decay[0.0])


def test_adamw_alone_is_a_torch_optimizer_over_the_trained_parameters():
    model = _model()
    set_trainable(model, "draft-heads")
    opt = build_optimizer(model, TrainConfig(), CPU)
    assert isinstance(opt, torch.optim.AdamW)
    assert _names(model, [p for g in opt.param_groups for p in g["params"]]) == {
        n for n, p in model.named_parameters() if p.requires_grad}


def test_set_lr_scales_each_optimizer_from_its_own_peak():
    model = _model()
    tc = TrainConfig(optimizer="muon", lr=3e-3, muon_lr=0.05)
    opt = build_optimizer(model, tc, CPU)
    set_lr(opt, 0.5, tc)
    assert {g["lr"] for g in opt.optimizers["adamw"].param_groups} == {1.5e-3}
    assert {g["lr"] for g in opt.optimizers["muon"].param_groups} == {0.025}


def test_a_mixed_step_moves_every_parameter_and_its_state_round_trips():
    model = _model()
    tc = TrainConfig(optimizer="muon")
    opt = build_optimizer(model, tc, CPU)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    state = opt.state_dict()
    assert set(state) == {"adamw", "muon"}
    again = build_optimizer(model, tc, CPU)
    again.load_state_dict(state)
    assert torch.equal(again.optimizers["muon"].state_dict()["state"][0]["momentum_buffer"],
                       state["muon"]["state"][0]["momentum_buffer"])


def test_a_checkpoint_of_one_optimizer_does_not_load_into_the_other(tmp_path, corpus_dir):
    run = tmp_path / "run"
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=2"), run, show_progress=False, say=lambda m: None)
    model = _model()
    with pytest.raises(CheckpointError, match="does not fit the given optimizer.*this run steps with adamw, muon"):
        load_optimizer_state(latest_checkpoint(run), build_optimizer(model, TrainConfig(optimizer="muon"), CPU))


def test_muon_under_fsdp_is_refused_in_one_line_saying_why():
    with pytest.raises(ValueError, match="Newton-Schulz.*whole matrices.*train.parallel=ddp") as e:
        TrainConfig(optimizer="muon", parallel="fsdp")
    assert "\n" not in str(e.value)


# three runs each: the quick suite keeps bf16
@pytest.mark.parametrize("sets", [pytest.param(("train.optimizer=muon",), marks=pytest.mark.slow),
                                  pytest.param(("train.schedule=wsd",), marks=pytest.mark.slow),
                                  pytest.param(("train.schedule=linear",), marks=pytest.mark.slow),
                                  pytest.param(("train.optimizer=muon", "train.schedule=wsd", "train.muon_weight_decay=0.01"),
                                               marks=pytest.mark.slow),
                                  ("train.precision=bf16",)])
def test_runs_with_the_new_options_resume_bit_for_bit(tmp_path, corpus_dir, sets):
    common = (*sets, "train.schedule_steps=16", "train.warmup_steps=3", "train.ckpt_every=100", "model.dropout=0.1",
              "model.seq_len=16")  # short windows: faster, and what resumes is the same
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    quiet = {"show_progress": False, "say": lambda m: None}
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=12", *common), whole, **quiet)
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=5", *common), parts, **quiet)
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=12", *common), parts, resume=True, **quiet)
    a, b = loss_lines(read_metrics(whole)), loss_lines(read_metrics(parts))
    assert [r["step"] for r in b] == list(range(1, 13))
    assert [(r["loss"], r["lr"], r["grad_norm"]) for r in a] == [(r["loss"], r["lr"], r["grad_norm"]) for r in b]
    wa = load_file(latest_checkpoint(whole) / "model.safetensors")
    wb = load_file(latest_checkpoint(parts) / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("nesterov", [True, False])
def test_batched_muon_steps_exactly_as_torchs_muon_and_shares_its_state(nesterov):
    from bytemtp.training.optimizer import BatchedMuon

    g = torch.Generator().manual_seed(0)
    shapes = [(8, 8), (8, 24), (24, 8), (8, 8), (24, 8), (16, 8)]  # wide, tall and square, some shapes twice
    ref_params = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    params = [p.detach().clone().requires_grad_() for p in ref_params]
    settings = dict(lr=0.02, momentum=0.9, weight_decay=0.1, nesterov=nesterov)
    ref, new = torch.optim.Muon(ref_params, **settings), BatchedMuon(params, **settings)
    for step in range(4):
        for i, (p, q) in enumerate(zip(ref_params, params)):
            grad = None if (step == 1 and i == 2) else torch.randn(p.shape, generator=g)  # one without a gradient
            p.grad, q.grad = grad, None if grad is None else grad.clone()
        ref.step()
        new.step()
        for p, q in zip(ref_params, params):
            assert torch.equal(p, q)
    other = torch.optim.Muon([p.detach().clone().requires_grad_() for p in params], **settings)
    other.load_state_dict(new.state_dict())  # a checkpoint of either loads into the other
    assert all(torch.equal(other.state_dict()["state"][i]["momentum_buffer"], ref.state_dict()["state"][i]["momentum_buffer"])
               for i in range(len(shapes)))


# --- a step cancelled on the device (what the training loop's StepGuard does on a GPU) ------------


def _pair(kind: str, device="cpu"):
    """Two equal sets of matrices on `device`, each with its optimizer of `kind` (fused AdamW or BatchedMuon)."""
    from bytemtp.training.optimizer import BatchedMuon

    g = torch.Generator().manual_seed(0)
    shapes = [(8, 8), (8, 24), (24, 8), (8, 8)]
    a = [torch.randn(s, generator=g).to(device).requires_grad_() for s in shapes]
    b = [p.detach().clone().requires_grad_() for p in a]
    make = (lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, fused=True)) if kind == "adamw" else \
        (lambda ps: BatchedMuon(ps, lr=0.02, momentum=0.9, weight_decay=0.1))
    return a, b, make(a), make(b), g


def _state(opt) -> list:
    return [v.clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_a_step_cancelled_on_the_device_changes_nothing_and_one_let_through_is_the_plain_step(kind):
    from bytemtp.runtime.host import HostTransfers
    from bytemtp.runtime.standin import StandIn
    from bytemtp.training.optimizer import skips_on_device, step_unless

    with StandIn() as device:  # on a device, where a read of the verdict would be a transfer
        _cancelled_steps(kind, device, skips_on_device, step_unless, HostTransfers)


def _cancelled_steps(kind, device, skips_on_device, step_unless, HostTransfers):
    a, b, plain, guarded, g = _pair(kind, device)
    assert skips_on_device(guarded)
    for step in range(5):
        bad = step in (1, 3)
        grads = [torch.randn(p.shape, generator=g).to(device) for p in a]
        for p, q, grad in zip(a, b, grads):
            p.grad, q.grad = grad, grad.clone().fill_(float("nan")) if bad else grad.clone()
        before = ([q.detach().clone() for q in b], _state(guarded))
        verdict = torch.tensor(bad).to(device)
        with HostTransfers() as reads:
            step_unless(guarded, verdict)
        assert reads.total == 0, reads.sites
        if bad:  # nothing moved: parameters, moments, momentum, step counts
            assert all(torch.equal(x, q) for x, q in zip(before[0], b))
            assert all(torch.equal(x, y) for x, y in zip(before[1], _state(guarded)))
        else:
            plain.step()
            assert all(torch.equal(p, q) for p, q in zip(a, b)), f"step {step}"
    assert all(torch.equal(x, y) for x, y in zip(_state(plain), _state(guarded)))


def test_adamw_runs_fused_on_cuda_and_as_the_foreach_reference_on_the_cpu():
    model = _model()
    assert not build_optimizer(model, TrainConfig(), CPU).defaults["fused"]
    assert build_optimizer(model, TrainConfig(), CPU, fused=True).defaults["fused"]
    mixed = build_optimizer(model, TrainConfig(optimizer="muon"), CPU, fused=True)
    assert mixed.optimizers["adamw"].defaults["fused"]
