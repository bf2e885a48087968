"""The guard of a child process (bytemtp.evaluation.guard) in the test process, where that is safe:
the audit hook's decision (the hook is not installed here), the report, compiling the program, and
what the guard imports. The child end to end is in test_execution.py, the escapes in
test_sandbox.py."""

import ast
import os
import pathlib
import sys

import pytest

from bytemtp.evaluation import calls, guard
from bytemtp.evaluation.guard import DID_NOT_PARSE, FAILED, PASSED

WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@pytest.fixture
def decide(root):
    """The audit hook's decision for `root`, with this interpreter's base prefix as the installation."""
    return guard.audit_rules(root, [os.path.realpath(sys.base_prefix)])


# --- the audit hook's decision, in this process (the hook is not installed here) ---------------


def test_the_decision_allows_work_inside_and_reading_the_installation(root, decide):
    os_py = os.path.realpath(os.__file__)  # the standard library: in the installation
    allowed = [("open", ("mine.txt", "w", WRITE)), ("open", ("mine.txt", "r", os.O_RDONLY)),
               ("open", (os.path.join(root, "sub", "f"), "a", os.O_WRONLY | os.O_APPEND)),
               ("open", (b"mine.txt", "w", WRITE)), ("open", (pathlib.Path("mine.txt"), "w", WRITE)),
               ("open", (os_py, "r", os.O_RDONLY)), ("open", ("/dev/null", "r", os.O_RDONLY)),
               ("open", ("/dev/urandom", "rb", os.O_RDONLY)), ("open", ("/proc/self/limits", "r", os.O_RDONLY)),
               ("open", (None, "r", os.O_RDONLY)), ("import", ("json", None, sys.path, None, None)),
               ("import", ("_ext", os.path.realpath(sys.base_prefix) + "/lib/_ext.so", None, None, None)),
               ("os.listdir", (".",)), ("os.listdir", (None,)), ("os.scandir", (os.path.dirname(os_py),)),
               ("os.remove", ("mine.txt", None)), ("os.mkdir", ("d", 0o777, None)),
               ("os.symlink", ("/etc/passwd", "link", None)),  # a link inside; writing through it is refused
               ("os.rename", ("a", "b", None, None)), ("sqlite3.connect", (":memory:",)),
               ("sqlite3.connect", ("mine.db",)), ("object.__setattr__", (len, "__defaults__", ())),
               ("socket.__new__", (None, 2, 1, 0)), ("compile", (b"x", "<program>")), ("builtins.id", (1,))]
    for event, args in allowed:
        assert decide(event, args) is None, (event, args)


def test_the_decision_refuses_writes_outside_and_reads_outside_the_installation(root, decide):
    victim = os.path.join(os.path.dirname(root), "victim.txt")
    assert decide("open", (victim, "w", WRITE)) == f"writing {victim!r} outside the working directory is refused"
    assert decide("open", ("../victim.txt", "r+", os.O_RDWR)) == \
        "writing '../victim.txt' outside the working directory is refused"
    reading = " outside the working directory and the Python installation is refused"
    assert decide("open", (victim, "r", os.O_RDONLY)) == f"reading {victim!r}" + reading
    assert decide("open", (pathlib.Path(victim), "rb", os.O_RDONLY)) == f"reading {pathlib.Path(victim)!r}" + reading
    assert decide("open", ("/proc/1/environ", "r", os.O_RDONLY)) == "reading '/proc/1/environ'" + reading
    assert decide("os.listdir", (os.path.dirname(root),)) == f"listing {os.path.dirname(root)!r}" + reading
    assert decide("os.scandir", ("/",)) == "listing '/'" + reading


def test_the_decision_follows_links_and_descriptors_out_of_the_working_directory(root, decide):
    outside = os.path.join(os.path.dirname(root), "outside")
    os.symlink(outside, os.path.join(root, "away"))
    assert decide("open", ("away/f.txt", "w", WRITE)) == "writing 'away/f.txt' outside the working directory is refused"
    assert decide("open", ("away/f.txt", "r", os.O_RDONLY)).startswith("reading 'away/f.txt' outside")
    fd = os.open(os.path.join(os.path.dirname(root), "victim.txt"), os.O_RDONLY)
    read_end, write_end = os.pipe()
    try:  # a descriptor is the file it is open on; a pipe is no file
        assert decide("os.chmod", (fd, 0o777, -1)) == f"os.chmod on {fd!r} outside the working directory is refused"
        assert decide("os.truncate", (fd, 0)) is not None
        assert decide("open", (write_end, "w", os.O_WRONLY)) is None
    finally:
        for d in (fd, read_end, write_end):
            os.close(d)


def test_the_decision_names_the_event_and_the_path_outside(root, decide):
    victim = os.path.join(os.path.dirname(root), "victim.txt")
    cases = {("os.remove", (victim, None)): f"os.remove on {victim!r}",
             ("os.rename", ("mine.txt", victim, None, None)): f"os.rename on {victim!r}",
             ("os.link", (victim, "here.txt", None, None, True)): f"os.link on {victim!r}",
             ("os.symlink", ("x", victim, None)): f"os.symlink on {victim!r}",
             ("shutil.rmtree", (os.path.dirname(root), None)): f"shutil.rmtree on {os.path.dirname(root)!r}",
             ("os.chmod", (b"/etc/passwd", 0o777, None)): "os.chmod on b'/etc/passwd'",
             ("sqlite3.connect", (victim,)): f"sqlite3.connect on {victim!r}"}
    for (event, args), start in cases.items():
        assert decide(event, args) == start + " outside the working directory is refused"
    assert decide("sqlite3.connect", ("file:mine.db?mode=ro",)) == \
        "sqlite3.connect to the URI 'file:mine.db?mode=ro' is refused"


def test_the_decision_refuses_processes_signals_the_network_and_native_code_anywhere(decide):
    for event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.kill", "os.chdir",
                  "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo", "resource.setrlimit",
                  "gc.get_objects", "gc.get_referrers", "sqlite3.load_extension",
                  "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function"):
        assert decide(event, ("anything",)) == f"{event} is refused"


def test_the_decision_refuses_native_code_outside_the_installation_and_fresh_imports_of_what_it_took(
        root, decide, monkeypatch):
    written = os.path.join(root, "evil.cpython-311-x86_64-linux-gnu.so")
    assert decide("import", ("evil", written, None, None, None)) == \
        f"loading native code from {written!r}, outside the Python installation, is refused"
    for name in ("ctypes", "_ctypes", "_posixsubprocess", "_signal", "posix"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # as `del sys.modules[name]` in a program
        assert decide("import", (name, None, sys.path, None, None)) == f"importing {name} is refused"
    monkeypatch.setitem(sys.modules, "_ctypes", None)  # what the guard leaves: the import fails on its own
    assert decide("import", ("_ctypes", None, sys.path, None, None)) is None
    assert decide("import", ("_ctypes", os.path.realpath(sys.base_prefix) + "/_ctypes.so", None, None, None)) == \
        "importing _ctypes is refused"


def test_the_decision_reads_a_str_subclass_by_its_characters_and_keeps_its_own_functions(root, decide):
    class Liar(str):
        def startswith(self, *args):
            return True

        def split(self, *args):
            return ["mine.txt"]

    assert decide("open", (Liar("/etc/passwd"), "w", WRITE)) == \
        "writing '/etc/passwd' outside the working directory is refused"
    for attribute in ("__code__", "__defaults__", "__kwdefaults__"):
        assert decide("object.__setattr__", (guard.resolve, attribute, None)) == \
            f"changing the guard's {attribute} is refused"
    assert decide("object.__delattr__", (guard.resolve, "__defaults__")) is not None


def test_resolve_is_realpath(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    os.symlink("d/e", tmp_path / "rel")
    os.symlink(tmp_path / "d", tmp_path / "abs")
    os.symlink("../..", tmp_path / "d" / "up")
    os.symlink("loop", tmp_path / "loop")
    for path in ("rel", "rel/..", "rel/../x", "abs/e/../../d", "d/up", "d/up/x/y", "missing/../d", "d/./e//",
                 "abs/missing/..", "/", "/..", "/proc/self", "/proc/self/fd/0"):
        full = path if path.startswith("/") else f"{tmp_path}/{path}"
        assert guard.resolve(full) == os.path.realpath(full), path
    assert guard.resolve(f"{tmp_path}/loop/x") == ""  # a loop of links is no path: never inside


def test_is_inside_is_the_directory_or_below_it_not_a_sibling_with_its_prefix(root, decide):
    for inside in (root, ".", "a/../b"):
        assert decide("open", (inside, "w", WRITE)) is None, inside
    for outside in (root + "-other/f", "..", "/"):
        assert decide("open", (outside, "w", WRITE)) is not None, outside


# --- the child's other parts, in this process --------------------------------------------------


def test_the_report_is_the_verdict_and_one_line_of_detail():
    assert guard.format_report(PASSED) == b"passed\n"
    assert guard.format_report(FAILED, "ValueError:  a\n\tb ") == b"failed\nValueError: a b"
    long = guard.format_report(FAILED, "x" * 1000)
    assert long == b"failed\n" + b"x" * guard.DETAIL_CHARS
    assert guard.format_report(FAILED, "\udcff") == b"failed\n?"  # a lone surrogate is replaced


def test_compile_program_says_why_a_program_has_no_code():
    code, failure = guard.compile_program(b"x = 1\n")
    assert failure is None and code.co_filename == "<program>"
    assert guard.compile_program(b"1 +\n") == (None, (DID_NOT_PARSE, "SyntaxError: invalid syntax (<program>, line 1)"))
    assert guard.compile_program(b"x = 1\0")[1][0] == DID_NOT_PARSE
    assert guard.compile_program(b"x = '\xff'")[1][0] == DID_NOT_PARSE
    assert guard.compile_program(b"from __future__ import braces")[1][0] == DID_NOT_PARSE


@pytest.mark.parametrize("path", [guard.__file__, calls.__file__])
def test_the_guard_imports_only_the_standard_library(path):
    # the child runs it with -S: site-packages are on sys.path only once main has put them there;
    # calls.py it loads by its path
    tree = ast.parse(pathlib.Path(path).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_the_decision_counts_the_files_written_against_the_quota(root, decide):
    for i in range(guard.WRITES // 2):
        assert decide("open", (f"f{i}", "w", WRITE)) is None
        assert decide("os.mkdir", (f"d{i}", 0o777, None)) is None
    assert decide("open", ("mine.txt", "r", os.O_RDONLY)) is None  # reading counts for nothing
    assert decide("os.rename", ("f0", "g0", None, None)) is None  # nor does a rename
    assert decide("open", ("one-more", "w", WRITE)) == \
        f"writing 'one-more': more than {guard.WRITES} files opened for writing or created is refused (the run's quota)"
    assert decide("os.symlink", ("x", "l", None)).startswith("os.symlink on 'x': more than")


def test_the_decision_reads_attributes_inside_only_and_hides_the_sealed_code(root, decide):
    reading = " outside the working directory and the Python installation is refused"
    assert decide("os.getxattr", ("/etc/passwd", "user.x", True)) == "reading the attributes of '/etc/passwd'" + reading
    assert decide("os.listxattr", ("/", True)) == "reading the attributes of '/'" + reading
    assert decide("os.listxattr", (None, True)) is None
    for event in ("sys.settrace", "sys.setprofile", "sys._current_frames"):
        assert decide(event, ()) == f"{event} is refused"
    sealed = guard.sealed_call(os.readlink)
    hiding = guard.audit_rules(root, [os.path.realpath(sys.base_prefix)], (sealed,))
    assert hiding("object.__getattr__", (sealed, "__code__")) == "reading the code of the guard's metadata calls is refused"
    assert hiding("object.__getattr__", (test_the_guard_imports_only_the_standard_library, "__code__")) is None
    assert decide("object.__getattr__", (sealed, "__code__")) is None  # hidden only when asked


def test_a_sealed_call_returns_what_the_original_returns_or_raises(tmp_path):
    sealed = guard.sealed_call(os.readlink)
    os.symlink("target", tmp_path / "link")
    assert sealed(str(tmp_path / "link")) == "target"
    got = sealed(str(tmp_path / "missing"))
    assert isinstance(got, FileNotFoundError) and got.__traceback__ is None
    assert sealed.__closure__ is None and sealed.__defaults__ is None
    assert set(sealed.__globals__) == {"BaseException"}
