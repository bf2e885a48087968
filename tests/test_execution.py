"""The guard of a child process (bytemtp.guard) in the test process where that is safe, and
bytemtp.execution's child end to end: its limits, what it disables, what its audit hook refuses
and says, and what it imports."""

import ast
import os
import pathlib
import sys

import pytest

from bytemtp import guard
from bytemtp.execution import DID_NOT_PARSE, FAILED, PASSED, run_program

WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@pytest.fixture
def root(tmp_path):
    """A working directory (a real path, as the child's is) beside a file and a directory outside it."""
    (tmp_path / "work").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "victim.txt").write_text("keep me")
    return os.path.realpath(tmp_path / "work")


# --- the audit hook's decision, in this process (the hook is not installed here) ---------------


def test_refusal_allows_reads_and_writes_inside_and_refuses_writes_outside(root):
    victim = os.path.join(os.path.dirname(root), "victim.txt")
    allowed = [("open", (victim, "r", os.O_RDONLY)), ("open", ("mine.txt", "w", WRITE)),
               ("open", (os.path.join(root, "sub", "f"), "a", os.O_WRONLY | os.O_APPEND)),
               ("open", (b"mine.txt", "w", WRITE)), ("open", (pathlib.Path("mine.txt"), "w", WRITE)),
               ("open", (3, "w", os.O_WRONLY)),  # a descriptor: checked when it was opened
               ("open", (None, "r", os.O_RDONLY)), ("import", ("json", None, sys.path, None, None)),
               ("os.listdir", ("/",)), ("os.remove", ("mine.txt", None)), ("os.mkdir", ("d", 0o777, None)),
               ("os.symlink", ("/etc/passwd", "link", None)),  # a link inside; writing through it is refused
               ("os.rename", ("a", "b", None, None))]
    for event, args in allowed:
        assert guard.refusal(event, args, root) is None, (event, args)
    assert guard.refusal("open", (victim, "w", WRITE), root) == \
        f"writing {victim!r} outside the working directory is refused"
    assert guard.refusal("open", ("../victim.txt", "r+", os.O_RDWR), root) == \
        "writing '../victim.txt' outside the working directory is refused"


def test_refusal_follows_links_out_of_the_working_directory(root):
    os.symlink(os.path.join(os.path.dirname(root), "outside"), os.path.join(root, "away"))
    assert guard.refusal("open", ("away/f.txt", "w", WRITE), root) == \
        "writing 'away/f.txt' outside the working directory is refused"
    assert guard.refusal("open", ("away/f.txt", "r", os.O_RDONLY), root) is None


def test_refusal_names_the_event_and_the_path_outside(root):
    victim = os.path.join(os.path.dirname(root), "victim.txt")
    cases = {("os.remove", (victim, None)): f"os.remove on {victim!r}",
             ("os.rename", ("mine.txt", victim, None, None)): f"os.rename on {victim!r}",
             ("os.link", (victim, "here.txt", None, None, True)): f"os.link on {victim!r}",
             ("os.symlink", ("x", victim, None)): f"os.symlink on {victim!r}",
             ("shutil.rmtree", (os.path.dirname(root), None)): f"shutil.rmtree on {os.path.dirname(root)!r}",
             ("os.chmod", (b"/etc/passwd", 0o777, None)): "os.chmod on b'/etc/passwd'"}
    for (event, args), start in cases.items():
        assert guard.refusal(event, args, root) == start + " outside the working directory is refused"


def test_refusal_refuses_processes_signals_directories_and_the_network_anywhere(root):
    for event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.kill",
                  "os.chdir", "socket.connect", "socket.bind", "socket.sendto"):
        assert guard.refusal(event, ("anything",), root) == f"{event} is refused"


def test_is_inside_is_the_directory_or_below_it_not_a_sibling_with_its_prefix(root):
    assert guard.is_inside(root, root) and guard.is_inside(".", root) and guard.is_inside("a/../b", root)
    assert not guard.is_inside(root + "-other/f", root)
    assert not guard.is_inside("..", root) and not guard.is_inside("/", root)


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


def test_the_guard_imports_only_the_standard_library():
    # the child runs it with -S: site-packages are on sys.path only once main has put them there
    tree = ast.parse(pathlib.Path(guard.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


# --- the child, end to end ---------------------------------------------------------------------


def test_the_hook_says_what_it_refused(root):
    victim = os.path.join(os.path.dirname(root), "victim.txt")
    programs = {  # os.remove and subprocess.Popen are None; restored, the hook stops them
        f"open({victim!r}, 'w').write('gone')": f"writing {victim!r} outside the working directory is refused",
        f"import posix\nposix.remove({victim!r})": f"os.remove on {victim!r} outside the working directory is refused",
        f"import importlib, os\nimportlib.reload(os)\nos.remove({victim!r})":
            f"os.remove on {victim!r} outside the working directory is refused",
        "import importlib, subprocess\nimportlib.reload(subprocess)\nsubprocess.run(['true'])":
            "subprocess.Popen is refused",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})": "os.posix_spawn is refused",
        "import socket\nsocket.socket().connect(('127.0.0.1', 9))": "socket.connect is refused",
    }
    for source, message in programs.items():
        outcome = run_program(source)
        assert (outcome.verdict, outcome.detail) == (FAILED, "PermissionError: " + message), source
    assert pathlib.Path(victim).read_text() == "keep me"


def test_the_destructive_functions_are_none_but_putenv():
    names = {"os": guard.DISABLED_OS, "shutil": guard.DISABLED_SHUTIL, "builtins": guard.DISABLED_BUILTINS}
    source = "import builtins, os, shutil, subprocess, sys\n"
    source += "".join(f"assert {module}.{name} is None, {module + '.' + name!r}\n"
                      for module, ns in names.items() for name in ns)
    source += "".join(f"assert sys.modules[{m!r}] is None, {m!r}\n" for m in guard.BLOCKED_MODULES)
    source += "assert subprocess.Popen is None and os.putenv is not None\n"
    outcome = run_program(source)
    assert (outcome.verdict, outcome.detail) == (PASSED, "")


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="reads the limits from /proc")
def test_the_child_runs_within_its_limits():
    source = ("rows = {line[:26].strip(): line[26:].split()[:2] for line in open('/proc/self/limits')}\n"
              "raise ValueError([rows[k] for k in ('Max address space', 'Max cpu time', 'Max file size',"
              " 'Max core file size')])\n")
    outcome = run_program(source, timeout=2.5, memory_mb=300, file_mb=5)
    assert outcome.verdict == FAILED
    want = [[str(300 << 20)] * 2, ["4", "5"], [str(5 << 20)] * 2, ["0", "0"]]
    assert outcome.detail == f"ValueError: {want}"


def test_the_child_imports_neither_bytemtp_nor_torch_and_its_directory_is_off_sys_path():
    here = os.path.dirname(guard.__file__)
    source = ("import sys\n"
              "assert not [m for m in sys.modules if m.split('.')[0] in ('bytemtp', 'torch', 'numpy')], sys.modules\n"
              f"assert {here!r} not in sys.path, sys.path\n"
              "import json, numpy\n")  # the standard library and what is installed are importable
    outcome = run_program(source)
    assert (outcome.verdict, outcome.detail) == (PASSED, "")
