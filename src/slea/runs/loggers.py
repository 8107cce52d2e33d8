"""Where a run's metrics rows go besides ``metrics.jsonl``: ``run.loggers`` names them (``tensorboard``, ``wandb``,
``mlflow``; ``jsonl`` is always on, it is what ``slea report``, ``slea compare`` and a resumed run read).

Each is a :class:`Sink` with ``log(iteration, metrics)``, ``purge_after(iteration)`` and ``close()``. A sink that
cannot start (its package missing, no W&B login, a tracking server that does not answer) is one warning line and
the run goes on without it; one that raises later is switched off with one line, never a crash mid-run.

W&B and MLflow keep their run ids in ``RUN/loggers.json``, so a resumed run continues the same W&B / MLflow run.
W&B: project ``run.project``, files under ``RUN/wandb/`` (``WANDB_MODE=offline`` writes them without an
account); every row also carries ``iteration``, W&B's x-axis for every metric. MLflow: experiment ``run.project``,
tracking URI ``MLFLOW_TRACKING_URI`` or else the file store ``RUN/mlruns``; the config as params.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from slea.atomic import atomic_write_text
from slea.runs.folder import RunFolder

log = logging.getLogger(__name__)

_reported: set[str] = set()  # a missing package is said once per process


class Sink(Protocol):
    name: str

    def log(self, iteration: int, metrics: dict[str, float]) -> None: ...

    def purge_after(self, iteration: int) -> None: ...

    def close(self) -> None: ...


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row (bools and text are not curves)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def _ids(run_dir: Path) -> dict[str, str]:
    path = RunFolder(run_dir).loggers
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_id(run_dir: Path, key: str, value: str) -> None:
    data = _ids(run_dir)
    if data.get(key) != value:
        atomic_write_text(RunFolder(run_dir).loggers, json.dumps({**data, key: value}, indent=2) + "\n")


class Unavailable(RuntimeError):
    """A logger that cannot start here; its message says why (and is printed without the exception's name)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if isinstance(exc, Unavailable):
        return text[0] if text else "unavailable"
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = RunFolder(run_dir).events
        self.writer = SummaryWriter(str(self.dir))

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        for key, val in numbers(metrics).items():
            self.writer.add_scalar(key.replace(".", "/"), val, iteration)
        self.writer.flush()

    def purge_after(self, iteration: int) -> None:
        """A resumed run redoes the iterations after ``iteration``: reopen with ``purge_step`` so the points the
        killed run logged for them are dropped, not shown twice."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        self.writer = SummaryWriter(str(self.dir), purge_step=iteration + 1)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any] | None):
        import wandb

        mode = os.environ.get("WANDB_MODE", "").lower()
        if mode not in ("offline", "disabled", "dryrun") and not _wandb_logged_in():  # never a login prompt
            raise Unavailable("no W&B login (run `wandb login`, set WANDB_API_KEY, or WANDB_MODE=offline)")
        run_id = _ids(run_dir).get("wandb") or uuid.uuid4().hex[:12]
        self.run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir),
                              config=config or {}, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True, disable_git=True))
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")
        _save_id(run_dir, "wandb", run_id)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        self.run.log({**numbers(metrics), "iteration": iteration})

    def purge_after(self, iteration: int) -> None:
        """W&B keeps what it received: the redone iterations of a resumed run show again at the same x."""

    def close(self) -> None:
        self.run.finish()


def _wandb_logged_in() -> bool:
    """Whether W&B has credentials without prompting: ``WANDB_API_KEY``, an identity token file, or the key
    ``wandb login`` stores in ~/.netrc for its host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    import netrc

    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, OSError, netrc.NetrcParseError):
        return False


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


class MlflowSink:
    name = "mlflow"

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any] | None):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:  # MLflow 3 asks for an opt-in to its file store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        run_id = _ids(run_dir).get("mlflow")
        if run_id and self._exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(project)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
            run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
            self._params(run_id, config or {})
        self.run_id = run_id
        _save_id(run_dir, "mlflow", run_id)

    def _exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
            return True
        except Exception:  # noqa: BLE001  (another tracking store: a new run there)
            return False

    def _params(self, run_id: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = _flatten(config)
        params = [Param(_MLFLOW_KEY.sub("_", k), json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in flat.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run_id, params=[Param(p.key, p.value[:6000]) for p in params[start:start + 100]])

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(_MLFLOW_KEY.sub("_", k), v, now, iteration) for k, v in numbers(metrics).items()]
        for start in range(0, len(rows), 1000):  # and at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=rows[start:start + 1000])

    def purge_after(self, iteration: int) -> None:
        """MLflow keeps what it received: the redone iterations of a resumed run are logged again at their step."""

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# what installs each logger's package (wandb and mlflow are slea extras; make's set-up installs both)
INSTALL = {"wandb": "pip install 'slea[wandb]'", "mlflow": "pip install 'slea[mlflow]'",
           "tensorboard": "pip install tensorboard"}


def open_sinks(names: list[str] | tuple[str, ...], run_dir: Path, *, project: str = "slea",
               config: dict[str, Any] | None = None) -> list[Sink]:
    """The sinks ``names`` asks for (``jsonl`` is RunLog's own), each started or skipped with one warning line."""
    sinks: list[Sink] = []
    for name in dict.fromkeys(n for n in names if n != "jsonl"):
        try:
            if name == "tensorboard":
                sinks.append(TensorBoardSink(run_dir))
            elif name == "wandb":
                sinks.append(WandbSink(run_dir, project, config))
            elif name == "mlflow":
                sinks.append(MlflowSink(run_dir, project, config))
            else:
                log.warning("logger %r: unknown (known: jsonl, tensorboard, wandb, mlflow); skipped", name)
        except ImportError as exc:
            if name not in _reported:  # said once per process; metrics.jsonl still gets every row
                _reported.add(name)
                log.warning("%s logger off: %s is not installed (%s); metrics.jsonl is still written", name,
                            exc.name or name, INSTALL[name])
        except Exception as exc:  # noqa: BLE001  (a logger must never stop the run)
            log.warning("%s logger off: %s; metrics.jsonl is still written", name, _first_line(exc))
    return sinks


def safe_call(sinks: list[Sink], what: str, *args: Any) -> list[Sink]:
    """Call ``what`` on every sink; one that raises is switched off with one warning line. Returns the sinks
    still on."""
    alive = []
    for sink in sinks:
        try:
            getattr(sink, what)(*args)
            alive.append(sink)
        except Exception as exc:  # noqa: BLE001  (a logger must never stop the run)
            log.warning("%s logger off after an error in %s: %s; metrics.jsonl is still written", sink.name, what,
                        _first_line(exc))
    return alive
