"""The process's "the run is stopping" state (SIGTERM, Ctrl-C, a stage's failure).

Once set (`ops.shutdown.stop_children`), no stage starts a vLLM engine or a trainer: stages in
other threads then end within seconds instead of starting new work under a flow that is going
away (a SIGTERM while two exploration shards started vLLM took 57 to 93 s to end the flow, and a
preemption notice gives 30 s). What they raise, `RunStopped`, says why the run stopped, so that
is what the stage's failure record says.
"""

from __future__ import annotations

import signal
import threading

_stopping = threading.Event()
_reason = "the run was stopped"


class RunStopped(RuntimeError):
    """Refused or abandoned work because the run is stopping."""


def stop_run(reason: str) -> None:
    global _reason
    _reason = reason  # before the event: a thread that sees it set reads this reason
    _stopping.set()


def stopping() -> bool:
    return _stopping.is_set()


def stop_reason() -> str:
    return _reason


def resume_runs() -> None:
    """A new run in this process (a test, a campaign's next round) starts unstopped."""
    _stopping.clear()


def refuse_if_stopping(what: str) -> None:
    if stopping():
        raise RunStopped(f"{_reason}: not starting {what}")


def reason_for(error: BaseException) -> str:
    """Why a run stops, from what ended its main thread: the signal, or the failure."""
    signum = getattr(error, "signal", None)  # Prefect's TerminationSignal
    if isinstance(error, KeyboardInterrupt):
        signum = signal.SIGINT
    elif isinstance(error, SystemExit) and isinstance(error.code, int) and error.code > 128:
        signum = error.code - 128  # ops.shutdown.exit_on_sigterm's 128 + signal
    if signum:
        return f"the run was stopped by {signal.Signals(signum).name}"
    first_line = (str(error).splitlines() or [""])[0][:160]
    return f"the run is stopping after a failure ({type(error).__name__}: {first_line})"
