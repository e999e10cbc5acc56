"""`--signal [B:]SIG@SECONDS`: the warning signal a job asks for before its time limit
(and before a preemption), parsed and written back in one canonical form."""

from __future__ import annotations

import re
import signal as _signals
from dataclasses import dataclass
from typing import Final

from mgpu.spec import SpecError, _q

__all__ = ["SignalSpec", "format_signal", "parse_signal"]

MAX_SIGNAL_SECONDS: Final = 65535
"""Slurm's own bound for the lead of `--signal`."""
DEFAULT_SIGNAL_SECONDS: Final = 60
"""Slurm's lead when `@SECONDS` is left out."""
_SIGNAL_RE: Final = re.compile(r"(?:(B):)?([A-Za-z0-9+]{1,16})(?:@([0-9]{1,9}))?")
_UNCATCHABLE: Final = frozenset({_signals.SIGKILL, _signals.SIGSTOP})


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """`--signal [B:]SIG@SECONDS`: `number` sent `seconds` before the time limit (and at
    preemption, that long before the job is stopped); `batch_only`: to the job's top process
    only, else to every process of the job."""

    number: int
    seconds: int
    batch_only: bool = False

    @property
    def name(self) -> str:
        """USR1 for SIGUSR1; the number for a signal without a name (real-time ones)."""
        try:
            name = _signals.Signals(self.number).name
        except ValueError:
            return str(self.number)
        return str(self.number) if name.startswith("SIGRT") else name.removeprefix("SIG")


def parse_signal(text: str) -> SignalSpec:
    """`[B:]SIG[@SECONDS]`: SIG a name (``USR1``, ``SIGUSR1``, any case) or a number;
    SECONDS 0..65535, 60 when left out (as Slurm)."""
    m = _SIGNAL_RE.fullmatch(text.strip())
    hint = "use [B:]SIG@SECONDS, e.g. USR1@60 or B:SIGTERM@120"
    if m is None:
        raise SpecError(f"{_q(text)} is not a signal spec; {hint}")
    batch, sig, secs = m.group(1), m.group(2), m.group(3)
    if sig.isdigit():
        number = int(sig)
        if not 1 <= number <= _signals.SIGRTMAX:
            raise SpecError(f"signal number {number} does not exist; use 1-{_signals.SIGRTMAX}")
    else:
        name = sig.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        member = _signals.Signals.__members__.get(name)
        if member is None or name in ("SIGRTMIN", "SIGRTMAX"):
            raise SpecError(f"{_q(sig)} is not a signal name; use one such as USR1, USR2, TERM")
        number = int(member)
    if number in _UNCATCHABLE:
        raise SpecError(
            f"{_signals.Signals(number).name} cannot be caught, so it warns nobody; "
            "use one the job can trap, such as USR1"
        )
    seconds = DEFAULT_SIGNAL_SECONDS if secs is None else int(secs)
    if seconds > MAX_SIGNAL_SECONDS:
        raise SpecError(f"{seconds} s is too long a lead; at most {MAX_SIGNAL_SECONDS} s")
    return SignalSpec(number, seconds, batch is not None)


def format_signal(sig: SignalSpec) -> str:
    """The canonical text of a signal spec: ``B:USR1@60``."""
    return f"{'B:' if sig.batch_only else ''}{sig.name}@{sig.seconds}"
