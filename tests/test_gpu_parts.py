"""The GPU-check parts (scripts/gpu/) run on the CPU with --dry-run: the preparation of what they
carry, then each part, each writing its JSON with every command PASS (SKIP only where the dry run
leaves out a compile or another dtype of a command that ran). They run the same commands as on a
GPU, eager and tiny, so that a part never meets the GPU broken. Minutes on two busy cores: slow."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # spread over the workers: the suite's longest tests beside the multi-process group

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "gpu"


def run_part(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), "--dry-run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def part_json(out: Path, name: str, done: subprocess.CompletedProcess) -> dict:
    assert (out / f"{name}.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / f"{name}.json").read_text())
    assert data["part"] == name and data["dry_run"] is True and data["device"] == "cpu"
    assert (out / f"{name}.log").stat().st_size > 0
    bad = [(r["name"], r["status"], r["note"]) for r in data["results"]
           if r["status"] == "FAIL" or (r["status"] == "SKIP" and not r["note"].startswith("dry run"))]
    assert not bad, bad
    assert done.returncode == 0, done.stdout[-3000:]
    return data


@pytest.fixture(scope="module")
def carry(tmp_path_factory):
    """What prepare.py carries, made tiny: a tuned tiny model, its corpus's val split, prompts."""
    out = tmp_path_factory.mktemp("carry")
    done = subprocess.run([sys.executable, str(SCRIPTS / "prepare.py"), "--dry-run", "--out", str(out),
                           "--prompts", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MiB" in done.stdout
    return out


def test_prepare_writes_what_the_parts_carry(carry):
    assert sorted((carry / "model" / "checkpoints").glob("step-*/model.safetensors"))
    assert not list(carry.rglob("optimizer.pt"))
    assert (carry / "corpus" / "manifest.json").exists() and (carry / "corpus" / "val").is_dir()
    prompts = [json.loads(line) for line in (carry / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 4 and all(p["prompt"] for p in prompts)


def test_decode_part(carry, tmp_path):
    done = run_part("decode.py", "--carry", str(carry), "--out", str(tmp_path), "--work", str(tmp_path / "work"))
    data = part_json(tmp_path, "decode", done)
    assert len(data["cases"]) == 2  # one greedy, one sampled case; the others are the same commands
    for case in data["cases"].values():
        assert case["val_bpb"] is not None and case["cases"]
    assert "plain ms" in done.stdout


def test_train_part(tmp_path):
    done = run_part("train.py", "--out", str(tmp_path), "--work", str(tmp_path / "work"))
    data = part_json(tmp_path, "train", done)
    assert set(data["runs"]) == {"eager"}
    assert "8 heads / next-byte" in done.stdout


def test_smoke_part(tmp_path):
    """Every command that takes --device, PASS on the CPU (the gpu-marked tests skip themselves)."""
    done = run_part("smoke.py", "--out", str(tmp_path), "--work", str(tmp_path / "work"))
    data = part_json(tmp_path, "smoke", done)
    names = {r["name"] for r in data["results"] if r["status"] == "PASS"}
    assert {"train", "tune-heads", "eval", "generate greedy", "generate sampled", "bench decode", "bench serve",
            "serve", "eval-task poly", "export --format hf", "pytest -m gpu"} <= names
