"""docs/howto.md runs as written: every command of its bash blocks, in order, in a folder that holds the
repository's docs/ and configs/ (so `runs/...` lands in a temporary folder), on the tiny model. A block that starts
with ``# not run by the tests:`` is skipped (it says why). Each job is one test; a job runs the jobs before it
first when their outputs are missing, so any one of them can run alone. A ``slea`` command runs in the test's
process (``slea_cli``: the same arguments and folder, without the seconds a fresh interpreter spends importing),
but for those that start processes of their own (``--nproc``, ``env.workers=ray``, ``slea serve ... &``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slea.testing.server import Server, start_server

ROOT = Path(__file__).resolve().parents[1]
HOWTO = ROOT / "docs" / "howto.md"
NOT_RUN = "# not run by the tests:"
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")


def jobs() -> dict[str, list[str]]:
    """Section title -> the command lines of its bash blocks, in page order (a block marked NOT_RUN left out)."""
    out: dict[str, list[str]] = {}
    section = None
    for part in re.split(r"^(## .+)$", HOWTO.read_text(), flags=re.MULTILINE):
        if part.startswith("## "):
            section = part[3:].strip()
            out[section] = []
            continue
        if section is None:
            continue
        for body in re.findall(r"^```bash\n(.*?)^```", part, flags=re.MULTILINE | re.DOTALL):
            if body.startswith(NOT_RUN):
                continue
            out[section] += [line.strip() for line in body.splitlines() if line.strip() and not line.startswith("#")]
    return out


JOBS = jobs()


class Workspace:
    """The folder the commands run in, the jobs done so far, and a served model when a job starts one."""

    def __init__(self, path: Path):
        self.path = path
        (path / "docs").symlink_to(ROOT / "docs")
        (path / "configs").symlink_to(ROOT / "configs")
        self.done: dict[str, list[subprocess.CompletedProcess]] = {}
        self.servers: list[Server] = []
        self.urls: dict[str, str] = {}
        self.slea = None  # the running test's slea_cli (the ws fixture sets it)

    def argv(self, line: str) -> tuple[list[str], bool]:
        for shown, real in self.urls.items():
            line = line.replace(shown, real)
        background = line.endswith("&")
        words = shlex.split(line.rstrip("&").strip())
        if words[0] == "slea":
            return [sys.executable, "-m", "slea.cli", *words[1:]], background
        if words[0] == "python":
            return [sys.executable, *words[1:]], background
        raise AssertionError(f"docs/howto.md: a command the test does not know how to run: {line}")

    def serve(self, argv: list[str], line: str) -> None:
        """Start ``slea serve ... --port P &`` on a free port instead, and use its URL where P's was written."""
        port = argv[argv.index("--port") + 1]
        argv[argv.index("--port") + 1] = "0"
        try:
            server = start_server(*argv[4:], env=ENV, cwd=self.path)
        except RuntimeError as exc:
            raise AssertionError(f"`{line}`: {exc}") from None
        self.servers.append(server)
        assert server.url.startswith("http://127.0.0.1:"), f"`{line}`: {server.url}"
        self.urls[f"http://127.0.0.1:{port}/v1"] = server.url

    def run(self, title: str) -> list[subprocess.CompletedProcess]:
        if title in self.done:
            return self.done[title]
        for before in list(JOBS)[:list(JOBS).index(title)]:
            if before not in SLOW:
                self.run(before)
        results = []
        for line in JOBS[title]:
            argv, background = self.argv(line)
            if background:
                assert argv[3] == "serve", f"only `slea serve` runs in the background: {line}"
                self.serve(argv, line)
                continue
            if argv[1:3] == ["-m", "slea.cli"] and not OWN_PROCESSES.search(line):
                r = self.slea(*argv[3:], cwd=self.path)
            else:
                r = subprocess.run(argv, cwd=self.path, env=ENV, capture_output=True, text=True, timeout=280,
                                   check=False)
            assert r.returncode == 0, f"`{line}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            results.append(r)
        self.done[title] = results
        return results

    def close(self) -> None:
        for server in self.servers:
            server.stop()


SLOW = {"Compare algorithms", "Scale out"}  # two trainings each; a later job never waits for them
OWN_PROCESSES = re.compile(r"--nproc|env\.workers=ray")  # a slea command run in a fresh interpreter


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    w = Workspace(tmp_path_factory.mktemp("howto"))
    yield w
    w.close()


@pytest.fixture
def ws(workspace, slea_cli):
    workspace.slea = slea_cli
    return workspace


def test_the_page_has_the_seven_jobs_and_each_has_commands():
    assert list(JOBS) == ["Your own environment", "Your own tools", "Your own Hugging Face model", "Compare algorithms",
                          "Read a run and its report", "The library with a served model, no training", "Scale out"]
    assert all(JOBS[j] for j in JOBS), {j: len(c) for j, c in JOBS.items()}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_your_own_environment(ws):
    r = ws.run("Your own environment")
    assert "invalid: True" in r[0].stdout and "won: True" in r[0].stdout  # play_env.py's checks passed
    run = ws.path / "runs/howto-env"
    cfg = (run / "config.yaml").read_text()
    assert "howto/Doors-v0" in cfg and "docs.howto.my_env" in cfg  # resumable: the plugin is saved
    rows = _metrics(run)
    assert [m["iteration"] for m in rows] == [0, 1] and any(m.get("update/trained_samples", 0) > 0 for m in rows)
    summary = json.loads((run / "eval/summary.json").read_text())
    assert summary["after"]["env"] == "howto/Doors-v0" and summary["after"]["sampled"]["episodes"] == 4


def test_your_own_tools(ws):
    r = ws.run("Your own tools")
    played = r[0].stdout  # play_tools.py's checks passed: a bad call is an invalid step with the reason, then a win
    assert "error: unknown tool 'find_city'" in played and "won: True" in played
    assert '"name": "find_office", "description": "Find the office of a person."' in played  # generated schema
    shown = (ROOT / "docs/howto.md").read_text()
    assert all(line in shown for line in played.splitlines()), "the page shows play_tools.py's output as it is"
    run = ws.path / "runs/howto-tools"
    cfg = (run / "config.yaml").read_text()
    assert "howto/Office-v0" in cfg and "docs.howto.my_tools" in cfg and "max_new_tokens: 64" in cfg
    rows = _metrics(run)
    assert [m["iteration"] for m in rows] == [0, 1] and rows[1]["train/retrieval_hit_rate"] > 0
    from slea.experience.library import ExperienceLibrary

    lib = ExperienceLibrary(run / "library.sqlite")  # lessons about tool calls, naming the env's tools
    texts = [e.text for e in lib.entries()]
    lib.close()
    assert any("find_office, office_city, answer" in t for t in texts), texts


def test_your_own_hugging_face_model(ws):
    r = ws.run("Your own Hugging Face model")
    model = ws.path / "runs/howto-model"
    assert (model / "model.safetensors").is_file() and not list(model.glob("*.bin"))
    check = r[1].stdout
    assert "chat template: yes" in check and "LoRA targets found: q_proj, v_proj" in check
    run = ws.path / "runs/howto-own-model"
    assert f"name_or_path: {'runs/howto-model'}" in (run / "config.yaml").read_text()
    assert len(_metrics(run)) == 2


def test_check_model_refuses_a_folder_without_safetensors_or_targets(tmp_path):
    """The checker of the second job says what is missing, exit code 2."""
    from slea.policy.tiny import tiny_model_dir

    src = Path(tiny_model_dir())
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (tmp_path / f.name).symlink_to(f)
    r = subprocess.run([sys.executable, str(ROOT / "docs/howto/check_model.py"), str(tmp_path), "--targets", "c_attn"],
                       capture_output=True, text=True, env=ENV, timeout=120, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "safetensors weights: NONE" in r.stdout and "LoRA targets found: NONE" in r.stdout


@pytest.mark.slow
def test_compare_algorithms(ws):
    ws.run("Compare algorithms")
    out = ws.path / "runs/howto-compare"
    table = (out / "table.md").read_text()
    assert re.search(r"^\| grpo \|", table, re.MULTILINE) and re.search(r"^\| slea \|", table, re.MULTILINE)
    assert (out / "report.html").is_file() and (out / "runs/slea-s0/library.sqlite").is_file()


def test_read_a_run_and_its_report(ws):
    r = ws.run("Read a run and its report")
    run = ws.path / "runs/howto-env"
    assert "<html" in (run / "report.html").read_text()[:2000].lower()
    # slea eval reproduces the run's own final evaluation (keyed sampling)
    after = json.loads((run / "eval/after.json").read_text())
    again = json.loads((run / "eval/eval-heldout.json").read_text())
    assert again["sampled"] == after["sampled"]
    lines = r[2].stdout.splitlines()
    assert lines[0].startswith("held-out before") and lines[1].startswith("held-out after")
    assert [ln.split()[0] for ln in lines[3:]] == ["0", "1"]  # one row per iteration


def test_the_library_with_a_served_model_no_training(ws):
    ws.run("The library with a served model, no training")
    res = json.loads((ws.path / "runs/howto-agent/agent.json").read_text())
    assert res["with"]["sampled"]["episodes"] == res["without"]["sampled"]["episodes"] == 4
    assert res["library"]["after"]["size"] >= res["library"]["before"]["size"] == 0
    assert (ws.path / "runs/howto-agent/library.sqlite").is_file()


@pytest.mark.slow
def test_scale_out(ws):
    ws.run("Scale out")
    for name in ("howto-ray", "howto-dp"):
        rows = _metrics(ws.path / "runs" / name)
        assert [m["iteration"] for m in rows] == [0, 1], name
    # the same seeds and tasks: the Ray pool plays what the local pool played in the first job
    local, ray = _metrics(ws.path / "runs/howto-env"), _metrics(ws.path / "runs/howto-ray")
    assert [m["train/success"] for m in ray] == [m["train/success"] for m in local]
