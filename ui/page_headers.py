"""Headers on every answer that keep a page to itself, and Secure cookies over https.

`PageHeaders` adds:

- `Content-Security-Policy: img-src ...; media-src ...; frame-ancestors 'self'`: the browser
  loads images and videos only from the app's own origin, `data:`, `blob:` and LAB_IMAGE_ORIGINS
  (core/images.py says why, and what else shows a blocked image as a link), and shows the app
  inside a frame only on the app's own pages (another site cannot lay its page over the chat to
  catch a student's clicks). Only these directives: scripts, styles, fonts and connections are
  left as Chainlit 2.12 needs them (its page loads a font and KaTeX's style sheet from public
  CDNs, docs/deploying/classroom.md, "What is and is not promised").
- `X-Content-Type-Options: nosniff`: the browser takes a file for what its Content-Type says,
  never runs one served as text as a script or a page.
- `Referrer-Policy: same-origin`: a person who follows a link out of a reply does not tell that
  site which page (which thread) they came from. `same-origin`, not `no-referrer`: the browser
  then still sends `Origin` with the page's own POSTs, which the socket guard checks.

`SecureCookies`: when the request came over https (the scope's scheme; behind a proxy, uvicorn
sets it from X-Forwarded-Proto when FORWARDED_ALLOW_IPS trusts the proxy), every cookie the
answer sets gets `Secure`, Chainlit's login token (`access_token`) and the device cookie
included, so the browser never sends them over plain http.

ASGI middleware on Chainlit's FastAPI app (app.py adds them), so they cover Chainlit's own
routes, its page and its files. The policy is added even where a route set its own: a browser
enforces every Content-Security-Policy it gets, so a second one can only narrow what loads.
"""

from __future__ import annotations

from core.images import ImageOrigins

FRAME_ANCESTORS = "frame-ancestors 'self'"


class PageHeaders:
    """ASGI middleware: the Content-Security-Policy, X-Content-Type-Options and Referrer-Policy."""

    def __init__(self, app, origins: ImageOrigins) -> None:
        self.app = app
        policy = f"{origins.content_security_policy()}; {FRAME_ANCESTORS}"
        self.headers = [
            (b"content-security-policy", policy.encode("ascii")),
            (b"x-content-type-options", b"nosniff"),
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


def secure_cookie(value: bytes) -> bytes:
    """A Set-Cookie value with `Secure` (as it was when it had it already)."""
    attributes = [part.strip().lower() for part in value.split(b";")[1:]]
    return value if b"secure" in attributes else value + b"; Secure"


class SecureCookies:
    """ASGI middleware: over https, every cookie an answer sets is `Secure`."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_secure(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(key, secure_cookie(value) if key.lower() == b"set-cookie" else value)
                           for key, value in message.get("headers", [])]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secure)
