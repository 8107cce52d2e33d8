"""RayEnvPool: the :class:`~slea.envs.pool.EnvPool` interface with the env copies in Ray actors (``env.workers: ray``).

The N×G copies are dealt round-robin to ``num_workers`` actors (env ``i`` lives in worker ``i % W``). A batch
``reset``/``step`` sends one call per worker carrying all of its envs' resets or actions, and the workers run
in parallel. The pool's bookkeeping (done mask, last observations, seeds, fault counts) stays in the driver, so
the rollout collector cannot tell the two pools apart; under the same seeds and actions both give the same
observations, rewards and dones.

Faults are handled by the same code as in the local pool: each worker holds a local :class:`EnvPool` of its
copies, so an env that raises or overruns ``step_timeout_s`` is rebuilt inside its worker and its episode ends
truncated with ``info["fault"]``; the worker's fault counts travel back with every call and add up in
:attr:`fault_counts`. A worker *process* that dies (killed, out of memory, a crashing native engine) is one more
fault: its envs in the call get ``info["fault"] = "error"``, a fresh worker replaces it, and its other envs,
whose state died with it, end their episode at their next step the same way.

``ray.init(num_cpus=..., include_dashboard=False)`` starts a local cluster when none is running (and
:meth:`RayEnvPool.close` shuts it down again); when the caller already started or joined one, the pool uses it
and leaves it running. Needs the ``ray`` extra (``pip install 'slea[ray]'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slea.envs.base import EnvSpec, StepResult, register, registered
from slea.envs.pool import FAULT_KEYS, EnvPool
from slea.types import Instructions


def import_ray():
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError("env.workers: ray needs the ray package: pip install 'slea[ray]'") from None
    return ray


class _ShardPool(EnvPool):
    """One worker's copies: a local pool of single-copy groups, named in fault messages by their global index."""

    def __init__(self, env_id: str, ids: list[int], env_kwargs: Mapping[str, Any], **guards: Any) -> None:
        self.ids = list(ids)
        super().__init__(env_id, len(self.ids), 1, env_kwargs, **guards)

    def _label(self, i: int) -> str:
        return f"env {self.ids[i]}"


class EnvWorker:
    """The body of one Ray actor: its envs' resets and steps, through the local pool's fault handling.

    Every batch call returns its results and the fault counts since the previous call."""

    def __init__(self, spec: EnvSpec, ids: list[int], env_kwargs: Mapping[str, Any], guards: dict[str, Any]):
        if spec.id not in registered():  # an env registered by a plugin or a test module in the driver
            register(spec.id, spec.entry_point, family=spec.family, extra=spec.extra, requires=spec.requires,
                     description=spec.description, **spec.kwargs)
        self.pool = _ShardPool(spec.id, ids, env_kwargs, **guards)

    def instructions(self) -> Instructions:
        return self.pool.instructions

    def reset(self, calls: list[tuple[int, int | None, dict | None]]) -> tuple[list, dict[str, int]]:
        out = []
        for j, seed, opts in calls:
            self.pool.last[j] = self.pool.reset_one(j, seed, opts)
            out.append(self.pool.last[j])
        return out, self._counts()

    def step(self, calls: list[tuple[int, str]]) -> tuple[list[StepResult], dict[str, int]]:
        out = []
        for j, action in calls:
            result = self.pool.step_one(j, action)
            self.pool.last[j] = (result[0], result[4])
            out.append(result)
        return out, self._counts()

    def restart(self, j: int) -> tuple[bool, dict[str, int]]:
        return self.pool.restart(j), self._counts()

    def get_state(self, j: int) -> Any:
        return self.pool.get_state(j)

    def set_state(self, j: int, state: Any) -> None:
        self.pool.set_state(j, state)

    def close(self) -> None:
        self.pool.close()

    def _counts(self) -> dict[str, int]:
        counts, self.pool.fault_counts = self.pool.fault_counts, dict.fromkeys(FAULT_KEYS, 0)
        return counts


class RayEnvPool(EnvPool):
    """:class:`EnvPool` whose copies live in ``num_workers`` Ray actors (see the module docstring).

    Args (besides :class:`EnvPool`'s):
        num_workers: Ray actors holding the copies (at most one per env).
        ray_cpus: CPUs of the local Ray cluster the pool starts when none is running (``None``: Ray's
            default, all of the machine's cores); ignored when Ray is already initialised.
    """

    def __init__(self, env_id: str, num_groups: int, group_size: int, env_kwargs: Mapping[str, Any] | None = None,
                 *, num_workers: int = 2, ray_cpus: int | None = None, **guards: Any) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        spec = registered().get(env_id)
        if spec is None:
            known = ", ".join(sorted(registered())) or "none"
            raise KeyError(f"unknown env id {env_id!r}; registered: {known}")
        self._ray = import_ray()
        self._spec = spec
        self._guards = {k: guards[k] for k in ("step_timeout_s", "reset_timeout_s", "handle_faults") if k in guards}
        self._owns_ray = not self._ray.is_initialized()
        if self._owns_ray:
            self._ray.init(num_cpus=ray_cpus, include_dashboard=False)
        self.num_workers = max(1, min(int(num_workers), int(num_groups) * int(group_size)))
        self._lost: set[int] = set()  # envs whose worker died mid-episode: their next step is a fault
        self.workers: list[Any] = []
        super().__init__(env_id, num_groups, group_size, env_kwargs, **guards)
        try:
            self._instructions: Instructions = self._ray.get(self.workers[0].instructions.remote())
        except self._ray.exceptions.RayActorError as exc:  # the worker could not build its envs
            self.close()
            raise RuntimeError(f"the env workers of {env_id} could not start: {exc}") from None

    # -- workers ---------------------------------------------------------------------------------------
    def _start(self) -> list:
        self.workers = [self._new_worker(w) for w in range(self.num_workers)]
        return []  # no env lives in this process

    def _new_worker(self, w: int):
        actor = self._ray.remote(EnvWorker)
        return actor.remote(self._spec, self._ids(w), self.env_kwargs, self._guards)

    def _ids(self, w: int) -> list[int]:
        return list(range(w, self.size, self.num_workers))

    def _where(self, i: int) -> tuple[int, int]:
        """(worker, index inside that worker) of env ``i``."""
        return i % self.num_workers, i // self.num_workers

    def _replace_worker(self, w: int, error: str) -> None:
        """A worker process died: start a fresh one (fresh envs) and remember its envs' episodes are lost."""
        self._ray.kill(self.workers[w], no_restart=True)
        self.workers[w] = self._new_worker(w)
        ids = self._ids(w)
        self._count("restarts", len(ids))
        self._lost.update(ids)
        self.last_error = f"env worker {w} died: {error}"

    def _take(self, counts: dict[str, int]) -> None:
        for key, n in counts.items():
            self._count(key, n)

    def _by_worker(self, calls: list[tuple]) -> dict[int, list[tuple[int, tuple]]]:
        """``calls`` split by worker: ``{w: [(position in calls, call with the worker's env index)]}``."""
        out: dict[int, list[tuple[int, tuple]]] = {}
        for pos, (i, *rest) in enumerate(calls):
            w, j = self._where(i)
            out.setdefault(w, []).append((pos, (j, *rest)))
        return out

    def _run(self, method: str, calls: list[tuple]) -> tuple[list[Any], dict[int, str]]:
        """One ``method`` call per worker with its share of ``calls``, in parallel: the results in the order of
        ``calls`` (``None`` where the worker died) and ``{worker: error}`` for the workers that died."""
        shares = self._by_worker(calls)
        futures = {w: getattr(self.workers[w], method).remote([c for _, c in share]) for w, share in shares.items()}
        results: list[Any] = [None] * len(calls)
        died: dict[int, str] = {}
        for w, future in futures.items():
            try:
                out, counts = self._ray.get(future)
            except self._ray.exceptions.RayActorError as exc:
                died[w] = str(exc).splitlines()[0]
                continue
            self._take(counts)
            for (pos, _), r in zip(shares[w], out):
                results[pos] = r
        return results, died

    # -- the batch calls -----------------------------------------------------------------------------------
    def _reset_many(self, calls: list[tuple[int, int | None, dict[str, Any] | None]]) -> list[tuple[str, dict]]:
        results, died = self._run("reset", calls)  # the workers count their calls and faults
        for w, error in died.items():  # as a faulted reset: a fresh worker, one retry
            self._replace_worker(w, error)
            retry = [(pos, c) for pos, c in enumerate(calls) if self._where(c[0])[0] == w]
            self._count("calls", len(retry))  # the dead worker's counts died with it
            self._count("reset_errors", len(retry))
            again, died_again = self._run("reset", [c for _, c in retry])
            for (pos, _), r in zip(retry, again):
                results[pos] = r
            if died_again:
                self._replace_worker(w, died_again[w])
                self._count("reset_errors", len(retry))
                self._count("dead_envs", len(retry))
                for pos, _ in retry:
                    results[pos] = self._faulted_reset("error")
        self._lost.difference_update(c[0] for c in calls)
        self._note_errors(info for _, info in results)
        return results

    def _step_many(self, calls: list[tuple[int, str]]) -> list[StepResult]:
        sent = [pos for pos, (i, _) in enumerate(calls) if i not in self._lost]
        out, died = self._run("step", [calls[pos] for pos in sent])  # the workers count their calls and faults
        results: list[Any] = [None] * len(calls)
        for pos, r in zip(sent, out):
            results[pos] = r
        for w, error in died.items():
            self._replace_worker(w, error)
        for pos, (i, _) in enumerate(calls):
            if results[pos] is None:  # its worker died, now or earlier: the episode ends as a faulted step
                self._count("calls")
                self._count("env_errors")
                self._lost.discard(i)
                results[pos] = self._faulted_step(i, "error")
        self._note_errors(r[4] for r in results)
        return results

    def _note_errors(self, infos) -> None:
        for info in infos:
            if "fault" in info and info.get("error"):
                self.last_error = str(info["error"])

    # -- single-env calls, snapshots, instructions ---------------------------------------------------------
    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        obs, info = self._reset_many([(i, seed, options)])[0]
        if "fault" in info:
            self.done[i] = True
        return obs, info

    def step_one(self, i: int, action: str) -> StepResult:
        return self._step_many([(i, action)])[0]

    def restart(self, i: int) -> bool:
        w, j = self._where(i)
        ok, counts = self._ray.get(self.workers[w].restart.remote(j))
        self._take(counts)
        return ok

    @property
    def instructions(self) -> Instructions:
        return self._instructions

    def get_state(self, i: int) -> Any:
        w, j = self._where(i)
        return self._ray.get(self.workers[w].get_state.remote(j))

    def set_state(self, i: int, state: Any) -> None:
        w, j = self._where(i)
        self._ray.get(self.workers[w].set_state.remote(j, state))
        self.done[i] = False

    def close(self) -> None:
        """Close every env, end the workers, and shut Ray down when this pool started it."""
        workers, self.workers = self.workers, []
        if workers:
            try:
                self._ray.get([w.close.remote() for w in workers], timeout=30)
            except Exception:  # noqa: BLE001, S110  (a dead or hung worker is killed below anyway)
                pass
            for w in workers:
                self._ray.kill(w, no_restart=True)
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns_ray = False
