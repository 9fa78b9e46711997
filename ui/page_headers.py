"""Two headers on every answer that keep a page from reaching other hosts by itself.

- `Content-Security-Policy: img-src ...; media-src ...`: the browser loads images and videos
  only from the app's own origin, `data:`, `blob:` and LAB_IMAGE_ORIGINS (core/images.py says
  why, and what else shows a blocked image as a link). Only these two directives: scripts,
  styles, fonts and connections are left as Chainlit 2.12 needs them (its page loads a font and
  KaTeX's style sheet from public CDNs, docs/deploying/classroom.md, "What is and is not promised").
- `Referrer-Policy: same-origin`: a person who follows a link out of a reply does not tell that
  site which page (which thread) they came from. `same-origin`, not `no-referrer`: the browser
  then still sends `Origin` with the page's own POSTs, which the socket guard checks.

ASGI middleware on Chainlit's FastAPI app (app.py adds it), so it covers Chainlit's own routes,
its page and its files. Added even where a route set its own: a browser enforces every
Content-Security-Policy it gets, so a second one can only narrow what loads.
"""

from __future__ import annotations

from core.images import ImageOrigins


class PageHeaders:
    """ASGI middleware: the Content-Security-Policy for images and videos, and the Referrer-Policy."""

    def __init__(self, app, origins: ImageOrigins) -> None:
        self.app = app
        self.headers = [
            (b"content-security-policy", origins.content_security_policy().encode("ascii")),
            (b"referrer-policy", b"same-origin"),
        ]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
