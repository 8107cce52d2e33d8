"""EnvPool: N task groups x G identical env copies, stepped together (local and sequential), with fault handling.

(:class:`slea.envs.ray_pool.RayEnvPool` keeps this interface and runs the copies in Ray actors: ``env.workers``.)

Env ``i`` belongs to group ``i // group_size``. ``reset(seeds)`` takes one seed per group and resets all G
copies of group ``g`` with ``seeds[g]`` (so they play the same task); ``step(actions)`` steps only the envs
named in ``actions`` and refuses finished ones. Every single env call goes through :meth:`EnvPool.step_one`
(and :meth:`EnvPool.reset_one`), the one place to wrap with a per-step timeout or to send to a remote
worker later. Env cost is about 1% of an iteration, so sequential stepping is fine on a laptop.

Faults (docs/reliability.md). An env call that raises, that does not return within ``step_timeout_s``
(``reset_timeout_s`` for resets), or a step whose engine raised inside ``TextEnv.step`` (answered with
``info["fault"]``), is a *fault*: the env is abandoned and replaced by a fresh instance built
with the same id and kwargs, and the episode ends there:

* a faulted step returns ``(last observation, 0.0, terminated=False, truncated=True, info)`` with
  ``info["fault"]`` = ``"error"`` or ``"timeout"`` (and ``info["error"]``, the exception's text);
* a faulted reset is retried once on the fresh instance; if that fails too, the env is marked done at once
  (``info["fault"]`` set) and sits the episode out.

With a timeout the call runs in a daemon worker thread that the pool waits on with ``join(timeout)``; a hung
engine (in-process TextWorld, a JVM bridge) keeps its thread, which is abandoned with the env, and the run goes
on. Without a timeout the call runs in the caller's thread. Counts (``calls``, ``env_errors``,
``env_timeouts``, ``reset_errors``, ``reset_timeouts``, ``restarts``, ``restart_failures``, ``dead_envs``) are
kept in :attr:`EnvPool.fault_counts`; :meth:`take_fault_stats` returns and clears them (the trainer logs them
as ``faults/*`` once per iteration and stops the run when the fault rate exceeds ``env.max_fault_rate``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, TypeVar

import numpy as np

from slea.envs.base import StepResult, TextEnv, make
from slea.types import Instructions

T = TypeVar("T")

FAULT_KEYS = ("calls", "env_errors", "env_timeouts", "reset_errors", "reset_timeouts", "restarts",
              "restart_failures", "dead_envs")


class EnvCallTimeout(TimeoutError):
    """An env call did not return within its timeout (the env is abandoned and rebuilt)."""


def call_with_timeout(fn: Callable[[], T], timeout_s: float | None, name: str = "env call") -> T:
    """``fn()``, in a daemon worker thread when ``timeout_s`` is set; raises :class:`EnvCallTimeout` when the
    call is still running after ``timeout_s`` (the thread is left behind: Python cannot kill it)."""
    if not timeout_s or timeout_s <= 0:
        return fn()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  (handed back to the caller's thread)
            box["error"] = exc

    th = threading.Thread(target=work, name=f"slea-{name}", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise EnvCallTimeout(f"{name} did not return within {timeout_s:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class EnvPool:
    """N×G text envs built with :func:`slea.envs.make`.

    Args:
        env_id: a registered id (``slea/TextWorld-v0``...).
        num_groups: N, the number of task groups.
        group_size: G, identical copies per group.
        env_kwargs: constructor arguments for every copy.
        step_timeout_s: per-step timeout in seconds (``None``: no timeout, the call runs in this thread).
        reset_timeout_s: per-reset timeout (``None``: none; a TextWorld reset may generate games first).
        handle_faults: catch env exceptions and timeouts, rebuild the env and end its episode (default); when
            false, exceptions propagate as before.
    """

    def __init__(
        self,
        env_id: str,
        num_groups: int,
        group_size: int,
        env_kwargs: Mapping[str, Any] | None = None,
        *,
        step_timeout_s: float | None = None,
        reset_timeout_s: float | None = None,
        handle_faults: bool = True,
    ) -> None:
        if num_groups < 1 or group_size < 1:
            raise ValueError("num_groups and group_size must be >= 1")
        self.env_id = env_id
        self.num_groups = int(num_groups)
        self.group_size = int(group_size)
        self.env_kwargs = dict(env_kwargs or {})
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.handle_faults = handle_faults
        self.envs: list[TextEnv | None] = self._start()
        self.done = np.ones(self.size, dtype=bool)  # true until reset, and after termination/truncation
        self.seeds: list[int | None] = [None] * self.num_groups
        self.last: list[tuple[str, dict[str, Any]] | None] = [None] * self.size  # latest (obs, info) per env
        self.fault_counts: dict[str, int] = dict.fromkeys(FAULT_KEYS, 0)
        self.last_error: str = ""

    def _build(self) -> TextEnv:
        return make(self.env_id, **self.env_kwargs)

    def _start(self) -> list[TextEnv | None]:
        """The env copies, built here (a remote pool starts its workers instead and keeps none here)."""
        return [self._build() for _ in range(self.size)]

    # -- layout ----------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.num_groups * self.group_size

    def __len__(self) -> int:
        return self.size

    @property
    def instructions(self) -> Instructions:
        """The env family's instructions (system prompt, example, answer cue): those of the first env."""
        env = next((e for e in self.envs if e is not None), None)
        return (env if env is not None else self._env(0)).instructions

    def group_of(self, i: int) -> int:
        if not 0 <= i < self.size:
            raise IndexError(f"env index {i} outside 0..{self.size - 1}")
        return i // self.group_size

    def members(self, group: int) -> range:
        """The env indices of ``group``."""
        if not 0 <= group < self.num_groups:
            raise IndexError(f"group {group} outside 0..{self.num_groups - 1}")
        return range(group * self.group_size, (group + 1) * self.group_size)

    @property
    def group_ids(self) -> np.ndarray:
        return np.arange(self.size) // self.group_size

    def live(self) -> list[int]:
        """Indices of the envs whose episode is still running."""
        return [int(i) for i in np.flatnonzero(~self.done)]

    @property
    def all_done(self) -> bool:
        return bool(self.done.all())

    # -- faults ----------------------------------------------------------------------------------------
    def _count(self, key: str, n: int = 1) -> None:
        self.fault_counts[key] = self.fault_counts.get(key, 0) + n

    def take_fault_stats(self) -> dict[str, int]:
        """The fault counts since the last call (then cleared), plus ``faults``: the faulted calls."""
        out = dict(self.fault_counts)
        out["faults"] = (out["env_errors"] + out["env_timeouts"] + out["reset_errors"] + out["reset_timeouts"])
        self.fault_counts = dict.fromkeys(FAULT_KEYS, 0)
        return out

    def restart(self, i: int) -> bool:
        """Replace env ``i`` with a fresh instance (same id and kwargs); the old one is closed in the
        background (closing a hung engine may hang too). Returns False when the rebuild itself failed: the
        slot stays empty and the next reset tries again."""
        old, self.envs[i] = self.envs[i], None
        if old is not None:
            threading.Thread(target=_quiet_close, args=(old,), name="slea-env-close", daemon=True).start()
        self._count("restarts")
        try:
            self.envs[i] = self._build()
        except Exception as exc:  # noqa: BLE001
            self._count("restart_failures")
            self.last_error = f"rebuilding {self._label(i)} failed: {type(exc).__name__}: {exc}"
            return False
        return True

    def _label(self, i: int) -> str:
        """How env ``i`` is named in fault messages."""
        return f"env {i}"

    def _env(self, i: int) -> TextEnv:
        env = self.envs[i]
        if env is None:  # a failed rebuild: try once more now
            if not self.restart(i):
                raise RuntimeError(self.last_error)
            env = self.envs[i]
        assert env is not None
        return env

    # -- the single-env calls (wrap these for timeouts / remote execution) --------------------------------
    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Reset env ``i``. On a fault the env is rebuilt and the reset retried once; a second fault returns
        ``("", info)`` with ``info["fault"]`` set and marks the env done for this episode."""
        if not self.handle_faults:
            return self._env(i).reset(seed=seed, options=options)
        self._count("calls")
        for attempt in range(2):
            ok, out = self._guarded(i, "reset", lambda e: e.reset(seed=seed, options=options),
                                    self.reset_timeout_s, "reset_timeouts", "reset_errors")
            if ok:
                return out
            kind = out
            self.restart(i)
            if attempt == 0:
                self._count("calls")
        self.done[i] = True
        self._count("dead_envs")
        return self._faulted_reset(kind)

    def _faulted_reset(self, kind: str) -> tuple[str, dict[str, Any]]:
        """A reset that faulted twice: no observation, ``info["fault"] = kind``; the env sits the episode out."""
        return "", {"fault": kind, "error": self.last_error, "goal": "", "admissible_actions": None,
                    "task_type": "", "won": False}

    def _guarded(self, i: int, what: str, call, timeout_s, timeout_key: str, error_key: str):
        """Run ``call(env_i)`` under the timeout: ``(True, result)``, or ``(False, "timeout"|"error")`` with the
        fault counted and described in ``last_error``."""
        try:
            env = self._env(i)
            return True, call_with_timeout(lambda: call(env), timeout_s, f"{what} of {self._label(i)}")
        except EnvCallTimeout as exc:
            self._count(timeout_key)
            self.last_error = str(exc)
            return False, "timeout"
        except Exception as exc:  # noqa: BLE001  (any engine failure is a fault to survive)
            self._count(error_key)
            self.last_error = f"{what} of {self._label(i)}: {type(exc).__name__}: {exc}"
            return False, "error"

    def step_one(self, i: int, action: str) -> StepResult:
        """Execute one env step. The only place an env is stepped: the per-step timeout and the fault
        handling live here (a fault ends the episode as truncated and rebuilds the env)."""
        if not self.handle_faults:
            return self._env(i).step(action)
        self._count("calls")
        ok, out = self._guarded(i, "step", lambda e: e.step(action), self.step_timeout_s, "env_timeouts",
                                "env_errors")
        if ok and "fault" not in out[4]:
            return out
        if ok:  # the env caught its engine's exception (TextEnv.step): the same fault as one raised here
            self._count("env_errors")
            self.last_error = f"step of {self._label(i)}: {out[4].get('error', '')}"
            kind = str(out[4]["fault"])
        else:
            kind = out
        self.restart(i)
        return self._faulted_step(i, kind)

    def _faulted_step(self, i: int, kind: str) -> StepResult:
        """A faulted step's result: the last observation, no reward, truncated, ``info["fault"] = kind``."""
        obs, info = self.last[i] if self.last[i] is not None else ("", {})
        info = {k: v for k, v in info.items() if k not in ("invalid", "error")}
        info.update(fault=kind, error=self.last_error, invalid=False, won=False)
        return obs, 0.0, False, True, info

    # -- batch API ---------------------------------------------------------------------------------------
    def reset(
        self, seeds: Sequence[int | None], options: Sequence[dict[str, Any] | None] | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Reset every env; ``seeds[g]`` (and ``options[g]``) go to all copies of group ``g``. An env whose
        reset faulted twice comes back done (``info["fault"]``): skip it for this episode."""
        if len(seeds) != self.num_groups:
            raise ValueError(f"reset needs {self.num_groups} seeds (one per group), got {len(seeds)}")
        if options is not None and len(options) != self.num_groups:
            raise ValueError(f"reset needs {self.num_groups} options (one per group), got {len(options)}")
        out: list[tuple[str, dict[str, Any]]] = []
        self.done[:] = False
        calls = []
        for i in range(self.size):
            g = i // self.group_size
            calls.append((i, seeds[g], dict(options[g]) if options is not None and options[g] else None))
        for (i, _, _), (obs, info) in zip(calls, self._reset_many(calls)):
            g = i // self.group_size
            if "fault" in info:  # reset faulted twice: the env sits this episode out
                self.done[i] = True
            info = dict(info)
            info["group"] = g
            out.append((obs, info))
            self.last[i] = (obs, info)
        self.seeds = list(seeds)
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        """Step the envs named in ``actions`` (live ones only); return their results by index."""
        bad = [i for i in actions if not 0 <= i < self.size or self.done[i]]
        if bad:
            raise ValueError(f"cannot step finished or unknown envs {sorted(bad)}; live: {self.live()}")
        results: dict[int, StepResult] = {}
        calls = [(i, actions[i]) for i in sorted(actions)]
        for (i, _), result in zip(calls, self._step_many(calls)):
            obs, reward, terminated, truncated, info = result
            info = dict(info)
            info["group"] = i // self.group_size
            results[i] = (obs, reward, terminated, truncated, info)
            self.last[i] = (obs, info)
            if terminated or truncated:
                self.done[i] = True
        return results

    def _reset_many(self, calls: list[tuple[int, int | None, dict[str, Any] | None]]) -> list[tuple[str, dict]]:
        """``reset_one`` for each ``(env, seed, options)``, in order (a remote pool batches these)."""
        return [self.reset_one(i, seed, opts) for i, seed, opts in calls]

    def _step_many(self, calls: list[tuple[int, str]]) -> list[StepResult]:
        """``step_one`` for each ``(env, action)``, in order (a remote pool batches these)."""
        return [self.step_one(i, action) for i, action in calls]

    def mark_done(self, indices: Sequence[int]) -> None:
        """Retire envs from the current episode (e.g. the collector hit its max steps)."""
        for i in indices:
            self.done[i] = True

    # -- snapshots ---------------------------------------------------------------------------------------
    def get_state(self, i: int) -> Any:
        return self._env(i).get_state()

    def set_state(self, i: int, state: Any, last: tuple[str, dict[str, Any]] | None = None) -> bool:
        """Restore env ``i`` to a :meth:`get_state` snapshot and mark it live (``last``: the (observation, info)
        of that state, what a later faulted step answers with). A restore that raises or outlasts
        ``reset_timeout_s`` (a replay runs the episode again) is a fault, handled like a faulted reset: the env
        is rebuilt, sits this episode out (done) and ``False`` is returned."""
        if not self.handle_faults:
            self._env(i).set_state(state)
        else:
            self._count("calls")
            ok, _ = self._guarded(i, "restore", lambda e: e.set_state(state), self.reset_timeout_s,
                                  "reset_timeouts", "reset_errors")
            if not ok:
                self.restart(i)
                self.done[i] = True
                return False
        self.done[i] = False
        self.last[i] = last
        return True

    def close(self) -> None:
        for env in self.envs:
            if env is not None:
                _quiet_close(env)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quiet_close(env: TextEnv) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001, S110  (a broken env may fail to close; it is being dropped anyway)
        pass
