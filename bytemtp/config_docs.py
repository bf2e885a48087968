"""The configuration's documentation, read back from its source: the docstring under each field
of a config dataclass (`field_docs`) and every settable key with its value and docstring
(`settings`), which `bytemtp config --keys` and the CLI's help show.

Kept apart from `bytemtp.config`, which says what the settings are, because reading source code
back (inspect, ast) is only needed to describe them. It takes the config classes as arguments and
imports nothing of bytemtp, so it sits on floor 0 beside `config`. No torch here.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import typing
from typing import Any


def settings(cls: type, prefix: str = "", *, values: Any = None) -> list[tuple[str, Any, str]]:
    """Every settable key as (dotted name, value, docstring), for help texts: the values of
    `values` (a resolved config of class `cls`, e.g. a preset) or else the dataclass defaults."""
    rows = []
    values = cls() if values is None else values
    for f in dataclasses.fields(cls):
        typ = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(typ):
            rows += settings(typ, prefix + f.name + ".", values=getattr(values, f.name))
        else:
            rows.append((prefix + f.name, getattr(values, f.name), field_docs(cls).get(f.name, "")))
    return rows


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a config dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = nxt.value.value.strip()
    return docs
