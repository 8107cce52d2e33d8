"""``slea serve tiny`` as a process on localhost, and ``slea train --set model.generator=openai`` against it: the
trainer's rollouts come from the server, its weights reach the server after every update, and the served
log-probs equal the trained model's forward."""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from slea.testing.server import serving, start_server

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"))


@pytest.fixture(scope="module")
def server():
    """``slea serve tiny --port 0`` in a subprocess, adapter loading on for the temp folder the trainer's weight
    syncs write under (``--lora-dir``); yields its base URL (the port it prints)."""
    with serving("tiny", "--port", "0", "--dtype", "float32", "--lora-dir", tempfile.gettempdir()) as s:
        assert s.url.startswith("http://127.0.0.1:"), s.url
        yield s.url


def test_serve_lists_the_model_and_completes_token_id_prompts(server):
    models = httpx.get(f"{server}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    r = httpx.post(f"{server}/completions", timeout=30, json={
        "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 3, "temperature": 0, "logprobs": 1, "return_token_ids": True})
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    for c in choices:
        assert len(c["token_ids"]) == len(c["logprobs"]["token_logprobs"]) == 3
        assert all(v <= 0 for v in c["logprobs"]["token_logprobs"])


def test_a_server_that_does_not_start_is_a_runtime_error_with_its_output():
    with pytest.raises(RuntimeError, match=r"slea serve did not start: serve: 'no/such/model' is neither"):
        start_server("no/such/model", "--port", "0")


def test_serve_refuses_a_bad_model_argument():
    r = subprocess.run([sys.executable, "-m", "slea.cli", "serve", "no/such/model"], check=False, capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "serve: 'no/such/model' is neither" in r.stderr


@pytest.mark.parametrize(("args", "key"), [(["--api-key", ""], None), (["--api-key", " "], None), ([], ""),
                                           ([], "  ")])
def test_serve_refuses_an_empty_api_key(args, key):
    """``--api-key "$KEY"`` (or ``SLEA_API_KEY=$KEY``) with KEY unset: one line and exit 2, never a server without a
    key (before: it served, no key needed, and said nothing)."""
    env = {k: v for k, v in ENV.items() if k != "SLEA_API_KEY"} | ({} if key is None else {"SLEA_API_KEY": key})
    proc = subprocess.Popen([sys.executable, "-m", "slea.cli", "serve", "tiny", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out = proc.stdout.readline()  # "serving tiny at ..." when it serves; "" when it exits
    proc.terminate()
    errors = proc.communicate(timeout=30)[1]
    assert "serving tiny" not in out and proc.returncode == 2, (proc.returncode, out, errors)
    line = errors.strip()
    assert "\n" not in line and line.startswith("serve: ") and "empty" in line, line


def test_serve_computes_in_the_precision_model_dtype_auto_picks():
    """Without --dtype the server computes as ``slea agent``'s in-process engine does (``model.dtype: auto``): bf16
    only where this CPU computes it natively. (A bf16 default made a served agent ~30x slower than the in-process
    one on an AVX2 CPU, and its numbers differ from the fp32 in-process engine's.)"""
    from slea.policy.server import load_engine
    from slea.precision import cpu_native_bf16

    assert load_engine("tiny").dtype == ("bfloat16" if cpu_native_bf16() else "float32")
    assert load_engine("tiny", dtype="bfloat16").dtype == "bfloat16"
    assert load_engine("tiny", dtype="auto").gen.dtype == load_engine("tiny").gen.dtype


@pytest.mark.slow
def test_train_with_the_openai_generator_syncs_weights_to_the_server(server, tmp_path, slea_cli):
    run = tmp_path / "run"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "slea.cli", "train", str(ROOT / "configs/smoke.yaml"),
                        "--set", f"run.dir={run}", "--set", "model.generator=openai",
                        "--set", f"model.openai.base_url={server}", "--set", "model.openai.timeout_s=60",
                        # the run's own final evaluation is read by nothing below: its smallest
                        "--set", "eval.before=false", "--set", "eval.greedy=false", "--set", "eval.games=1",
                        "--set", "eval.episodes_per_game=1",
                        # free-text answers with rewards a tiny random model earns (slea/testing/two_turn.py)
                        "--set", "plugins=[slea.testing.two_turn]", "--set", "env.id=slea/FirstChoice-v0",
                        "--set", "env.kwargs={}", "--set", "env.eval_kwargs={}", "--set", "rollout.group_size=4"],
                       check=False, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in rows] == [0, 1]
    # fp32 on both sides, the same weights: the server's log-probs equal the trainer's to rounding (~1e-7). At
    # iteration 1 that holds only because iteration 0's update reached the server (stale weights: ~1e-4)
    assert all(m["update/mismatch_max_dev"] < 1e-5 for m in rows if "update/mismatch_max_dev" in m)
    assert any("update/mismatch_max_dev" in m for m in rows)
    served = [m["id"] for m in httpx.get(f"{server}/models", timeout=10).json()["data"]]
    assert served[0] == "tiny" and len(served) == 2 and served[1].startswith("slea-sync-")  # the last sync
    trained = _served_equals_the_checkpoint(server, served[1], run)
    base = httpx.post(f"{server}/completions", timeout=30, json={
        "model": "tiny", "prompt": [trained[0]], "max_tokens": len(trained[1]), "temperature": 0, "logprobs": 1})
    assert base.json()["choices"][0]["logprobs"]["token_logprobs"] != pytest.approx(trained[2], abs=1e-4)
    # `slea serve RUN`: the run's model with its last checkpoint's adapter, under the run folder's name
    from slea.policy.server import load_engine

    engine = load_engine(str(run), dtype="float32")
    assert engine.lora == "run" and [m["id"] for m in engine.models()["data"]] == [str(run), "run"]
    again = engine.complete({"model": "run", "prompt": [trained[0]], "max_tokens": len(trained[1]), "temperature": 0,
                             "logprobs": 1, "return_token_ids": True})["choices"][0]
    assert again["token_ids"] == trained[1]
    assert again["logprobs"]["token_logprobs"] == pytest.approx(trained[2], abs=1e-5)
    # `slea eval RUN` through the server (the run's own engine): its trained adapter is uploaded first (in this
    # process: one interpreter less)
    ev = slea_cli("eval", run, "--out", tmp_path / "ev", "--set", "eval.games=1", "--set", "eval.episodes_per_game=1")
    assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-3000:]
    synced = [m["id"] for m in httpx.get(f"{server}/models", timeout=10).json()["data"]]
    assert len(synced) == 2 and synced[1].startswith("slea-sync-") and synced[1] != served[1]
    print(f"slea train with model.generator=openai: {time.perf_counter() - t0:.1f}s")


def _served_equals_the_checkpoint(url: str, adapter: str, run: Path):
    """The served adapter's greedy log-probs equal the forward of the run's last checkpoint (the last update);
    returns ``(prompt, ids, log-probs)``."""
    from slea.config import load_config
    from slea.policy.engines import make_generator
    from slea.policy.model import load_policy
    from slea.runs.checkpoint import latest_checkpoint
    from slea.trainer.update import Sample, response_logprobs

    cfg = load_config(run / "config.yaml", [f"model.openai.model={adapter}"])
    model, tok = load_policy(cfg.model, adapter_dir=latest_checkpoint(run / "checkpoints"))
    gen = make_generator(cfg.model, model, tok)
    prompts = [tok("Goal: take the coin. Your command:", add_special_tokens=False).input_ids]
    out = gen.generate(prompts, max_new_tokens=5, temperature=0.0, stop_at_newline=False)
    logp, _ = response_logprobs(model, [Sample(prompts[0], out[0].ids, out[0].logprobs, [0.0] * len(out[0].ids))],
                                temperature=1.0, dtype="float32")
    assert out[0].logprobs == pytest.approx(logp[0, -len(out[0].ids):].tolist(), abs=1e-4)
    return prompts[0], out[0].ids, out[0].logprobs


@pytest.mark.slow
def test_eval_with_the_openai_generator(server, tmp_path):
    """``slea eval tiny`` through the server: the model is frozen (no trained weights), so nothing is uploaded;
    the evaluation runs on the server."""
    before = [m["id"] for m in httpx.get(f"{server}/models", timeout=10).json()["data"]]
    r = subprocess.run([sys.executable, "-m", "slea.cli", "eval", "tiny", "--out", str(tmp_path),
                        "--set", "model.generator=openai", "--set", f"model.openai.base_url={server}",
                        "--set", "model.openai.model=tiny",
                        "--set", "plugins=[slea.testing.two_turn]", "--set", "env.id=slea/FirstChoice-v0",
                        "--set", "eval.games=1", "--set", "eval.episodes_per_game=2"],
                       check=False, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "eval" / "eval-heldout.json").read_text())
    assert res["env"] == "slea/FirstChoice-v0" and res["sampled"]["episodes"] == 2
    assert [m["id"] for m in httpx.get(f"{server}/models", timeout=10).json()["data"]] == before  # no upload


AGENT = ["--env", "slea/Sokoban-v0", "--games", "2", "--episodes", "2", "--set", "env.max_steps=2", "--set",
         "rollout.max_new_tokens=4"]


def _agent(tmp_path: Path, name: str, *extra: str, library: Path, model: str = "tiny"
           ) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "slea.cli", "agent", "--model", model, "--library", str(library), *AGENT,
                        "--out", str(out), *extra], check=False, capture_output=True, text=True, env=ENV, timeout=300)
    return r, out


@pytest.mark.slow
def test_a_frozen_served_agent_plays_what_the_in_process_engine_plays(server, tmp_path, slea_cli, tiny_run):
    """The issue's command: a frozen model on the server, no LoRA, no weight sync; its numbers are the in-process
    engine's exactly (fp32 on both sides, the same keyed sampling streams)."""
    listed_before = _model_ids(server)  # the module's server may hold adapters other tests uploaded
    served, out = _agent(tmp_path, "served", "--set", "model.generator=openai", "--set",
                         f"model.openai.base_url={server}", "--set", "model.lora=false", library=tiny_run)
    assert served.returncode == 0, served.stdout[-2000:] + served.stderr[-3000:]
    out_hf = tmp_path / "hf"  # the in-process engine's run, in this process too (slea_cli): an interpreter saved
    local = slea_cli("agent", "--model", "tiny", "--library", tiny_run, *AGENT, "--out", out_hf, "--set",
                     "model.dtype=float32")
    assert local.returncode == 0, local.stderr[-3000:]
    a = json.loads((out / "agent.json").read_text())
    b = json.loads((out_hf / "agent.json").read_text())
    assert a["without"] == b["without"] and a["with"] == b["with"] and a["table"] == b["table"]
    assert a["with"]["sampled"]["episodes"] == 4
    # nothing was uploaded: the server lists what it listed before the run
    assert _model_ids(server) == listed_before and "tiny" in listed_before


def _model_ids(server: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{server}/models", timeout=10).json()["data"]]


@pytest.mark.slow
def test_a_served_agent_in_chat_mode_evolves_its_library_with_lessons_from_the_served_model(server, tmp_path):
    """A model known only by the server (no local weights, no local tokenizer: chat messages travel) learns a
    library from nothing; its lessons are written by the served model, the rules filling in."""
    new = tmp_path / "new.sqlite"
    r, out = _agent(tmp_path, "chat", "--evolve", "--set", "model.generator=openai", "--set",
                    f"model.openai.base_url={server}", "--set", "model.openai.api=chat",
                    "--set", "experience.extractor=llm", "--set", "experience.extract_max_new_tokens=16",
                    model="only-the-server-has-it", library=new)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"new empty library {new}" in r.stdout and "no local tokenizer for only-the-server-has-it" in r.stdout
    res = json.loads((out / "agent.json").read_text())
    assert res["library"]["before"]["size"] == 0 and res["library"]["after"]["size"] > 0
    x = res["extraction"]
    assert x["answers"] > 0 and x["generate_errors"] == 0  # the served model was asked, and answered
    assert x["parse_rate"] == x["parsed"] / x["answers"] and x["parsed"] + x["fallback"] == x["answers"]
    assert (out / "library.sqlite").is_file() and res["library"]["after"]["size"] >= res["library"]["before"]["size"]
    assert f"{int(x['answers'])} answers parsed" in " ".join(r.stdout.split())


def _completions_only_server():
    """A server with /v1/models and /v1/completions (text, no log-probs) and nothing else: what a minimal
    OpenAI-compatible server offers."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply(200, {"data": [{"id": "m"}]} if self.path == "/v1/models" else {"error": {}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/completions":
                self._reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                return
            n = len(body["prompt"]) if isinstance(body["prompt"], list) else 1
            self._reply(200, {"choices": [{"index": i, "text": "north", "logprobs": None} for i in range(n)]})

        def log_message(self, *args):
            pass

    import threading

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"


def test_the_agent_refuses_in_one_line_what_the_server_lacks(tmp_path, tiny_run):
    srv, url = _completions_only_server()
    try:
        r, _ = _agent(tmp_path, "x", "--set", "model.generator=openai", "--set", f"model.openai.base_url={url}",
                      "--set", "model.openai.api=chat", library=tiny_run)
        assert r.returncode == 2, r.stderr[-2000:]
        line = r.stderr.strip()
        assert "\n" not in line and "Traceback" not in r.stderr
        assert line.startswith("model.openai.api: chat: the server offers no") and "model.openai.api: completions" in line
        # training needs log-probs, which this server does not return: refused by the same check
        from slea.config import ModelSection
        from slea.policy.engines import make_generator
        from slea.policy.model import load_tokenizer
        from slea.policy.openai_engine import GeneratorError

        gen = make_generator(ModelSection(name_or_path="tiny", generator="openai", openai={"base_url": url}), None,
                             load_tokenizer("tiny"))
        with pytest.raises(GeneratorError, match="returns no per-token log-probs, which training needs"):
            gen.check()
        frozen = make_generator(ModelSection(name_or_path="tiny", generator="openai", openai={"base_url": url}),
                                None, load_tokenizer("tiny"), trains=False)
        frozen.check()  # a frozen policy needs none
        assert frozen.generate([[5, 6]], max_new_tokens=2)[0].text == "north"
    finally:
        srv.shutdown()
        srv.server_close()
