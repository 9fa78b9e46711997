"""Chainlit's login route behind the login limits, with the password check off the event loop.

Chainlit's `POST /login` calls the password callback with the form's name and
password only. This module puts its own `POST /login` in front of Chainlit's
(on the same FastAPI app, inserted ahead of it), which knows the client's
address and cookies, and applies `core.login_limits` (the rules are there):

1. The limits admit the attempt or refuse it at once, without hashing:

       HTTP 429  {"detail": "too many attempts, try again in 42 s"}  Retry-After: 42

   (the login page shows "Too many sign-in attempts", .chainlit/translations).
2. The password is checked on a worker thread in its address's turn. A name
   that is not a user's goes the same way, checked against a hash of no one's
   password (core.auth.dummy_hash), and gets the same 401 as a wrong password
   ("wrong user name or password"): the same turn and the same CPU, so its
   answer comes no sooner.
3. A right password: the limits forget the pair's failures, Chainlit's route
   makes the login (its callback only accepts the name this route has just
   checked, so the password is hashed once and nothing reaches Chainlit's route
   around the limits), and the browser gets a device cookie for this name
   (`lab_login_device`, HttpOnly, 180 days, kept at logout): from then on, its
   attempts for this name count on their own, not with its address's.

The client's address is the connection's; behind a reverse proxy it is the one
the proxy forwards (uvicorn trusts X-Forwarded-For from FORWARDED_ALLOW_IPS,
127.0.0.1 by default). On PostgreSQL the counts are shared by every replica
(store/login_attempts.py); on SQLite this process keeps them.
"""

from __future__ import annotations

import logging
import math
import os
from contextvars import ContextVar

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.server import app as chainlit_app
from chainlit.server import login as chainlit_login
from fastapi import Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import OAuth2PasswordRequestForm

from config import ConfigurationError
from core.auth import AuthConfig
from core.login_limits import DEVICE_COOKIE, DEVICE_COOKIE_MAX_AGE_S, Busy, LimitSettings, LoginLimits, address_key
from store.db import create_engine, sqlite_path
from store.login_attempts import AttemptTable, FallbackAttempts, LocalAttempts, SharedAttempts
from store.urls import database_url

log = logging.getLogger(__name__)

# The name this request's route has just checked (see the module docstring, step 3).
_checked_name: ContextVar[str | None] = ContextVar("serving_lab_checked_name", default=None)


def attempt_table(settings: LimitSettings) -> AttemptTable:
    """The shared table on PostgreSQL (falling back to this process's while it does not answer);
    this process's own on SQLite, where the app is one process."""
    try:
        url = database_url()
    except ConfigurationError as error:  # the app logs it too, and runs without storage
        log.error("login limits kept in this process (DATABASE_URL unusable: %s)", error)
        return LocalAttempts()
    if sqlite_path(url) is not None:
        return LocalAttempts()
    forget_s = max(settings.pair_forget_s, settings.address_forget_s)
    return FallbackAttempts(SharedAttempts(create_engine(url), forget_after_s=forget_s))


def limits_from_env() -> LoginLimits:
    """The limits from the LOGIN_* variables (core.login_limits.LimitSettings), keyed by CHAINLIT_AUTH_SECRET."""
    settings = LimitSettings.from_env(os.environ)
    return LoginLimits(settings, secret=os.environ["CHAINLIT_AUTH_SECRET"], table=attempt_table(settings))


def too_many(wait_s: float) -> JSONResponse:
    seconds = max(1, math.ceil(wait_s))
    return JSONResponse({"detail": f"too many attempts, try again in {seconds} s"}, status_code=429,
                        headers={"Retry-After": str(seconds)})


def wrong() -> HTTPException:
    """A wrong name or password, said plainly (the page's toast shows the detail; its form shows
    the translation of "Unauthorized", .chainlit/translations)."""
    return HTTPException(status_code=401, detail="wrong user name or password")


def install(auth: AuthConfig, limits: LoginLimits | None = None) -> None:
    """Register the password callback and put the guarded login route ahead of Chainlit's."""
    limits = limits or limits_from_env()

    @cl.password_auth_callback
    async def accept_checked(username: str, password: str) -> cl.User | None:
        # Only the guarded route below gets here with a name it has checked; anything else is refused.
        if _checked_name.get() != username:
            return None
        return cl.User(identifier=username, metadata={"teacher": auth.is_teacher(username)})

    async def login(request: Request, response: Response, form_data: OAuth2PasswordRequestForm = Depends()):
        name, password = form_data.username, form_data.password
        address = address_key(request.client.host if request.client else None)
        device = limits.devices.device(request.cookies.get(DEVICE_COOKIE), name)
        known = auth.knows(name)
        verdict = await limits.admit(name, address, known=known, device=device)
        if not verdict.admitted:
            return too_many(verdict.wait_s)
        try:
            right = await limits.check(address, verdict.priority, lambda: auth.check(name, password))
        except Busy as busy:
            return too_many(busy.retry_after_s)
        if not right:
            raise wrong()  # the attempt stays counted
        await limits.succeeded(name, address, device)
        checked = _checked_name.set(name)
        try:
            answer = await chainlit_login(request, response, form_data)
        finally:
            _checked_name.reset(checked)
        answer.set_cookie(DEVICE_COOKIE, limits.devices.issue(name, device), max_age=DEVICE_COOKIE_MAX_AGE_S,
                          path=chainlit_config.run.root_path or "/", httponly=True, samesite="lax",
                          secure=request.url.scheme == "https")
        return answer

    path = f"{chainlit_config.run.root_path}/login"
    routes = chainlit_app.router.routes
    # Under `chainlit run -w` the app module is imported again: one guarded route is enough.
    routes[:] = [route for route in routes if not getattr(route, "serving_lab_login", False)]
    route = APIRoute(path, login, methods=["POST"])
    route.serving_lab_login = True
    routes.insert(0, route)
