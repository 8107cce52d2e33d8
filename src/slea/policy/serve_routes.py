"""The routes of ``slea serve``'s app, one function per group (:func:`slea.policy.server.build_app` assembles
them): the model list and health, the two generation endpoints, LoRA adapter loading, vLLM's sleep mode, and the
error handlers that give every refusal the OpenAI error shape. What the routes that reach the engine share — the
request's deadline, its body read within ``max_body_bytes``, its admission and its answer through the gate — is
:class:`Requests` (slea/policy/serve_gate.py, slea/policy/serve_http.py)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from slea.policy.openai_protocol import AdapterRequest, RequestError, error_body, parse_request
from slea.policy.serve_gate import Gate, Pipe
from slea.policy.serve_http import read_body

if TYPE_CHECKING:
    from slea.policy.server import Engine, ServeSettings

try:  # the serve extra; FastAPI resolves the routes' (string) annotations in this module's namespace
    from fastapi import Request
except ImportError:  # the engine alone works without it; make_server says what to install
    Request = None  # type: ignore[assignment,misc]

log = logging.getLogger("slea.policy.server")  # the server's log, whichever module of it writes


def error_response(exc: RequestError):
    """A refused request as its OpenAI-shaped JSON answer (408 and 413 also close the connection)."""
    from fastapi.responses import JSONResponse

    headers = {"Connection": "close"} if exc.status in (408, 413) else None
    return JSONResponse(error_body(exc.status, str(exc), exc.param, exc.code), status_code=exc.status,
                        headers=headers)


class Requests:
    """A request that reaches the engine: its deadline (from its arrival), its body, its admission through the
    gate, its answer (streamed or whole), and a client that went away (499, nobody to answer)."""

    def __init__(self, engine: Engine, gate: Gate, settings: ServeSettings):
        self.engine = engine
        self.gate = gate
        self.settings = settings

    async def body(self, request) -> bytes:
        """The request's body, read within the body size and time limits; its deadline starts here."""
        s = self.settings
        request.state.deadline = time.monotonic() + s.request_timeout_s  # from the request's arrival
        raw = await read_body(request, s.max_body_bytes, s.header_timeout_s, s.request_timeout_s)
        return raw or b"{}"

    async def start(self, request, work, prepare=None):
        """``prepare()`` off the engine, then ``work(prepared, cancel)`` started on it, within the request's
        deadline (slea/policy/serve_gate.py): ``(ticket, prepared, future)``, or ``None`` when the client went away
        first."""
        gate = self.gate
        ticket = gate.admit(request, request.state.deadline)
        try:
            prepared = await gate.prepare(ticket, prepare) if prepare is not None else None
            future = await gate.start(ticket, lambda cancel: work(prepared, cancel))
        except BaseException:
            ticket.close()
            raise
        if future is None:
            ticket.close()
            return None
        return ticket, prepared, future

    @staticmethod
    def gone(request):
        """The answer to a client that disconnected: none (499), and a log line."""
        from fastapi.responses import Response

        log.info("%s: the client disconnected; generation stopped", request.url.path)
        return Response(status_code=499)  # nobody to answer

    async def generate(self, request, prepare):
        """A generation request: ``prepare(raw body)`` off the engine (checked, rendered, tokenized), then the
        engine's run, streamed as server-sent events as it is made or answered whole."""
        from fastapi.responses import JSONResponse, StreamingResponse

        raw = await self.body(request)
        pipe = Pipe()
        started = await self.start(request, lambda job, cancel: self.engine.run(
            job, cancel, pipe.put if job.body.get("stream") else None), lambda: prepare(raw))
        if started is None:
            return self.gone(request)
        ticket, job, future = started
        if job.body.get("stream"):  # the events go as the engine makes them
            return StreamingResponse(pipe.events(self.gate, ticket, future), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        answer = await self.gate.result(ticket, future)
        return self.gone(request) if answer is None else JSONResponse(answer)

    async def adapter(self, request, method):
        """An adapter request: ``method(body)`` on the engine, its line as plain text."""
        from fastapi.responses import PlainTextResponse

        body = parse_request(AdapterRequest, await self.body(request))
        started = await self.start(request, lambda _, cancel: method(body))
        answer = await self.gate.result(started[0], started[2]) if started else None
        return PlainTextResponse(answer or "")


def add_model_routes(app, engine: Engine) -> None:
    """``GET /health`` (no key needed), ``GET /v1/models`` and ``GET /v1/models/{id}``."""
    from fastapi.responses import Response

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return engine.models()

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        found = [m for m in engine.models()["data"] if m["id"] == name]
        if not found:
            raise RequestError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")
        return found[0]


def add_generation_routes(app, requests: Requests) -> None:
    """``POST /v1/completions`` and ``POST /v1/chat/completions``."""
    engine = requests.engine

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await requests.generate(request, engine.prepare_completion)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await requests.generate(request, engine.prepare_chat)


def add_adapter_routes(app, requests: Requests) -> None:
    """``POST /v1/load_lora_adapter`` (403 before anything is read unless the server has a ``lora_dir``) and
    ``POST /v1/unload_lora_adapter``."""
    engine = requests.engine

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request):
        if requests.settings.lora_dir is None:  # before reading anything
            return error_response(RequestError(403, "load_lora_adapter is off: start slea serve with --lora-dir DIR "
                                                    "to load LoRA adapters from folders under DIR",
                                               code="lora_loading_disabled"))
        return await requests.adapter(request, engine.load_lora)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request):
        return await requests.adapter(request, engine.unload_lora)


def add_sleep_routes(app, engine: Engine) -> None:
    """vLLM's sleep mode as a state only: ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``."""
    from fastapi.responses import PlainTextResponse

    @app.post("/sleep")
    async def sleep():
        return PlainTextResponse(engine.set_sleeping(True))

    @app.post("/wake_up")
    async def wake_up():
        return PlainTextResponse(engine.set_sleeping(False))

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": engine.sleeping}


def add_error_handlers(app) -> None:
    """Every refusal in the OpenAI error shape: a :class:`RequestError` as raised, an unknown route (404) or
    method (405), and any other failure a 500 naming the exception (logged with its traceback)."""
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestError)
    async def refused(request, exc: RequestError):
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        if exc.status_code == 404:
            msg, code = f"Invalid URL ({request.method} {request.url.path}): slea serve has no such route", "unknown_url"
        elif exc.status_code == 405:
            msg, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            msg, code = str(exc.detail), None
        return JSONResponse(error_body(exc.status_code, msg, None, code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def failed(request, exc: Exception):
        log.exception("request failed")
        return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), status_code=500)
