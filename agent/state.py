"""The state machine of one run on one module: explicit states, one ``transition()``."""

from __future__ import annotations

from contract.records import RunState

ORDER: tuple[RunState, ...] = (
    RunState.PENDING,
    RunState.FETCHING,
    RunState.UNPACKING,
    RunState.CONFIGURING,
    RunState.GENERATING,
    RunState.ENVIRONMENT,
    RunState.PRECOMPILING,
    RunState.BENCHMARKING,
    RunState.PUBLISHING,
    RunState.DONE,
)


class IllegalTransition(RuntimeError):
    pass


def allowed(src: RunState, dst: RunState) -> bool:
    """Forward one step along ORDER, or from any live state to FAILED / CANCELLED.

    INTERRUPTED and LOST are never entered by the pipeline: the worker and the controller set them.
    """
    if src.terminal or src not in ORDER:
        return False
    if dst in (RunState.FAILED, RunState.CANCELLED):
        return True
    if dst not in ORDER:
        return False
    i = ORDER.index(src)
    return i + 1 < len(ORDER) and ORDER[i + 1] == dst


class RunMachine:
    def __init__(self, state: RunState = RunState.PENDING) -> None:
        self.state = state

    def transition(self, dst: RunState) -> RunState:
        if not allowed(self.state, dst):
            raise IllegalTransition(f"run state {self.state.value} -> {dst.value} is not allowed")
        self.state = dst
        return dst
