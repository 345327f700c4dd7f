"""Chunked driver for long runs: compiled chunks of ``save_every`` steps, a frame written after
each, blow-up detection that names the step, and resumption from the last frame."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class SimulationBlewUp(RuntimeError):
    """A run produced NaN or Inf. ``step`` and ``time`` name the first bad step."""

    def __init__(
        self,
        step: int,
        time: float,
        frames_written: int,
        output: str | None = None,
        reason: str = "NaN/Inf",
    ):
        self.step = step
        self.time = time
        self.frames_written = frames_written
        self.output = output
        self.reason = reason
        where = "" if output is None else f" in {output}"
        super().__init__(
            f"the run blew up ({reason}) at step {step}, t = {time:.6g} s; "
            f"{_frames_kept(frames_written)}{where}. Lower dt (or --cfl) or add dissipation."
        )


def _frames_kept(n: int) -> str:
    if n == 0:
        return "no frame was written before it"
    if n == 1:
        return "the 1 frame written before it is kept"
    return f"the {n} frames written before it are kept"


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves))


class RunInterrupted(RuntimeError):
    """A run stopped on request (Ctrl-C) between frames. ``step`` and ``frames_written`` count
    what the file holds: the frame being written when a second interrupt struck is not
    counted."""

    def __init__(self, step: int, time: float, frames_written: int, note: str = ""):
        self.step = step
        self.time = time
        self.frames_written = frames_written
        super().__init__(f"interrupted at step {step}, t = {time:.6g} s{note}")


def drive(
    advance: Callable[[Any, float, int], Any],
    state: Any,
    *,
    dt: float,
    step0: int,
    n_steps: int,
    save_every: int,
    on_frame: Callable[[Any, float, int], None],
    progress: Any | None = None,
    max_frames: int | None = None,
    stop: Callable[[], bool] | None = None,
    healthy: Callable[[Any], Any] = _all_finite,
    failure: str = "NaN/Inf",
) -> tuple[Any, int, int]:
    """Advance from step ``step0`` to ``n_steps`` in chunks of ``save_every`` steps.

    ``advance(state, t0, n)`` returns the state ``n`` steps after time ``t0``; chunk ``k``
    starts at ``t0 = step * dt`` exactly as in an uninterrupted run, so a resumed run repeats
    its arithmetic bit for bit. After each chunk ``on_frame(state, t, step)`` writes the
    frame. A state that is not ``healthy`` (default: not finite everywhere; ``failure`` says
    what went wrong in the message) is traced back step by step from the last good frame and
    raises [`SimulationBlewUp`][]. When ``stop()`` turns true (checked between frames), or a
    ``KeyboardInterrupt`` arrives, the run ends with [`RunInterrupted`][] naming the last
    frame written. Returns ``(state, step, frames_written)``.
    """
    step = step0
    frames = 0
    try:
        while step < n_steps:
            if stop is not None and stop():
                raise RunInterrupted(step, step * dt, frames)
            if max_frames is not None and frames >= max_frames:
                break
            n = min(save_every, n_steps - step)
            new = advance(state, step * dt, n)
            if not bool(healthy(new)):
                bad = _locate_blowup(advance, state, step, n, dt, healthy)
                raise SimulationBlewUp(bad, bad * dt, frames, reason=failure)
            on_frame(new, (step + n) * dt, step + n)
            state = new
            step += n
            frames += 1
            if progress is not None:
                # the time first: update() redraws, set_postfix_str(refresh=False) does not
                progress.set_postfix_str(f"t={_format_time(step * dt)}", refresh=False)
                progress.update(n)
    except KeyboardInterrupt:
        raise RunInterrupted(step, step * dt, frames) from None
    return state, step, frames


def _locate_blowup(advance, state, step, n, dt, healthy=_all_finite) -> int:
    for k in range(n):
        state = advance(state, (step + k) * dt, 1)
        if not bool(healthy(state)):
            return step + k + 1
    return step + n


def _format_time(seconds: float) -> str:
    s = abs(seconds)
    if s >= 86400:
        return f"{seconds / 86400:.2f} d"
    if s >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds:.4g} s"


class Stopwatch:
    def __init__(self):
        self.t0 = _time.perf_counter()

    def elapsed(self) -> float:
        return _time.perf_counter() - self.t0


def to_numpy(x) -> np.ndarray:
    return np.asarray(jax.device_get(x))
