"""The simulated module's one device, shared by every request the server has in flight (pure: no clock, no sleep).

A continuous-batching scheduler as sglang's, in module milliseconds: at each boundary (the end of the device's
last operation) it starts either one **prefill batch** of the requests waiting (all that arrived by then, within
the prefill token budget and the KV capacity: ``prompt + max_tokens`` per request, ``max-total-tokens`` in all)
or, when none waits, one **decode step** of every running request (one token each; a speculative step emits
its accepted tokens as one chunk). Prefill goes first, so a new request stalls the decoding ones, as a server
without chunked prefill does. Costs:

- a prefill batch of one request costs what the fitted model says for it (its TTFT at batch 1, the seed's);
  several cost their sum less what batching their new tokens saves (``batch_saving``: the fitted cold curve of
  the sum against the sum of each);
- a decode step of B requests costs the mean of their batch-1 step times times ``1 + DECODE_SLOWDOWN * (B-1)``
  (not in the seed, whose tables are batch 1: chosen, docs/concepts/simulator.md).

At batch 1 every time is the fitted model's: the first token ``prefill`` after the request's arrival (the
client's send instant), each later one a step after the one before, on absolute times (no drift). The step
after a prefill starts when its caller asks (the first token was sent), as the single-request server did.

The server's threads call :meth:`Device.advance` with the current module time whenever they wake; the device
decides operations only at boundaries that have passed, so an arrival is never missed by a decision made early.
"""

from __future__ import annotations

TYPE_CHECKING = False  # see .record
if TYPE_CHECKING:
    from collections.abc import Callable

DECODE_SLOWDOWN = 0.1  # each request beyond the first in a decode step adds 10 % to the step (chosen)
PREFILL_TOKEN_BUDGET = 16384  # new tokens of one prefill batch, at most (sglang's max_prefill_tokens)


class Job:
    """One request on the device: its batch-1 costs, and the chunks scheduled for it so far."""

    __slots__ = ("arrival", "chunks", "kv", "left", "new", "prefill_ms", "steps", "sent")

    def __init__(self, arrival: float, prefill_ms: float, steps: list[tuple[float, int]], *, new: int,
                 kv: int) -> None:
        self.arrival = arrival  # module ms
        self.prefill_ms = prefill_ms  # its prefill alone (TTFT at batch 1)
        self.steps = steps  # (step cost ms at batch 1, tokens) of each chunk after the first
        self.left = len(steps)  # steps not yet scheduled
        self.new = new  # uncached prompt tokens
        self.kv = kv  # KV tokens it holds while on the device
        self.chunks: list[tuple[float, int]] = []  # (due module ms, tokens) of each chunk scheduled
        self.sent = 0  # chunks the server has sent

    @property
    def finished(self) -> bool:
        return self.left == 0 and bool(self.chunks)


class Device:
    """The scheduler's state; every method is called under the server's lock."""

    def __init__(self, capacity: int, batch_saving: Callable[[list[Job]], float] | None = None) -> None:
        self.capacity = capacity
        self.batch_saving = batch_saving
        self.free_at = -1e300  # module ms: the end of the last operation started
        self.after_prefill = False
        self.waiting: list[Job] = []
        self.running: list[Job] = []  # prefilled, decoding (or with their last chunk scheduled)

    def submit(self, job: Job) -> None:
        self.waiting.append(job)

    def cancel(self, job: Job) -> None:
        """The client went away: the job leaves the device (its scheduled operation still runs)."""
        if job in self.waiting:
            self.waiting.remove(job)
        if job in self.running:
            self.running.remove(job)

    @property
    def kv_used(self) -> int:
        return sum(j.kv for j in self.running)

    def advance(self, now: float) -> None:
        """Start every operation whose boundary has passed by ``now`` (module ms)."""
        while self.free_at <= now:
            self.running = [j for j in self.running if not j.finished]
            start = self.free_at
            batch = self._admit(start)
            if batch:
                self._prefill(batch, start)
            elif any(j.left for j in self.running):
                self._decode(max(start, now) if self.after_prefill else start)
            elif self.waiting:  # idle until the first arrival
                first = min(j.arrival for j in self.waiting)
                if first > now:
                    return
                batch = self._admit(max(start, first))
                if not batch:
                    return
                self._prefill(batch, max(start, first))
            else:
                return

    def _admit(self, start: float) -> list[Job]:
        batch: list[Job] = []
        kv, tokens = self.kv_used, 0
        for j in sorted(self.waiting, key=lambda j: j.arrival):
            if j.arrival > start:
                break
            if batch and (tokens + j.new > PREFILL_TOKEN_BUDGET or kv + j.kv > self.capacity):
                break
            if not batch and self.running and kv + j.kv > self.capacity:
                break  # no room until running requests finish
            batch.append(j)
            kv += j.kv
            tokens += j.new
        return batch

    def _prefill(self, batch: list[Job], start: float) -> None:
        cost = sum(j.prefill_ms for j in batch)
        if len(batch) > 1 and self.batch_saving is not None:
            cost = max(cost - self.batch_saving(batch), max(j.prefill_ms for j in batch))
        end = start + cost
        for j in batch:
            self.waiting.remove(j)
            j.chunks.append((end, 1))
            self.running.append(j)
        self.free_at, self.after_prefill = end, True

    def _decode(self, start: float) -> None:
        live = [j for j in self.running if j.left]
        base = sum(j.steps[len(j.steps) - j.left][0] for j in live) / len(live)
        end = start + base * (1.0 + DECODE_SLOWDOWN * (len(live) - 1))
        for j in live:
            j.chunks.append((end, j.steps[len(j.steps) - j.left][1]))
            j.left -= 1
        self.free_at, self.after_prefill = end, False
