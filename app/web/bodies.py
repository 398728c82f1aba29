"""Bodies at the edge: a request body read whole and handed on (the guards, app/web/guards.py, and the session
guard, app/web/sessions.py, read an event's body before Gradio does, then give Gradio the same bytes), and the
short answers they write themselves."""

from __future__ import annotations


async def whole_body(receive) -> bytes | None:
    """The request's body (already bounded by RequestGuard); None when the client went away."""
    chunks = []
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            return None
        chunks.append(event.get("body", b""))
        if not event.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive):
    """A ``receive`` that hands the app ``body`` once, then waits on the client as the original does (the
    disconnect, when it comes)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def send_whole(send, status: int, body: bytes, content_type: bytes, *headers: tuple[bytes, bytes]) -> None:
    """An answer the edge writes itself, in one piece: ``status``, ``body`` and any further ``headers``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
