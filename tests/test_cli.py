import json
import pathlib
import shutil
import subprocess
import sys
import types

import pytest
from click.testing import CliRunner

from bytemtp_cli.main import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_config_shows_resolved_settings_and_counts():
    res = run("config", "--preset", "tiny", "--set", "model.n_future=4")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[: res.output.index("\n}\n") + 2])
    assert data["model"]["n_future"] == 4
    assert "6 trunk layers + 4 transformer heads" in res.output
    assert "total" in res.output


@pytest.mark.parametrize("args,words", [
    (["config", "--set", "model.widht=3"], "unknown setting model.widht"),
    (["config", "--set", "model.head_type=mlp"], "choose one of transformer, linear, causal"),
    (["config", "--set", "model.n_layers=4"], "use n_layers >= 9"),
    (["config", "--config", "/nonexistent/run.toml"], "cannot read config file"),
])
def test_user_errors_are_one_line(args, words):
    res = run(*args)
    assert res.exit_code != 0
    assert words in res.output
    assert "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_keys_lists_every_setting():
    res = run("config", "--keys")
    assert res.exit_code == 0
    assert "model.n_future" in res.output and "loss.mask_after_eos" in res.output


def test_keys_show_the_presets_values():
    from bytemtp.config import small, tiny

    def value(output, key):
        line = next(line for line in output.splitlines() if line.split()[:1] == [key])
        return line.split()[1]

    assert tiny().model.d_model != small().model.d_model
    res = run("config", "--keys", "--preset", "tiny", "--set", "train.lr=0.003")
    assert res.exit_code == 0, res.output
    assert value(res.output, "model.d_model") == str(tiny().model.d_model)
    assert value(res.output, "model.seq_len") == str(tiny().model.seq_len)
    assert value(res.output, "train.lr") == "0.003" and "value (tiny)" in res.output
    assert value(run("config", "--keys").output, "model.d_model") == str(small().model.d_model)


def test_console_script_and_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "bytemtp_cli", "--version"], capture_output=True,
                         text=True, check=True)
    assert "bytemtp" in out.stdout
    script = pathlib.Path(sys.executable).parent / "bytemtp"  # the one installed with this python
    bad = subprocess.run([str(script if script.exists() else "bytemtp"), "config", "--preset", "tiny", "--set", "loss.head_weights=x"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "loss.head_weights" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_bench_train_step_writes_all_keys(tmp_path):
    path = tmp_path / "bench.json"
    res = run("bench", "train-step", "--preset", "tiny", "--steps", "1", "--warmup", "0",
              "--batch-size", "2", "--json", str(path))
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    for key in ("ntp_step_s", "mtp_step_s", "mtp_plain_step_s", "ntp_peak_mb", "mtp_peak_mb",
                "mtp_plain_peak_mb", "time_ratio", "memory_ratio", "plain_memory_ratio"):
        assert data[key] > 0, key
    assert data["time_ratio"] == pytest.approx(data["mtp_step_s"] / data["ntp_step_s"])
    assert data["memory_ratio"] == pytest.approx(data["mtp_peak_mb"] / data["ntp_peak_mb"])
    assert "time_ratio" in res.output
    # one timed round shows no spread: its pair ratio is the whole result, flagged as unjudged
    assert data["time_ratio_min"] == data["time_ratio_median"] == data["time_ratio_max"] > 0
    assert data["time_ratio_runs"] == [data["time_ratio_min"]] and data["time_ratio_spread"] == 0
    assert data["time_ratio_noisy"] is True and "3 or more" in data["time_ratio_note"]
    assert data["steps"] == 1 and data["warmup"] == 0 and data["steps_per_sample"] == 1
    assert "note: 1 timed round(s)" in res.output


def test_inspect_reports_a_checkpoint_and_damage(tmp_path):
    import torch

    from bytemtp.config import tiny
    from bytemtp.model.model import ByteMTP
    from bytemtp.runtime.checkpoint import save_checkpoint

    cfg = tiny()
    model = ByteMTP(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(tmp_path / "run", step=7, model=model, config=cfg,
                    train_state={"bytes_seen": 1234}, optimizer=optimizer)
    res = run("inspect", str(tmp_path / "run"))
    assert res.exit_code == 0, res.output
    assert "step        7" in res.output and f"{model.num_params():,} parameters" in res.output
    assert "bytes_seen" in res.output and "model.safetensors" in res.output
    weights = tmp_path / "run" / "checkpoints" / "step-00000007" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    res = run("inspect", str(tmp_path / "run"))
    assert res.exit_code != 0 and "model.safetensors" in res.output and "truncated or corrupt" in res.output
    res = run("inspect", str(tmp_path / "nothing"))
    assert res.exit_code != 0 and "does not exist" in res.output


def _source_tree(root):
    src = root / "src"
    (src / "pkg").mkdir(parents=True)
    for i in range(30):
        (src / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (i + 1))
    (src / "pkg" / "dup.py").write_text("def f1(x):\n    return x * 1\n" * 2)  # a duplicate of m1
    (src / "notes.txt").write_text("not code")
    return src


def test_prep_and_corpus_info(tmp_path):
    src = _source_tree(tmp_path)
    out = tmp_path / "corpus"
    res = run("prep", str(src), "--out", str(out), "--include", "*.py", "--val-fraction", "0.1",
              "--licence", "MIT")
    assert res.exit_code == 0, res.output
    assert "duplicates removed: 1" in res.output and "train" in res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == 30
    info = run("corpus-info", str(out))
    assert info.exit_code == 0 and "MIT" in info.output and "ratio" in info.output
    raw = run("corpus-info", str(src))
    assert raw.exit_code == 0 and "documents" in raw.output
    again = run("prep", str(src), "--out", str(out))
    assert again.exit_code != 0 and "corpus" in again.output and "Traceback" not in again.output


@pytest.mark.parametrize("args,words", [
    (["prep", "/nonexistent/src", "--out", "/tmp/x-never"], "does not exist"),
    (["corpus-info", "/nonexistent/corpus"], "does not exist"),
])
def test_data_errors_are_one_line(args, words):
    res = run(*args)
    assert res.exit_code != 0 and words in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_corrupt_shard_is_one_line(tmp_path):
    src = _source_tree(tmp_path)
    out = tmp_path / "corpus"
    assert run("prep", str(src), "--out", str(out), "--val-fraction", "0").exit_code == 0
    shard = next((out / "train").glob("shard-00000.*"))  # the name depends on the corpus format
    shard.write_bytes(shard.read_bytes()[:-7])
    res = run("corpus-info", str(out / "train"))
    assert res.exit_code != 0 and "truncated" in res.output and shard.name in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the loader benchmark compares against the zstd command")
def test_bench_loader(tmp_path, monkeypatch):
    import bytemtp.bench

    src = _source_tree(tmp_path)
    out = tmp_path / "corpus"
    assert run("prep", str(src), "--out", str(out), "--val-fraction", "0").exit_code == 0
    # the timed runs take the seconds given here, in turn: zstd 0.5 s, then the loader's epoch 2 s
    reads = iter([0.0, 0.5, 0.5, 2.5])
    monkeypatch.setattr(bytemtp.bench, "time", types.SimpleNamespace(perf_counter=lambda: next(reads)))
    path = tmp_path / "loader.json"
    res = run("bench", "loader", "--data", str(out), "--seq-len", "64", "--repeats", "1", "--json", str(path))
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    shard = out / "train" / "shard-00000.zst"
    # the shard's documents, all of the source files but the duplicate, as `zstd -dc` prints them
    size = len(subprocess.run(["zstd", "-dcq", str(shard)], capture_output=True, check=True).stdout)
    assert size == sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and p.name != "dup.py")
    assert data["shard"] == str(shard) and data["decompressed_bytes"] == size
    assert data["compressed_bytes"] == shard.stat().st_size
    assert (data["zstd_s"], data["loader_s"]) == (0.5, 2.0)
    assert data["zstd_mb_s"] == pytest.approx(size / 0.5 / 1e6) and data["loader_mb_s"] == pytest.approx(size / 2e6)
    assert data["ratio"] == pytest.approx(0.25) and data["pair_ratios"] == [pytest.approx(0.25)]


def test_bench_quality_takes_a_device(code_corpus, tmp_path):
    # bench quality had no --device: it trained on the preset's train.device whatever the user had
    res = run("bench", "quality", "--preset", "tiny", "--data", str(code_corpus), "--device", "gpu")
    assert res.exit_code != 0 and "Traceback" not in res.output and "--device" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = run("bench", "quality", "--preset", "tiny", "--data", str(code_corpus), "--steps", "1", "--eval-batches", "1",
              "--out", str(tmp_path / "runs"), "--device", "cpu", "--json", "-")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["device"] == "cpu" and data["mtp_bpb"] > 0 and data["ntp_bpb"] > 0
    for name, teacher in (("ntp", 0.0), ("mtp", 0.0), ("mtp_teacher", 1.0)):
        saved = json.loads((tmp_path / "runs" / name / "run-config.json").read_text())
        assert saved["train"]["device"] == "cpu" and saved["loss"]["teacher_weight"] == teacher
    # the teacher arm trained on the same bytes: the same first step, so the same head-1 loss
    first = [json.loads((tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()[0])
             for name in ("mtp", "mtp_teacher")]
    assert first[0]["head_loss"][0] == first[1]["head_loss"][0] and first[0]["bytes"] == first[1]["bytes"]
    assert data["teacher_bpb_gap"] == pytest.approx(data["teacher_head_bpb"][0] - data["mtp_bpb"])
    assert set(data["drafts"]) == {"mtp", "mtp_teacher"}
    assert set(data["drafts"]["mtp"]["decoded_bytes_per_forward"]) == {"chain-all", "tree-all"}
