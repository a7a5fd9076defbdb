"""An opt-in autoscaling policy for online rescaling: decides *when* and *to what* parallelism to rescale.

Engine-agnostic and pure: the runner feeds one :class:`Observation` per finished batch to
:meth:`Autoscaler.observe` and applies the returned :class:`ScalingDecision` (if any) from the next batch on.
:func:`progress_observation` builds an observation from a Spark ``StreamingQueryProgress`` (``query.lastProgress``).

The rules, in order (see :meth:`Autoscaler.observe`):

* no decision inside the cooldown after a rescale (``cooldown_batches`` batches *and* ``cooldown_s`` seconds);
* scale up when the batch took longer than ``target_batch_ms`` (proportionally: ``ceil(P * batch_ms / target)``)
  or when the backlog exceeds ``max_backlog_rows`` (by a full ``max_step``);
* scale down when the batch took less than ``scale_down_below * target_batch_ms`` and the backlog is low,
  towards the middle of the no-action band so that one slightly slower batch does not scale straight back up;
* a step is at most ``×max_step`` up or ``÷max_step`` down, and the result is clamped to
  ``[min_parallelism, min(max_parallelism, limit)]``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from spate.errors import InvalidParallelismError, SettingError

log = logging.getLogger(__name__)
DECISIONS_KEPT = 100  # scaling decisions an autoscaler remembers (each rescaling checkpoint records its own)


@dataclass(frozen=True)
class AutoscalePolicy:
    """When and how far to rescale a running query.

    Attributes:
        min_parallelism: the lowest parallelism the autoscaler will choose (>= 1).
        max_parallelism: the highest parallelism it will choose; also bounded by the query's number of key groups.
        target_batch_ms: keep batch durations near this many milliseconds; ``None`` disables the time rule.
        max_backlog_rows: input waiting behind the query (e.g. Kafka offsets behind latest) above which it scales
            up; ``None`` disables the backlog rule. At least one of the two rules must be given.
        cooldown_batches: after a rescale decided at batch ``b``, batches ``b+1 .. b+cooldown_batches`` make no
            decision (the first batches after a rescale pay for moving state and are not representative).
        cooldown_s: additionally, no decision until this many seconds after the rescale.
        scale_down_below: scale down only when a batch took less than this fraction of ``target_batch_ms`` and
            the backlog is low: unknown, at most ``max_backlog_rows / 4`` when that is set, else 0.
        max_step: one decision changes the parallelism by at most ``×max_step`` up or ``÷max_step`` down (but
            always by at least 1, so that a small parallelism can still move).

    Raises:
        InvalidParallelismError: ``min_parallelism`` below 1 or above ``max_parallelism``.
        SettingError: no rule to scale on, or a target, backlog, cooldown, band or step out of its range (the
            message names the attribute and the range).
    """

    min_parallelism: int
    max_parallelism: int
    target_batch_ms: float | None = None
    max_backlog_rows: int | None = None
    cooldown_batches: int = 3
    cooldown_s: float = 0.0
    scale_down_below: float = 0.5
    max_step: float = 2.0

    def __post_init__(self) -> None:
        self._check_bounds()
        self._check_signals()
        self._check_tuning()

    def _check_bounds(self) -> None:
        if self.min_parallelism < 1:
            raise InvalidParallelismError(f"AutoscalePolicy.min_parallelism must be >= 1, got {self.min_parallelism}: "
                                          "pass a positive number of subtasks")
        if self.max_parallelism < self.min_parallelism:
            raise InvalidParallelismError(
                f"AutoscalePolicy.max_parallelism ({self.max_parallelism}) must be >= min_parallelism "
                f"({self.min_parallelism}): raise max_parallelism or lower min_parallelism"
            )

    def _check_signals(self) -> None:
        if self.target_batch_ms is None and self.max_backlog_rows is None:
            raise SettingError(
                "AutoscalePolicy needs a signal to scale on: set target_batch_ms (keep batches near this "
                "duration) and/or max_backlog_rows (scale up when this much input is waiting)"
            )
        if self.target_batch_ms is not None and not (math.isfinite(self.target_batch_ms) and self.target_batch_ms > 0):
            raise SettingError(
                f"AutoscalePolicy.target_batch_ms must be a positive number of milliseconds, got "
                f"{self.target_batch_ms}; use None to disable the time rule"
            )
        if self.max_backlog_rows is not None and self.max_backlog_rows < 1:
            raise SettingError(
                f"AutoscalePolicy.max_backlog_rows must be >= 1, got {self.max_backlog_rows}; "
                "use None to disable the backlog rule"
            )

    def _check_tuning(self) -> None:
        if self.cooldown_batches < 0:
            raise SettingError(f"AutoscalePolicy.cooldown_batches must be >= 0, got {self.cooldown_batches}: pass 0 "
                               "for no cooldown")
        if not (math.isfinite(self.cooldown_s) and self.cooldown_s >= 0):
            raise SettingError(f"AutoscalePolicy.cooldown_s must be a finite number >= 0, got {self.cooldown_s}: pass "
                               "0.0 for no cooldown")
        if not 0 < self.scale_down_below < 1:
            raise SettingError(
                f"AutoscalePolicy.scale_down_below must be a fraction strictly between 0 and 1, got "
                f"{self.scale_down_below} (e.g. 0.5: scale down when a batch takes under half the target)"
            )
        if not (math.isfinite(self.max_step) and self.max_step > 1):
            raise SettingError(
                f"AutoscalePolicy.max_step must be a finite factor > 1, got {self.max_step} (e.g. 2.0: at most "
                "double or halve the parallelism in one decision)"
            )


@dataclass(frozen=True)
class Observation:
    """What one finished batch looked like.

    Attributes:
        batch_id: the batch's id (increasing).
        parallelism: the parallelism the batch ran with.
        batch_ms: how long the batch took, in milliseconds.
        rows: input rows the batch processed.
        backlog_rows: input still waiting behind the query after the batch, ``None`` when unknown.
        at_s: wall clock when the batch finished, in seconds (e.g. ``time.time()``); keyword-only.
    """

    batch_id: int
    parallelism: int
    batch_ms: float
    rows: int
    backlog_rows: int | None = None
    at_s: float = field(kw_only=True)


@dataclass(frozen=True)
class ScalingDecision:
    """A decision to change the parallelism.

    Attributes:
        batch_id: the batch whose observation led to the decision; the new parallelism applies from the next
            batch.
        from_parallelism: the parallelism that batch ran with.
        to_parallelism: the parallelism to use from the next batch on (never equal to ``from_parallelism``).
        reason: a readable explanation with the numbers, e.g. ``"batch 12 took 2,310 ms, target 1,000 ms: 4 → 8"``.
        at_s: the wall clock of the observation, in seconds.
    """

    batch_id: int
    from_parallelism: int
    to_parallelism: int
    reason: str
    at_s: float

    def to_dict(self) -> dict[str, Any]:
        """The decision as a JSON-serialisable dict (the field names as keys)."""
        return asdict(self)


class Autoscaler:
    """Turns per-batch observations into scaling decisions under an :class:`AutoscalePolicy`.

    ``limit`` is the query's maximum parallelism (its number of key groups): the autoscaler never goes above
    ``min(policy.max_parallelism, limit)``. Not thread-safe: call it from the thread that runs the batches.

    Raises:
        InvalidParallelismError: ``limit`` is below ``policy.min_parallelism``.
    """

    def __init__(self, policy: AutoscalePolicy, limit: int) -> None:
        if limit < policy.min_parallelism:
            raise InvalidParallelismError(
                f"Autoscaler limit (the query's max parallelism / number of key groups) is {limit}, below "
                f"AutoscalePolicy.min_parallelism {policy.min_parallelism}: lower min_parallelism or use more "
                "key groups"
            )
        self.policy = policy
        self.max_parallelism = min(policy.max_parallelism, limit)
        self._decisions: deque[ScalingDecision] = deque(maxlen=DECISIONS_KEPT)
        self._rescaled_at: tuple[int, float] | None = None  # (batch id, wall clock) of the last rescale
        self._last_batch_id: int | None = None

    @property
    def decisions(self) -> list[ScalingDecision]:
        """The latest decisions (up to ``DECISIONS_KEPT``), oldest first."""
        return list(self._decisions)

    def note_rescaled(self, batch_id: int, at_s: float) -> None:
        """Start the cooldown for a rescale made outside the autoscaler (e.g. by hand).

        ``batch_id`` is the last batch that ran at the old parallelism; ``at_s`` the wall clock, in seconds.
        """
        self._rescaled_at = (batch_id, at_s)

    def observe(self, obs: Observation) -> ScalingDecision | None:
        """Decide on the batch ``obs`` describes: a :class:`ScalingDecision`, or ``None`` to keep the parallelism.

        No decision for a batch id already observed (Spark repeats ``lastProgress`` while idle), inside the
        cooldown, or when the rules want the current parallelism. A decision is recorded in :attr:`decisions`
        (the latest ``DECISIONS_KEPT``),
        logged, and starts the cooldown.
        """
        if self._last_batch_id is not None and obs.batch_id <= self._last_batch_id:
            return None
        self._last_batch_id = obs.batch_id
        if self._cooling_down(obs):
            return None
        to, why = self._wanted(obs)
        to = max(self.policy.min_parallelism, min(self.max_parallelism, to))
        if to == obs.parallelism:
            return None
        decision = ScalingDecision(obs.batch_id, obs.parallelism, to, f"{why}: {obs.parallelism} → {to}", obs.at_s)
        self._decisions.append(decision)
        self._rescaled_at = (obs.batch_id, obs.at_s)
        log.info("autoscale: %s", decision.reason)
        return decision

    def _cooling_down(self, obs: Observation) -> bool:
        if self._rescaled_at is None:
            return False
        batch_id, at_s = self._rescaled_at
        return obs.batch_id <= batch_id + self.policy.cooldown_batches or obs.at_s - at_s < self.policy.cooldown_s

    def _wanted(self, obs: Observation) -> tuple[int, str]:
        """The parallelism the rules want (before clamping to the bounds) and why."""
        p, low, high = obs.parallelism, self.policy.min_parallelism, self.max_parallelism
        if not low <= p <= high:
            return p, f"batch {obs.batch_id} ran at parallelism {p}, outside the bounds [{low}, {high}]"
        up = self._scale_up(obs)
        if up is not None:
            return up
        down = self._scale_down(obs)
        if down is not None:
            return down
        return p, ""

    def _scale_up(self, obs: Observation) -> tuple[int, str] | None:
        policy, p = self.policy, obs.parallelism
        wants: list[tuple[int, str]] = []
        target = policy.target_batch_ms
        if target is not None and obs.rows > 0 and obs.batch_ms > target:
            wants.append((math.ceil(p * obs.batch_ms / target), _took(obs, target)))
        bound = policy.max_backlog_rows
        if bound is not None and obs.backlog_rows is not None and obs.backlog_rows > bound:
            reason = f"batch {obs.batch_id} left a backlog of {obs.backlog_rows:,} rows, max {bound:,}"
            wants.append((_step_up(p, policy.max_step), reason))
        if not wants:
            return None
        wanted, cap = max(w for w, _ in wants), _step_up(p, policy.max_step)
        reason = "; ".join(r for _, r in wants) + (f" (at most ×{policy.max_step:g} a step)" if wanted > cap else "")
        return min(wanted, cap), reason

    def _scale_down(self, obs: Observation) -> tuple[int, str] | None:
        policy, p = self.policy, obs.parallelism
        target = policy.target_batch_ms
        # An empty batch's duration is fixed overhead: it says nothing about the parallelism the data needs.
        if target is None or obs.rows == 0 or obs.batch_ms >= policy.scale_down_below * target:
            return None
        if not self._backlog_low(obs.backlog_rows):
            return None
        # Aim at the middle of the no-action band [scale_down_below * target, target], not at the target itself.
        aim = target * (1 + policy.scale_down_below) / 2
        wanted = max(math.ceil(p * obs.batch_ms / aim), _step_down(p, policy.max_step))
        reason = f"{_took(obs, target)}, under {policy.scale_down_below:.0%} of it"
        if obs.backlog_rows is not None:
            reason += f", backlog {obs.backlog_rows:,} rows"
        return wanted, reason

    def _backlog_low(self, backlog: int | None) -> bool:
        if backlog is None:
            return True
        bound = self.policy.max_backlog_rows
        return backlog <= (bound / 4 if bound is not None else 0)


def _took(obs: Observation, target: float) -> str:
    return f"batch {obs.batch_id} took {obs.batch_ms:,.0f} ms, target {target:,.0f} ms"


def _step_up(p: int, max_step: float) -> int:
    """The highest parallelism one step up from ``p`` may reach: ``×max_step``, but at least ``p + 1``."""
    return max(math.floor(p * max_step), p + 1)


def _step_down(p: int, max_step: float) -> int:
    """The lowest parallelism one step down from ``p`` may reach: ``÷max_step``, but at least ``p - 1`` lower."""
    return min(math.ceil(p / max_step), p - 1)


def progress_observation(progress: Mapping[str, Any] | None, parallelism: int, at_s: float) -> Observation | None:
    """An :class:`Observation` from a Spark ``StreamingQueryProgress`` as a dict (PySpark's ``query.lastProgress``).

    Uses ``batchId``, ``durationMs["triggerExecution"]`` and ``numInputRows``. The backlog is the sum over the
    sources of their ``metrics["maxOffsetsBehindLatest"]`` (reported by Kafka sources: the lag of each source's
    most lagging partition, so a lower bound of the rows waiting), or ``None`` when no source reports it.
    Returns ``None`` for a ``None``/empty progress or one without a ``triggerExecution`` duration.
    """
    if not progress:
        return None
    duration = (progress.get("durationMs") or {}).get("triggerExecution")
    if duration is None:
        return None
    return Observation(
        batch_id=int(progress["batchId"]),
        parallelism=parallelism,
        batch_ms=float(duration),
        rows=int(progress.get("numInputRows") or 0),
        backlog_rows=_backlog(progress.get("sources") or []),
        at_s=at_s,
    )


def _backlog(sources: list[Mapping[str, Any]]) -> int | None:
    behind = [(s.get("metrics") or {}).get("maxOffsetsBehindLatest") for s in sources]
    known = [int(float(b)) for b in behind if b is not None]  # Spark reports metrics as strings
    return sum(known) if known else None
