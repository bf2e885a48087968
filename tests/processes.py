"""Commands that launch process trees (torchrun and its ranks), run so that a hang says where it hung.

`run` is `subprocess.run(..., capture_output=True, text=True, timeout=...)`, except on a timeout:
every process of the tree (the command, torchrun's agent, the ranks in their own sessions) gets
SIGABRT, and with PYTHONFAULTHANDLER set each writes every thread's Python stack to its stderr
before it dies; the test then fails with those stacks instead of a bare TimeoutExpired.
"""

import os
import signal
import subprocess
from pathlib import Path

import pytest


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, children before their own children (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def run(command: list[str], *, env: dict, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(command, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = descendants(proc.pid)
        for pid in [*reversed(tree), proc.pid]:  # the ranks first: the agent would kill them itself
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            for pid in [proc.pid, *tree]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pytest.fail(f"timed out after {timeout:g} s: {' '.join(command)}\n--- stdout\n{out[-3000:]}\n"
                    f"--- stderr, with every process's stacks\n{err[-20000:]}", pytrace=False)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
