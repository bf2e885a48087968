"""bytemtp.evaluation.execution's child end to end: its limits, what it disables, what its audit hook
refuses and says, what it imports, and how its end reads (the wall-clock kill, the CPU limit, a
signal), the same under both sandboxes. The guard's parts in the test process are in
tests/test_guard.py; the escapes themselves, under both sandboxes, in tests/test_sandbox.py."""

import os
import pathlib

import pytest

from bytemtp.evaluation import execution, guard
from bytemtp.evaluation.execution import Isolation, Sandbox, run_program
from bytemtp.evaluation.guard import FAILED, PASSED

GUARD = Isolation(Sandbox.GUARD, allow_unsandboxed=True)  # the guard alone: its messages name host paths
BOTH = [pytest.param(Isolation(Sandbox.BWRAP), id="bwrap", marks=pytest.mark.bwrap), pytest.param(GUARD, id="guard")]


# --- the child, end to end ---------------------------------------------------------------------


def test_the_hook_says_what_it_refused(root):
    victim = os.path.join(os.path.dirname(root), "victim.txt")
    reading = "outside the working directory and the Python installation is refused"
    programs = {  # os.remove and subprocess.Popen are None; restored, the hook stops them
        f"open({victim!r}, 'w').write('gone')": f"writing {victim!r} outside the working directory is refused",
        f"import posix\nposix.remove({victim!r})": f"os.remove on {victim!r} outside the working directory is refused",
        f"import importlib, os\nimportlib.reload(os)\nos.remove({victim!r})":
            f"os.remove on {victim!r} outside the working directory is refused",
        "import importlib, subprocess\nimportlib.reload(subprocess)\nsubprocess.run(['true'])":
            "subprocess.Popen is refused",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})": "os.posix_spawn is refused",
        "import socket\nsocket.socket().connect(('127.0.0.1', 9))": "socket.connect is refused",
        f"open({victim!r}).read()": f"reading {victim!r} {reading}",
        f"import os\nos.listdir({os.path.dirname(root)!r})": f"listing {os.path.dirname(root)!r} {reading}",
        "import sys\ndel sys.modules['ctypes']\nimport ctypes": "importing ctypes is refused",
        "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess":
            "importing _posixsubprocess is refused",
        "import sqlite3\nsqlite3.connect('file:/etc/x.db', uri=True)":
            "sqlite3.connect to the URI 'file:/etc/x.db' is refused",
        "import gc\ngc.get_objects()": "gc.get_objects is refused",
        "import sys\nsys.settrace(print)": "sys.settrace is refused",
        "import os\nos.stat('/etc/hostname')": f"reading '/etc/hostname' {reading}",
        "import os\nos.readlink('/etc/alternatives')": f"reading '/etc/alternatives' {reading}",
    }
    for source, message in programs.items():
        outcome = run_program(source, isolation=GUARD)
        assert (outcome.verdict, outcome.detail) == (FAILED, "PermissionError: " + message), source
    # the guard's own names for the originals of the metadata calls are gone from its frames' globals
    for name in ("resolve", "lstat", "readlink"):
        outcome = run_program(f"import sys\nsys._getframe().f_back.f_globals[{name!r}]", isolation=GUARD)
        assert (outcome.verdict, outcome.detail) == (FAILED, f"KeyError: {name!r}")
    assert pathlib.Path(victim).read_text() == "keep me"
    outcome = run_program("import ctypes", isolation=GUARD)  # as where ctypes is not built: numpy imports
    assert (outcome.verdict, outcome.detail) == \
        (FAILED, "ModuleNotFoundError: import of ctypes halted; None in sys.modules")


@pytest.mark.parametrize("isolation", BOTH)
def test_the_destructive_functions_are_none_but_putenv(isolation):
    names = {"os": guard.DISABLED_OS, "shutil": guard.DISABLED_SHUTIL, "builtins": guard.DISABLED_BUILTINS}
    names |= {module: functions for module, functions in guard.UNAUDITED.items() if module != "posix"}
    source = "import builtins, os, shutil, signal, subprocess, sys, _posixsubprocess, _signal, posix\n"
    source += "".join(f"assert getattr({module}, {name!r}, None) is None, {module + '.' + name!r}\n"
                      for module, ns in names.items() for name in ns)
    source += "".join(f"assert getattr(posix, {name!r}, None) is None, {name!r}\n" for name in guard.UNAUDITED["posix"])
    source += "".join(f"assert sys.modules[{m!r}] is None, {m!r}\n" for m in guard.BLOCKED_MODULES)
    source += "assert subprocess.Popen is None and os.putenv is not None\n"
    outcome = run_program(source, isolation=isolation)
    assert (outcome.verdict, outcome.detail) == (PASSED, "")


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="reads the limits from /proc")
@pytest.mark.parametrize("isolation", BOTH)
def test_the_child_runs_within_its_limits(isolation):
    source = ("rows = {line[:26].strip(): line[26:].split()[:2] for line in open('/proc/self/limits')}\n"
              "raise ValueError([rows[k] for k in ('Max address space', 'Max cpu time', 'Max file size',"
              " 'Max core file size')])\n")
    outcome = run_program(source, isolation=isolation, timeout=2.5, memory_mb=300, file_mb=5)
    assert outcome.verdict == FAILED
    want = [[str(300 << 20)] * 2, ["4", "5"], [str((5 << 20) // guard.WRITES)] * 2, ["0", "0"]]  # a file's share
    assert outcome.detail == f"ValueError: {want}"


@pytest.mark.parametrize("isolation", BOTH)
def test_the_child_imports_neither_bytemtp_nor_torch_and_its_directory_is_off_sys_path(isolation):
    here = os.path.dirname(guard.__file__)
    source = ("import sys\n"
              "assert not [m for m in sys.modules if m.split('.')[0] in ('bytemtp', 'torch', 'numpy')], sys.modules\n"
              f"assert {here!r} not in sys.path, sys.path\n"
              "assert sys.modules['__main__'].__dict__ is globals(), 'the program is not __main__'\n"
              "import json, math, hashlib, numpy, collections\n"  # the standard library and what is installed
              "assert numpy.arange(3).sum() == 3\n")
    outcome = run_program(source, isolation=isolation)
    assert (outcome.verdict, outcome.detail) == (PASSED, "")


# --- how a program ends: the limits and deaths, in the same words under both sandboxes ----------


@pytest.mark.parametrize("isolation", BOTH)
def test_a_sleeping_program_is_killed_at_the_wall_clock(isolation):
    # it uses no CPU, so only the wall-clock kill stops it (the CPU limit would stop a busy loop too)
    outcome = run_program("import time\ntime.sleep(20)\n", isolation=isolation, timeout=1.0)
    assert (outcome.verdict, outcome.detail) == (execution.TIMED_OUT, "still running after 1 s (wall clock)")
    assert outcome.seconds < 10


DEATHS = {  # program -> (verdict, detail), whatever the sandbox
    "CPU limit": ("while True:\n    pass\n", (execution.TIMED_OUT, "used its 1 s of CPU time")),
    "SIGABRT": ("import os\nos.abort()\n", (FAILED, "killed by SIGABRT")),
    "SIGSEGV": ("import faulthandler\nfaulthandler._sigsegv()\n", (FAILED, "killed by SIGSEGV")),
    "exit status": ("import os\nos._exit(3)\n", (FAILED, "exited with status 3 before it finished")),
}


@pytest.mark.parametrize("death", DEATHS)
@pytest.mark.parametrize("isolation", BOTH)
def test_a_death_reads_the_same_whatever_the_sandbox(monkeypatch, isolation, death):
    monkeypatch.setattr(execution, "cpu_seconds", lambda timeout: 1)  # the CPU limit long before the wall clock
    source, want = DEATHS[death]
    outcome = run_program(source, isolation=isolation, timeout=30.0)
    assert (outcome.verdict, outcome.detail) == want
