"""Chainlit's login route, behind limits, with its password check off the event loop.

Chainlit's `POST /login` calls the password callback with the form's name and
password only. This module puts its own `POST /login` in front of Chainlit's
(on the same FastAPI app, inserted ahead of it), which knows the client's
address, asks `core.auth.LoginLimits` first and answers a refused attempt
itself, without hashing:

    HTTP 429  {"detail": "too many attempts, try again in 42 s"}  Retry-After: 42

(the login page shows "Too many sign-in attempts", .chainlit/translations),
and otherwise hands the request to Chainlit's own route, whose callback
(`check_password`) hashes on a worker thread. Behind a reverse proxy on the
same machine the client's address is the one the proxy forwards (uvicorn
trusts X-Forwarded-For from 127.0.0.1).
"""

from __future__ import annotations

import math
import os

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.server import app as chainlit_app
from chainlit.server import login as chainlit_login
from fastapi import Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import OAuth2PasswordRequestForm

from core.auth import AuthConfig, LoginLimits

MAX_NAME_CHARS = 200  # longer names are cut before they are remembered
LIMIT_VARIABLES = {"per_user": "LOGIN_FAILURES_PER_USER", "per_address": "LOGIN_FAILURES_PER_ADDRESS",
                   "window_s": "LOGIN_WINDOW_S"}


def limits_from_env() -> LoginLimits:
    """The limits, from .env where set (each a positive number), else 5 per name and 30 per address a minute."""
    values = {}
    for field, variable in LIMIT_VARIABLES.items():
        raw = (os.environ.get(variable) or "").strip()
        if raw:
            number = float(raw)
            if number <= 0:
                raise ValueError(f"{variable}={raw} must be a positive number")
            values[field] = number if field == "window_s" else int(number)
    return LoginLimits(**values)


def install(auth: AuthConfig, limits: LoginLimits | None = None) -> None:
    """Register the password callback and put the guarded login route ahead of Chainlit's."""
    limits = limits or limits_from_env()

    @cl.password_auth_callback
    async def check_password(username: str, password: str) -> cl.User | None:
        if not await auth.check_async(username, password):
            return None
        return cl.User(identifier=username, metadata={"teacher": auth.is_teacher(username)})

    async def login(request: Request, response: Response, form_data: OAuth2PasswordRequestForm = Depends()):
        name = form_data.username[:MAX_NAME_CHARS]
        address = request.client.host if request.client else "unknown"
        wait_s = limits.wait_s(name, address)
        if wait_s is not None:
            seconds = max(1, math.ceil(wait_s))
            return JSONResponse({"detail": f"too many attempts, try again in {seconds} s"}, status_code=429,
                                headers={"Retry-After": str(seconds)})
        limits.begin(name, address)
        try:
            answer = await chainlit_login(request, response, form_data)
        except HTTPException:
            raise  # a wrong name or password: the attempt stays counted
        limits.succeeded(name, address)
        return answer

    path = f"{chainlit_config.run.root_path}/login"
    routes = chainlit_app.router.routes
    # Under `chainlit run -w` the app module is imported again: one guarded route is enough.
    routes[:] = [route for route in routes if not getattr(route, "serving_lab_login", False)]
    route = APIRoute(path, login, methods=["POST"])
    route.serving_lab_login = True
    routes.insert(0, route)
