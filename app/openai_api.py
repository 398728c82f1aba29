"""An OpenAI-compatible chat endpoint on the app's engine, so standard clients (the openai SDK) can use it.

``model`` names a published template and the template supplies the system prompt, exactly as in
the chat tab: the same ``system_text(chain)``, the same ``PromptBuilder``, hence the same token
ids and the same cached blocks. The endpoint is stateless like OpenAI's: the client sends the
whole conversation each time and nothing is written to the database. Sampling (temperature,
top_p) follows the server's settings; those request fields are accepted and ignored. Two of
vLLM's extra fields are honoured: ``ignore_eos`` and ``cache_salt``.

    POST /v1/chat/completions   {"model": "电商客服", "messages": [...], "stream": true}
    GET  /v1/models             the published templates
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.engine import Delta, Engine, EngineBusy, EngineError, RequestStats
from app.prompts import PromptBuilder, PromptError, PromptTooLong, Turn, system_text


class TemplateLike(Protocol):
    name: str
    chain: tuple[str, ...]


class DeskLike(Protocol):
    """What the endpoint needs: the published templates, the prompt builder and the engine.

    ``app.desk.Desk`` is one; the benchmark's UI-free desk is another.
    """

    prompts: PromptBuilder
    engine: Engine

    def templates(self) -> Sequence[TemplateLike]: ...

    def tenant_salt(self, tenant: str) -> str | None: ...


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


@dataclass(frozen=True)
class ChatRequest:
    """A validated request body."""

    model: str
    history: tuple[Turn, ...]
    message: str
    stream: bool
    max_tokens: int | None
    ignore_eos: bool
    include_usage: bool
    cache_salt: str | None  # as in vLLM's server: a private cache namespace for this request


def build_openai_router(desk: DeskLike, *, tenant_header: str = "") -> APIRouter:
    """The ``/v1/models`` and ``/v1/chat/completions`` routes on ``desk``'s templates and engine.

    With ``tenant_header`` (set by a proxy), each tenant's prompts get the desk's salt for that
    tenant, as in the chat, so no tenant can tell from timing what another has cached; a request's
    own ``cache_salt`` then narrows that namespace further, never widens it.
    """
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def list_models() -> JSONResponse:
        data = [{"id": t.name, "object": "model", "created": 0, "owned_by": "prefixdesk"} for t in desk.templates()]
        return JSONResponse({"object": "list", "data": data})

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return ApiError(400, "The request body is not valid JSON.", code="invalid_json").response()
        try:
            chat = parse_chat_request(body)
            template = _find_template(desk, chat.model)
            prompt = desk.prompts.build(system_text(template.chain), chat.history, chat.message)
            budget = min(prompt.max_tokens, chat.max_tokens or prompt.max_tokens)
            salt = _salt(desk, request.headers.get(tenant_header, "")[:100] if tenant_header else "", chat.cache_salt)
            stream = desk.engine.stream(prompt.token_ids, max_tokens=budget, ignore_eos=chat.ignore_eos,
                                        cache_salt=salt)
            # Take the first event before answering, so a busy engine is a 429, not a broken stream.
            first = await _first_event(stream)
        except ApiError as exc:
            return exc.response()
        except PromptTooLong as exc:
            return ApiError(400, str(exc), code="context_length_exceeded", param="messages").response()
        except PromptError as exc:
            return ApiError(400, str(exc), code="invalid_prompt", param="messages").response()
        except EngineBusy as exc:
            return ApiError(429, str(exc), code="engine_busy", kind="rate_limit_error").response()
        except EngineError as exc:
            return ApiError(500, str(exc), code="engine_error", kind="server_error").response()
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if chat.stream:
            events = _sse(completion_id, chat, first, stream)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(completion_id, chat, first, stream)

    return router


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate an OpenAI chat body; raises ApiError (400) naming the field at fault."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must name a published template (GET /v1/models lists them).",
                       code="invalid_model", param="model")
    if body.get("n", 1) != 1:
        raise ApiError(400, "Only n=1 is supported.", code="unsupported_n", param="n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list.", code="invalid_messages", param="messages")
    turns: list[Turn] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("system", "developer"):
            raise ApiError(400, f"messages[{i}] is a {role} message; the template named by 'model' supplies the "
                           "system prompt, so send only user and assistant messages.",
                           code="system_message_not_allowed", param=f"messages[{i}]")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}].role must be 'user' or 'assistant'.", code="invalid_role",
                           param=f"messages[{i}].role")
        turns.append(Turn(role, _content_text(m.get("content"), i)))
    if turns[-1].role != "user":
        raise ApiError(400, "The last message must be from the user.", code="invalid_messages", param="messages")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ApiError(400, "'max_tokens' must be a positive integer.", code="invalid_max_tokens", param="max_tokens")
    options = body.get("stream_options") or {}
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ApiError(400, "'cache_salt' must be a non-empty string.", code="invalid_cache_salt", param="cache_salt")
    return ChatRequest(
        model=model,
        history=tuple(turns[:-1]),
        message=turns[-1].text,
        stream=bool(body.get("stream", False)),
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        include_usage=bool(options.get("include_usage", False)) if isinstance(options, dict) else False,
        cache_salt=cache_salt,
    )


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"messages[{i}].content must be text.", code="invalid_content", param=f"messages[{i}].content")


def _salt(desk: DeskLike, tenant: str, request_salt: str | None) -> str | None:
    tenant_salt = desk.tenant_salt(tenant) if tenant else None
    if tenant_salt and request_salt:
        return f"{tenant_salt}/{request_salt}"
    return tenant_salt or request_salt


def _find_template(desk: DeskLike, name: str) -> TemplateLike:
    templates = desk.templates()
    for t in templates:
        if t.name == name:
            return t
    shown = ", ".join(t.name for t in templates) or "none"
    raise ApiError(404, f"There is no published template named {name!r}. Choose one of: {shown}.",
                   code="model_not_found", param="model")


async def _first_event(stream: AsyncIterator[Delta | RequestStats]) -> Delta | RequestStats:
    try:
        return await anext(stream)
    except BaseException:
        await stream.aclose()
        raise


def _usage(stats: RequestStats | None) -> dict | None:
    if stats is None:
        return None
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.output_tokens,
            "total_tokens": stats.prompt_tokens + stats.output_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.num_cached_tokens}}


def _finish_reason(stats: RequestStats | None) -> str:
    return stats.finish_reason if stats and stats.finish_reason in ("stop", "length") else "stop"


async def _sse(completion_id: str, chat: ChatRequest, first: Delta | RequestStats,
               stream: AsyncIterator[Delta | RequestStats]) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> str:
        body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": chat.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    stats: RequestStats | None = None
    async with contextlib.aclosing(stream):  # a disconnect closes it, which aborts the request in vLLM
        yield chunk({"role": "assistant", "content": ""})
        event: Delta | RequestStats | None = first
        while event is not None:
            if isinstance(event, Delta):
                yield chunk({"content": event.text})
            else:
                stats = event
            try:
                event = await anext(stream, None)
            except EngineError as exc:  # headers are sent: report it in the stream, as OpenAI does
                error = {"error": {"message": str(exc), "type": "server_error", "param": None, "code": "engine_error"}}
                yield f"data: {json.dumps(error, ensure_ascii=False)}\n\n"
                return
    yield chunk({}, _finish_reason(stats))
    if chat.include_usage:
        body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": chat.model,
                "choices": [], "usage": _usage(stats)}
        yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"


async def _whole(completion_id: str, chat: ChatRequest, first: Delta | RequestStats,
                 stream: AsyncIterator[Delta | RequestStats]) -> JSONResponse:
    text, stats = "", None
    async with contextlib.aclosing(stream):
        event: Delta | RequestStats | None = first
        while event is not None:
            if isinstance(event, Delta):
                text += event.text
            else:
                stats = event
            event = await anext(stream, None)
    body = {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": chat.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": _finish_reason(stats)}],
        "usage": _usage(stats),
    }
    return JSONResponse(body)
