"""Checkpoints: exact round trip, atomic saves, scanning and pruning, readable errors, no pickle."""

import dataclasses
import json
import os
import pickle
import shutil

import pytest
import torch
from doubles import build_model
from safetensors import SafetensorError, safe_open

from bytemtp.config import ModelConfig
from bytemtp.config_io import tiny
from bytemtp.model.layout import build_layout
from bytemtp.runtime import checkpoint
from bytemtp.runtime.checkpoint import (CheckpointError, latest_checkpoint, list_checkpoints, load_config, load_model,
                                        load_train_state, resolve_checkpoint, save_checkpoint)


def make_model(cfg, seed=0):
    return build_model(cfg.model, seed)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train_step(model, optimizer, ids):
    optimizer.zero_grad()
    model.logits(ids, layout=build_layout(model, ids)).float().logsumexp(-1).mean().backward()
    optimizer.step()


def batch():
    return torch.randint(0, 258, (2, 16), generator=torch.Generator().manual_seed(1))


def save(run_dir, step, *, cfg=None, seed=0, optimizer=False, **kwargs):
    cfg = cfg or tiny()
    model = make_model(cfg, seed)
    opt = make_optimizer(model) if optimizer else None
    path = save_checkpoint(run_dir, step=step, model=model, config=cfg,
                           train_state={"bytes_seen": step * 100}, optimizer=opt, **kwargs)
    return path, model


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def steps(run_dir):
    return [int(p.name.removeprefix("step-")) for p in list_checkpoints(run_dir)]


# --- round trip --------------------------------------------------------------------------------


def test_round_trip_weights_config_train_state_and_optimizer(tmp_path):
    cfg = dataclasses.replace(tiny(), model=dataclasses.replace(tiny().model, dropout=0.1))
    model, ids = make_model(cfg), batch()
    optimizer = make_optimizer(model)
    train_step(model, optimizer, ids)
    train_state = {"bytes_seen": 12345, "loader": {"file": "a.zst", "offset": 7, "carry": [1, 2]},
                   "rng": torch.Generator().manual_seed(3).get_state().tolist(),
                   "metrics": {"loss": 1.25, "bpb": float("inf")}}
    path = save_checkpoint(tmp_path, step=123, model=model, config=cfg, train_state=train_state,
                           optimizer=optimizer)

    assert path == tmp_path / "checkpoints" / "step-00000123"
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "optimizer.pt",
                                        "train_state.json"]
    with safe_open(path / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format_version": "1"}
    meta = json.loads((path / "config.json").read_text())
    assert meta["format_version"] == 1 and "bytemtp_version" in meta

    loaded, loaded_cfg = load_model(path)
    assert loaded_cfg == cfg and load_config(path) == cfg
    assert not loaded.training
    assert_same_weights(loaded, model)
    assert torch.equal(loaded.rope_cos, model.rope_cos)
    model.eval()
    layout = build_layout(model, ids)
    assert torch.equal(loaded.logits(ids, layout=layout), model.logits(ids, layout=layout))
    model.train()

    fresh = make_model(cfg, seed=5)
    fresh_opt = make_optimizer(fresh)
    state = load_train_state(path, model=fresh, optimizer=fresh_opt)
    assert state == {**train_state, "step": 123}
    assert_same_weights(fresh, model)
    want, got = optimizer.state_dict(), fresh_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for idx in want["state"]:
        for name, value in want["state"][idx].items():
            assert torch.equal(got["state"][idx][name], value), (idx, name)

    # one more step from the loaded state lands on the same weights as from the original
    # (dropout is on: both draw the same masks from the same seeded global RNG state)
    for m, opt in ((model, optimizer), (fresh, fresh_opt)):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            train_step(m, opt, ids)
    assert_same_weights(fresh, model)


def test_export_without_optimizer(tmp_path):
    path, model = save(tmp_path, 4)
    assert not (path / "optimizer.pt").exists()
    assert list_checkpoints(tmp_path) == [path]
    loaded, _ = load_model(tmp_path)
    assert_same_weights(loaded, model)
    fresh = make_model(tiny(), seed=9)
    assert load_train_state(path, model=fresh)["step"] == 4
    assert_same_weights(fresh, model)
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        load_train_state(path, model=fresh, optimizer=make_optimizer(fresh))


# --- atomicity ---------------------------------------------------------------------------------


def failing_torch_save(obj, f, *args, **kwargs):
    with open(f, "wb") as out:
        out.write(b"PK\x03\x04 half an optimizer")
    raise OSError(28, "No space left on device")


def failing_save_file(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"half\":")
    raise OSError(28, "No space left on device")


def failing_save_file_as_safetensors(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"\x10\x00")
    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                          'message: "No space left on device" })')


@pytest.mark.parametrize("target, name, fake", [(torch, "save", failing_torch_save),
                                                (checkpoint, "save_file", failing_save_file),
                                                (checkpoint, "save_file", failing_save_file_as_safetensors)],
                         ids=["optimizer.pt", "model.safetensors", "safetensors-error"])
def test_failed_save_leaves_previous_checkpoint(tmp_path, monkeypatch, target, name, fake):
    first, model = save(tmp_path, 1, optimizer=True)
    monkeypatch.setattr(target, name, fake)
    with pytest.raises(CheckpointError) as error:
        save(tmp_path, 2, seed=1, optimizer=True)
    monkeypatch.undo()
    message = str(error.value)
    assert "the disk is full" in message and "step-00000001 is intact" in message
    assert len(message.splitlines()) == 1

    assert os.listdir(tmp_path / "checkpoints") == ["step-00000001"]
    assert latest_checkpoint(tmp_path) == first
    loaded, _ = load_model(tmp_path)
    assert_same_weights(loaded, model)


def test_replacing_a_step(tmp_path, monkeypatch):
    save(tmp_path, 1, seed=0)
    path, second = save(tmp_path, 1, seed=1)
    assert os.listdir(tmp_path / "checkpoints") == ["step-00000001"]
    assert_same_weights(load_model(path)[0], second)

    # the new directory fails to move into place: the old one is put back
    rename = os.rename

    def failing_rename(src, dst):
        if str(src).endswith(f"-{os.getpid()}") and ".tmp-step-" in str(src):
            raise OSError(5, "Input/output error")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(CheckpointError, match="failed"):
        save(tmp_path, 1, seed=2)
    monkeypatch.undo()
    assert os.listdir(tmp_path / "checkpoints") == ["step-00000001"]
    assert_same_weights(load_model(path)[0], second)


# --- scanning and pruning ----------------------------------------------------------------------


def test_latest_is_found_by_scanning(tmp_path):
    save(tmp_path, 1, keep=10)
    two, _ = save(tmp_path, 2, keep=10)
    root = tmp_path / "checkpoints"
    shutil.copytree(two, root / ".tmp-step-00000009-4242")  # a crashed save, complete-looking
    shutil.copytree(two, root / "step-00000007")
    (root / "step-00000007" / "model.safetensors").unlink()  # incomplete
    (root / "notes").mkdir()

    assert steps(tmp_path) == [1, 2]
    assert latest_checkpoint(tmp_path) == two
    assert latest_checkpoint(tmp_path / "elsewhere") is None

    save(tmp_path, 3, keep=10)
    assert not (root / ".tmp-step-00000009-4242").exists()  # stale temp dirs go on the next save
    assert steps(tmp_path) == [1, 2, 3]


def test_pruning_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step)
    assert steps(tmp_path) == [3, 4]
    save(tmp_path, 10, keep=1)
    assert steps(tmp_path) == [10]
    save(tmp_path, 5)  # an older step than the newest is still kept when just written
    assert steps(tmp_path) == [5, 10]
    with pytest.raises(CheckpointError, match="keep"):
        save(tmp_path, 11, keep=0)
    assert steps(tmp_path) == [5, 10]


# --- errors ------------------------------------------------------------------------------------


def truncate(path, size):
    data = path.read_bytes()
    path.write_bytes(data[:size if size >= 0 else len(data) // 2])


def rewrite_config(path, edit):
    meta = json.loads((path / "config.json").read_text())
    edit(meta)
    (path / "config.json").write_text(json.dumps(meta))


def other_weights(path, tmp_path, model_cfg):
    cfg = dataclasses.replace(tiny(), model=model_cfg)
    other, _ = save(tmp_path / "other", 1, cfg=cfg)
    shutil.copy(other / "model.safetensors", path / "model.safetensors")


CORRUPTIONS = {
    "truncated header": ("model.safetensors", lambda p, t: truncate(p / "model.safetensors", 5)),
    "truncated weights": ("model.safetensors", lambda p, t: truncate(p / "model.safetensors", -1)),
    "missing config": ("config.json", lambda p, t: (p / "config.json").unlink()),
    "invalid json": ("config.json", lambda p, t: (p / "config.json").write_text('{"format_version": 1,')),
    "unknown format": ("config.json", lambda p, t: rewrite_config(p, lambda m: m.update(format_version=99))),
    "invalid config": ("config.json",
                       lambda p, t: rewrite_config(p, lambda m: m["config"]["model"].update(d_model=33))),
    "shape mismatch": ("model.safetensors", lambda p, t: other_weights(
        p, t, ModelConfig(n_layers=10, d_model=64, n_attn_heads=2, seq_len=64))),
    "extra heads": ("model.safetensors", lambda p, t: other_weights(
        p, t, dataclasses.replace(tiny().model, n_layers=12, n_future=10))),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_corrupt_checkpoint_errors_name_the_file(tmp_path, case):
    name, damage = CORRUPTIONS[case]
    path, _ = save(tmp_path, 1)
    damage(path, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_model(path)
    assert name in str(err.value)
    if case == "unknown format":
        assert "99" in str(err.value)
    if case == "shape mismatch":
        assert "embed.weight" in str(err.value)
        assert "(264, 64)" in str(err.value) and "(264, 32)" in str(err.value)
    if name == "model.safetensors":  # resuming into a built model reports the same
        model = make_model(tiny())
        with pytest.raises(CheckpointError, match="model.safetensors"):
            load_train_state(path, model=model)
    if name == "config.json":
        with pytest.raises(CheckpointError, match="config.json"):
            load_config(path)


def test_truncated_optimizer_and_missing_train_state(tmp_path):
    path, _ = save(tmp_path, 1, optimizer=True)
    truncate(path / "optimizer.pt", -1)
    model = make_model(tiny())
    with pytest.raises(CheckpointError, match="optimizer.pt .*truncated or corrupt"):
        load_train_state(path, model=model, optimizer=make_optimizer(model))
    (path / "train_state.json").unlink()
    with pytest.raises(CheckpointError, match="train_state.json"):
        load_train_state(path, model=model)


class RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_an_optimizer_pt_with_code_is_refused_saying_why(tmp_path):
    path, _ = save(tmp_path, 1, optimizer=True)
    torch.save({"state": {}, "param_groups": [], "payload": RunsCode()}, path / "optimizer.pt")
    model = make_model(tiny())
    with pytest.raises(CheckpointError) as error:
        load_train_state(path, model=model, optimizer=make_optimizer(model))
    message = str(error.value)
    assert "was refused" in message and "system" in message and "weights_only=True" in message
    assert "truncated" not in message and len(message.splitlines()) == 1


def test_bad_train_state_fails_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(tmp_path, step=1, model=make_model(tiny()), config=tiny(),
                        train_state={"rng": torch.zeros(3)})
    assert list_checkpoints(tmp_path) == []


# --- no pickle, resolving ----------------------------------------------------------------------


def test_load_model_executes_no_pickle(tmp_path, monkeypatch):
    _, model = save(tmp_path, 1, optimizer=True)

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle executed while loading for inference")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    loaded, _ = load_model(tmp_path)
    assert_same_weights(loaded, model)


def test_resolve_checkpoint(tmp_path):
    save(tmp_path, 1)
    two, _ = save(tmp_path, 2)
    assert resolve_checkpoint(tmp_path) == two
    assert resolve_checkpoint(str(tmp_path)) == two
    one = tmp_path / "checkpoints" / "step-00000001"
    assert resolve_checkpoint(one) == one
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint found in .*empty"):
        resolve_checkpoint(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_checkpoint(two / "config.json")
    assert resolve_checkpoint(tmp_path / "checkpoints") == two  # the folder of a run's checkpoints


def test_a_checkpoint_saved_before_value_embeddings_and_the_faster_fade_loads_decodes_and_resumes(short_run):
    """A run saved before model.value_embeds existed (its config.json has no such key) and before
    `small` faded its heads over a quarter of the schedule (its config says 0.5): it loads, decodes
    and resumes with its own settings, not the preset's new ones."""
    from click.testing import CliRunner

    from bytemtp.decoding import decode
    from bytemtp_cli.main import main

    ckpt = latest_checkpoint(short_run)
    saved = json.loads((ckpt / "config.json").read_text())
    del saved["config"]["model"]["value_embeds"]
    saved["config"]["loss"].update(head_schedule="reverse", head_schedule_span=0.5)
    (ckpt / "config.json").write_text(json.dumps(saved))
    run_config = json.loads((short_run / "run-config.json").read_text())
    run_config["model"].pop("value_embeds", None)
    run_config["loss"].update(head_schedule="reverse", head_schedule_span=0.5)
    (short_run / "run-config.json").write_text(json.dumps(run_config))
    model, cfg = load_model(ckpt)
    assert cfg.model.value_embeds == 0 and not any("value_embed" in n for n, _ in model.named_parameters())
    assert len(decode.generate(model, b"ab", max_bytes=6).output) <= 6
    res = CliRunner().invoke(main, ["train", "--resume", str(short_run), "--steps", "3"])
    assert res.exit_code == 0, res.output
    resumed = load_config(latest_checkpoint(short_run))
    assert resumed.loss.head_schedule_span == 0.5 and resumed.model.value_embeds == 0
