"""`bytemtp generate` and `bytemtp bench decode` on a tiny checkpoint, as a user runs them."""

import base64
import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from bytemtp import decode
from bytemtp.checkpoint import load_model, save_checkpoint
from bytemtp.config import tiny
from bytemtp.model import ByteMTP
from bytemtp_cli.main import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, code_corpus):
    """A tiny run whose corpus has a val split (for the decode benchmark's default prompts)."""
    root = tmp_path_factory.mktemp("gen")
    cfg = tiny()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(code_corpus)))
    model = ByteMTP(cfg.model)
    model.init_weights(generator=torch.Generator().manual_seed(5))
    save_checkpoint(root / "run", step=1, model=model, config=cfg, train_state={})
    return root / "run"


def test_generate_streams_what_the_library_returns(ckpt):
    model, _ = load_model(ckpt)
    want = decode.generate(model, b"def ", max_bytes=20).output
    res = run("generate", "--ckpt", ckpt, "--prompt", "def ", "--max-bytes", 20, "--raw")
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes == want + b"\n"
    res = run("generate", "--ckpt", ckpt, "--prompt", "def ", "--max-bytes", 20, "--stats")
    assert res.exit_code == 0, res.output
    assert res.stdout == want.decode("utf-8", "replace") + "\n"
    # an untrained model's drafts are never right: the decoder says what it chose
    assert "bytes/pass" in res.stderr and "heads run:" in res.stderr and "last plan:" in res.stderr
    res = run("generate", "--ckpt", ckpt, "--prompt", "def ", "--max-bytes", 20, "--heads", 4, "--draft", "tree",
              "--raw")
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes == want + b"\n"
    res = run("generate", "--ckpt", ckpt, "--prompt", "def ", "--max-bytes", 20, "--no-speculative", "--raw")
    assert res.stdout_bytes == want + b"\n"


def test_compare_reports_speedup_and_identity(ckpt):
    res = run("generate", "--ckpt", ckpt, "--prompt", "x = ", "--max-bytes", 30, "--compare", "--heads", 4)
    assert res.exit_code == 0, res.output
    assert "speedup" in res.stderr and "outputs identical: yes" in res.stderr
    assert "speculative, 4 heads" in res.stderr
    res = run("generate", "--ckpt", ckpt, "--prompt", "x", "--compare", "--temperature", "0.5")
    assert res.exit_code != 0 and "--compare is for greedy" in res.output


def test_prompts_file_writes_one_line_per_prompt(ckpt, tmp_path):
    prompts = ["def ", "", "class A:\n", "é"]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts) + "\n")
    res = run("generate", "--ckpt", ckpt, "--prompts", path, "--batch-size", 3, "--max-bytes", 16, "--raw",
              "--stats")
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2, 3]
    model, _ = load_model(ckpt)
    for line, prompt in zip(lines, prompts):
        want = decode.generate(model, prompt.encode(), max_bytes=16).output
        assert base64.b64decode(line["output_base64"]) == want
        assert line["output"] == want.decode("utf-8", "replace")
        assert line["stats"]["bytes"] == len(want) and line["stats"]["forward_passes"] >= 1


def test_sampling_is_speculative_and_seeded(ckpt):
    # a fixed draft: the automatic one depends on measured timings, and with it the draws
    args = ("generate", "--ckpt", ckpt, "--prompt", "a", "--max-bytes", 24, "--temperature", "0.9", "--raw",
            "--heads", 4)
    a, b = run(*args, "--seed", 3), run(*args, "--seed", 3)
    assert a.exit_code == 0, a.output
    assert a.stdout_bytes == b.stdout_bytes
    res = run(*args, "--seed", 3, "--stats")
    assert "heads run:" in res.stderr  # speculative sampling by default


@pytest.mark.parametrize("args,words", [
    (("--prompt", "x", "--prompt-file", __file__), "exactly one of"),
    (("--prompt", "x", "--heads", "9"), "9 is more than the model's 8 heads"),
    (("--prompt", "x", "--draft", "tree", "--temperature", "0.5"), "sampling drafts chains"),
])
def test_user_errors_are_one_line(ckpt, args, words):
    res = run("generate", "--ckpt", ckpt, *args)
    assert res.exit_code != 0
    assert words in res.output and "Traceback" not in res.output


def test_bad_prompts_file_names_the_line(ckpt, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    res = run("generate", "--ckpt", ckpt, "--prompts", path)
    assert res.exit_code != 0 and "bad.jsonl:2" in res.output and "Traceback" not in res.output
    path.write_text("{nope\n")
    res = run("generate", "--ckpt", ckpt, "--prompts", path)
    assert res.exit_code != 0 and "bad.jsonl:1 is not JSON" in res.output


def test_bench_decode_checks_identity_and_writes_keys(ckpt, tmp_path):
    out = tmp_path / "decode.json"
    res = run("bench", "decode", "--ckpt", ckpt, "--n-prompts", 3, "--prompt-bytes", 8, "--max-bytes", 80,
              "--batch-sizes", "1,2", "--device", "cpu", "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for key in ("speedup", "speedup_min", "speedup_max", "bytes_per_forward", "pass_cost", "val_bpb"):
        assert data[key] > 0, key
    assert data["identical"] is True and data["all_identical"] is True
    assert data["speedup_min"] <= data["speedup"] * 1.0001 and data["speedup"] <= data["speedup_max"] * 1.0001
    modes = ("auto", "chain-2", "chain-4", "chain-all", "tree-4", "tree-all")
    assert [(c["batch_size"], c["mode"]) for c in data["cases"]] == [(b, m) for b in (1, 2) for m in modes]
    assert data["prompts"] == 3 and data["max_bytes"] == 80  # past the context of 64: the window slides
    assert all(c["spec_bytes_s"] > 0 and c["heads_used"] for c in data["cases"])
    assert data["pass_costs_ms"]["1x1"] > 0
    res = run("bench", "decode", "--ckpt", ckpt, "--modes", "auto,chain-x")
    assert res.exit_code != 0 and "'chain-x' is not a mode" in res.output


def test_bench_all_writes_one_json(ckpt, code_corpus, tmp_path):
    out = tmp_path / "all.json"
    res = run("bench", "all", "--ckpt", ckpt, "--data", code_corpus, "--preset", "tiny", "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data) == {"summary", "train_step", "loader", "decode", "eval"}
    assert data["summary"]["decode.identical"] is True and data["summary"]["loader.ratio"] > 0
    assert "train_step.time_ratio" in res.stdout
    res = run("bench", "all", "--ckpt", tmp_path / "none")
    assert res.exit_code != 0 and "make demo" in res.output


@pytest.mark.parametrize("command", [("generate", "--prompt", "x"), ("eval",), ("eval-task", "poly"),
                                     ("bench", "decode"), ("plot",)])
def test_a_bad_device_is_the_line_train_gives(ckpt, command):
    args = [*command, ckpt] if command == ("plot",) else [*command, "--ckpt", ckpt]
    res = run(*args, "--device", "gpu")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines() == ["Error: --device='gpu' is not allowed; choose auto, cpu, cuda or cuda:N"]
    train = run("train", "--resume", ckpt.parent / "none", "--steps", 1, "--device", "gpu")
    assert train.output == res.output


@pytest.mark.parametrize("command", [("eval",), ("eval-task", "poly"), ("bench", "decode")])
def test_an_unwritable_json_path_stops_before_the_work(ckpt, tmp_path, monkeypatch, command):
    import bytemtp.checkpoint

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr(bytemtp.checkpoint, "load_model", never)
    res = run(*command, "--ckpt", ckpt, "--json", tmp_path / "missing-folder" / "e.json")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "missing-folder does not exist" in res.output and len(res.output.strip().splitlines()) == 1
    res = run(*command, "--ckpt", ckpt, "--json", tmp_path)
    assert res.exit_code == 1 and "is a directory" in res.output


def test_eval_json_to_stdout(ckpt):
    res = run("eval", "--ckpt", ckpt, "--batches", 1, "--device", "cpu", "--json", "-")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["bpb"]

