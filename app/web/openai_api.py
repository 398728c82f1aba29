"""An OpenAI-compatible chat endpoint on the app's engine, so standard clients (the openai SDK) can use it.

``model`` names a published template and the template supplies the system prompt, exactly as in
the chat: the same prefix token ids, hence the same cached blocks. The endpoint is stateless like
OpenAI's: the client sends the whole conversation each time and nothing is written to the
database. Sampling follows the server's settings; ``temperature``/``top_p`` are checked and
ignored. Two of vLLM's extra fields are honoured: ``ignore_eos`` and ``cache_salt``.

Every field is validated strictly before any work (a JSON ``true`` is not an integer, ``"false"``
is not a boolean), with sizes bounded — a message's characters counted over all its content parts;
each client address has a rate and a concurrency limit. ``usage.prompt_tokens_details.cached_tokens``
is capped at the template's shared prefix unless the request ran in a cache namespace of its own
(app/core/cache_figures.py).

    POST /v1/chat/completions   {"model": "电商客服", "messages": [...], "stream": true}
    GET  /v1/models             the customer-facing published templates
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from app.core.cache_figures import shown_cached_tokens
from app.core.callers import ProxyTrust, TenantRefused
from app.core.desk import MAX_HISTORY_MESSAGES, MAX_MESSAGE_CHARS, Desk, DeskInputError, check_history, clean_text
from app.core.limits import RateLimited, StreamSlot
from app.core.prompts import PromptError, PromptTooLong, Turn
from app.core.routing import routing_key
from app.engine import Delta, EngineBusy, EngineError, EngineRejected, RequestStats


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 kind: str = "invalid_request_error", retry_after_s: int = 0):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        return JSONResponse(body, status_code=self.status, headers=headers)


_STRICT = ConfigDict(extra="ignore", strict=True, frozen=True)


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: Annotated[StrictStr, Field(max_length=MAX_MESSAGE_CHARS)]


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[StrictStr, Field(max_length=MAX_MESSAGE_CHARS)] | Annotated[
        list[TextPart], Field(max_length=64)]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def num_chars(self) -> int:
        return len(self.content) if isinstance(self.content, str) else sum(len(p.text) for p in self.content)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: StrictBool = False


class ChatRequest(BaseModel):
    """A chat completion request; unknown fields are ignored, known ones must have their exact type."""

    model_config = _STRICT
    model: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_HISTORY_MESSAGES + 1)]
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1
    ignore_eos: StrictBool = False
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = None
    temperature: Annotated[StrictFloat | StrictInt, Field(ge=0, le=2)] | None = None
    top_p: Annotated[StrictFloat | StrictInt, Field(gt=0, le=1)] | None = None


def build_openai_router(desk: Desk, trust: ProxyTrust) -> APIRouter:
    """The ``/v1/models`` and ``/v1/chat/completions`` routes on ``desk``'s templates and engine.

    Behind a trusted proxy that names a tenant, each tenant's prompts get the desk's salt for that
    tenant, as in the chat; a request's own ``cache_salt`` then narrows that namespace, never widens it.
    """
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def list_models() -> JSONResponse:
        data = [{"id": t.name, "object": "model", "created": 0, "owned_by": "prefixdesk"}
                for t in desk.catalog.customer_facing()]
        return JSONResponse({"object": "list", "data": data})

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            caller = trust.caller(request.client.host if request.client else None, request.headers)
            chat = parse_chat_request(await request.body())
            history, message = _turns(chat)
            template = desk.customer_template(chat.model)
            desk.limiter.check_rate(caller.address)
            slot = desk.limiter.stream(caller.address)
        except ApiError as exc:
            return exc.response()
        except TenantRefused as exc:
            return ApiError(403, str(exc), code="tenant_refused", kind="permission_error").response()
        except DeskInputError as exc:
            return ApiError(404, str(exc), code="model_not_found", param="model").response()
        except RateLimited as exc:
            return ApiError(429, str(exc), code="rate_limited", kind="rate_limit_error",
                            retry_after_s=exc.retry_after_s).response()
        salt = _salt(desk.tenant_salt(caller.tenant), chat.cache_salt)
        figures = _CachedFigures(desk.shared_tokens(template.name), own_namespace=salt is not None)
        try:
            prompt = await desk.build_prompt(template, history, message)
            budget = min(prompt.max_tokens, chat.max_completion_tokens or chat.max_tokens or prompt.max_tokens)
            stream = desk.engine.stream(prompt.token_ids, max_tokens=budget, ignore_eos=chat.ignore_eos,
                                        cache_salt=salt,
                                        routing_key=routing_key(template.family, shards=desk.family_shards,
                                                                shard_seed=uuid.uuid4().hex),
                                        step_delay_ms=desk.step_delay_ms)
            # Take the first event before answering, so a busy engine is a 429, not a broken stream.
            first = await _first_event(stream)
        except BaseException as exc:
            slot.release()
            if isinstance(exc, Exception) and (error := _engine_error(exc)) is not None:
                return error.response()
            raise
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if chat.stream:
            events = _sse(completion_id, chat, first, stream, slot, figures)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return await _whole(completion_id, chat, first, stream, figures)
        finally:
            slot.release()

    return router


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a raw request body; raises ApiError (400) naming the field at fault."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_body")
    try:
        return ChatRequest.model_validate(data)
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.", code="invalid_json") from None
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        param = _param(error["loc"])
        raise ApiError(400, f"'{param}': {_explain(error)}.", code="invalid_" + str(error["loc"][0]),
                       param=param) from None


def _turns(chat: ChatRequest) -> tuple[list[Turn], str]:
    for i, m in enumerate(chat.messages):  # counted before any text is joined, cleaned or tokenized
        if (n := m.num_chars()) > MAX_MESSAGE_CHARS:
            raise ApiError(400, f"messages[{i}].content has {n:,} characters; the limit is {MAX_MESSAGE_CHARS:,} "
                           "per message, over all its parts. Please shorten it or split it into several messages.",
                           code="message_too_long", param=f"messages[{i}].content")
    turns: list[Turn] = []
    for i, m in enumerate(chat.messages):
        if m.role in ("system", "developer"):
            raise ApiError(400, f"messages[{i}] is a {m.role} message; the template named by 'model' supplies the "
                           "system prompt, so send only user and assistant messages.",
                           code="system_message_not_allowed", param=f"messages[{i}]")
        turns.append(Turn(m.role, m.text()))
    if turns[-1].role != "user":
        raise ApiError(400, "The last message must be from the user.", code="invalid_messages", param="messages")
    message = clean_text(turns[-1].text).strip()
    if not message:
        raise ApiError(400, "The last user message is empty; send a question.", code="empty_message",
                       param=f"messages[{len(turns) - 1}].content")
    try:
        return check_history(turns[:-1]), message
    except DeskInputError as exc:
        raise ApiError(400, str(exc), code="history_too_long", param="messages") from None


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[TextPart]", "int", "float", "constrained-str", "constrained-int"):
            continue  # pydantic names the union member it tried; the field is what matters
        else:
            out += ("." if out else "") + str(part)
    return out


def _explain(error: dict) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "string_unicode":
        return "must be valid Unicode text (it holds an unpaired surrogate)"
    if kind in ("string_type", "list_type") and "content" in error["loc"]:
        return "must be a string or a list of {\"type\": \"text\", \"text\": ...} parts"
    names = {"int_type": "must be an integer", "bool_type": "must be true or false", "string_type": "must be a string",
             "list_type": "must be a list", "model_type": "must be an object", "float_type": "must be a number",
             "missing": "is required", "dict_type": "must be an object"}
    if kind in names:
        return names[kind]
    if kind == "literal_error":
        return error["msg"].replace("Input should be", "must be")
    if kind in ("less_than_equal", "less_than"):
        return f"must be at most {ctx.get('le', ctx.get('lt'))}"
    if kind in ("greater_than_equal", "greater_than"):
        return f"must be {'at least' if kind == 'greater_than_equal' else 'more than'} {ctx.get('ge', ctx.get('gt'))}"
    if kind in ("too_long", "too_short", "string_too_long", "string_too_short"):
        return (error["msg"].replace("List should have", "must have").replace("String should have", "must have")
                .replace(" after validation", ""))
    return error["msg"][0].lower() + error["msg"][1:]


def _salt(tenant_salt: str | None, request_salt: str | None) -> str | None:
    if tenant_salt and request_salt:
        return f"{tenant_salt}/{request_salt}"
    return tenant_salt or request_salt


def _engine_error(exc: Exception) -> ApiError | None:
    if isinstance(exc, PromptTooLong):
        return ApiError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, PromptError):
        return ApiError(400, str(exc), code="invalid_prompt", param="messages")
    if isinstance(exc, EngineBusy):
        return ApiError(429, str(exc), code="engine_busy", kind="rate_limit_error", retry_after_s=1)
    if isinstance(exc, EngineRejected):
        return ApiError(400, str(exc), code="rejected_by_engine")
    if isinstance(exc, EngineError):
        return ApiError(500, str(exc), code="engine_error", kind="server_error")
    return None


async def _first_event(stream: AsyncIterator[Delta | RequestStats]) -> Delta | RequestStats:
    try:
        return await anext(stream)
    except BaseException:
        await stream.aclose()
        raise


@dataclass(frozen=True)
class _CachedFigures:
    """How many cached tokens a caller may be told of: app/core/cache_figures.py."""

    shared_tokens: int
    own_namespace: bool


def _usage(stats: RequestStats | None, figures: _CachedFigures) -> dict | None:
    if stats is None:
        return None
    cached = shown_cached_tokens(stats.num_cached_tokens, shared_tokens=figures.shared_tokens,
                                 own_namespace=figures.own_namespace)
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.output_tokens,
            "total_tokens": stats.prompt_tokens + stats.output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish_reason(stats: RequestStats | None) -> str:
    return stats.finish_reason if stats and stats.finish_reason in ("stop", "length") else "stop"


async def _sse(completion_id: str, chat: ChatRequest, first: Delta | RequestStats,
               stream: AsyncIterator[Delta | RequestStats], slot: StreamSlot,
               figures: _CachedFigures) -> AsyncIterator[bytes]:
    # The chunks differ only in their text: the JSON around it is encoded once.
    head = json.dumps({"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                       "model": chat.model}, ensure_ascii=False)[:-1]

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        choices = json.dumps([{"index": 0, "delta": delta, "finish_reason": finish}], ensure_ascii=False)
        return f'data: {head}, "choices": {choices}}}\n\n'.encode()

    stats: RequestStats | None = None
    try:
        async with contextlib.aclosing(stream):  # a disconnect closes it, which aborts the request in the engine
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
                    error = {"error": {"message": str(exc), "type": "server_error", "param": None,
                                       "code": "engine_error"}}
                    yield f"data: {json.dumps(error, ensure_ascii=False)}\n\n".encode()
                    return
        yield chunk({}, _finish_reason(stats))
        if chat.stream_options and chat.stream_options.include_usage:
            yield f'data: {head}, "choices": [], "usage": {json.dumps(_usage(stats, figures))}}}\n\n'.encode()
        yield b"data: [DONE]\n\n"
    finally:
        slot.release()


async def _whole(completion_id: str, chat: ChatRequest, first: Delta | RequestStats,
                 stream: AsyncIterator[Delta | RequestStats], figures: _CachedFigures) -> JSONResponse:
    text, stats = "", None
    async with contextlib.aclosing(stream):
        event: Delta | RequestStats | None = first
        while event is not None:
            if isinstance(event, Delta):
                text += event.text
            else:
                stats = event
            try:
                event = await anext(stream, None)
            except EngineError as exc:
                return ApiError(500, str(exc), code="engine_error", kind="server_error").response()
    body = {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": chat.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": _finish_reason(stats)}],
        "usage": _usage(stats, figures),
    }
    return JSONResponse(body)
