"""A figure measured more than once and how far its measurements lie apart (`Spread`): the one
form of every benchmark's spread, a speedup over batches and rounds, a ratio round by round, a
figure over seeds. No torch; it imports nothing from bytemtp, so every floor can use it.

A spread is its central figure (`mid`), the lowest and the highest measurement (`low`, `high`)
and, where the result keeps them, the measurements themselves (`runs`). Which centre a figure has
is its measurement's choice, made by the constructor: the median of rounds (`Spread.of`, and
`Spread.ratios` of two series round by round), the mean over seeds (`Spread.mean_of`), or a
figure of its own beside the runs (`Spread.around`: a speedup over all the bytes, a ratio best
against best). `format` writes it as the tables do, `1.52x (0.86-2.11)`.

The trade-off: the JSON forms predate this type, and the files the benches wrote are read back, so
a spread does not choose its keys; the result that holds one names them. `to_dict` gives the
nested form (`{"median": ..., "min": ..., "max": ...}`, the centre's key and the runs' key named by
the caller) and `flat` the form beside its neighbours (`speedup`, `speedup_min`, `speedup_max`
and `speedup_runs`); `from_dict` and `from_flat` read them back.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """A figure's centre and range over its measurements (see the module docstring)."""
    mid: float  # the central figure: a median, a mean, or a figure of its own (the constructor says which)
    low: float  # the lowest measurement
    high: float  # the highest measurement
    runs: tuple[float, ...] = ()  # the measurements, where the result keeps them (empty: not kept)

    @classmethod
    def of(cls, values: Iterable[float], *, keep_runs: bool = False) -> Spread:
        """The median of `values` and their range (`keep_runs`: the values too, in their order)."""
        values = list(values)
        return cls.around(statistics.median(values), values, keep_runs=keep_runs)

    @classmethod
    def mean_of(cls, values: Iterable[float], *, keep_runs: bool = False) -> Spread:
        """The mean of `values` and their range (`keep_runs`: the values too, in their order)."""
        values = list(values)
        return cls.around(statistics.fmean(values), values, keep_runs=keep_runs)

    @classmethod
    def around(cls, mid: float, values: Iterable[float], *, keep_runs: bool = False) -> Spread:
        """`mid`, a figure of its own, with the range of `values` (`keep_runs`: the values too)."""
        values = list(values)
        return cls(mid=mid, low=min(values), high=max(values), runs=tuple(values) if keep_runs else ())

    @classmethod
    def ratios(cls, tops: Iterable[float], bottoms: Iterable[float], *, keep_runs: bool = False) -> Spread:
        """The ratios of two series taken together (one a round): their median and range."""
        return cls.of([a / b for a, b in zip(tops, bottoms)], keep_runs=keep_runs)

    @property
    def width(self) -> float:
        """The range over the centre, (high - low) / mid: how far apart the measurements lie."""
        return (self.high - self.low) / self.mid

    def format(self, form: str = "{:.2f}", *, unit: str = "") -> str:
        """The spread as the tables write it, `1.52x (0.86-2.11)` for the default `form` (a
        `str.format` template for each number) and `unit` "x" (written after the centre only)."""
        return f"{form.format(self.mid)}{unit} ({form.format(self.low)}-{form.format(self.high)})"

    def to_dict(self, mid: str = "median", *, runs: str | None = None) -> dict:
        """The nested JSON form: the centre under `mid`, then `min` and `max` (and the runs under
        `runs`, where given)."""
        out = {mid: self.mid, "min": self.low, "max": self.high}
        if runs is not None:
            out[runs] = list(self.runs)
        return out

    @classmethod
    def from_dict(cls, data: dict, mid: str = "median", *, runs: str | None = None) -> Spread:
        """`to_dict` read back."""
        return cls(mid=data[mid], low=data["min"], high=data["max"],
                   runs=tuple(data[runs]) if runs is not None else ())

    def flat(self, name: str, *, runs: bool = False) -> dict:
        """The flat JSON form beside a result's other keys: `name` (the centre), `name_min`,
        `name_max` (and `name_runs` with `runs`)."""
        out = {name: self.mid, f"{name}_min": self.low, f"{name}_max": self.high}
        if runs:
            out[f"{name}_runs"] = list(self.runs)
        return out

    @classmethod
    def from_flat(cls, data: dict, name: str, *, runs: bool = False) -> Spread:
        """`flat` read back."""
        return cls(mid=data[name], low=data[f"{name}_min"], high=data[f"{name}_max"],
                   runs=tuple(data[f"{name}_runs"]) if runs else ())
