"""The app itself, started for experiments and tests exactly as a user starts it.

`start_app(env)` runs `chainlit run app.py --headless` (never `-w`) from the
repository root with `env` on top of this process's environment (BACKENDS
etc.; environment variables win over .env), on a free loopback port, polls it
until its page answers HTTP 200, and returns an `AppServer` to stop it by PID.
`backend_env` writes one backend's `N_...` variables; `stored` reads what the
app wrote to its database, the way the app reads it; `client_from` and `log_in`
log in as the login page does, from a client address of the caller's choosing.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx

from config import REPO, env_prefix
from servers.process import PYTHON, ServerProcess, free_port

APP_START_TIMEOUT_S = 90.0


@dataclass
class AppServer:
    """A running `chainlit run app.py` and where to reach it."""

    url: str
    process: ServerProcess
    env: dict[str, str]

    def stop(self) -> None:
        self.process.stop()


def chainlit_command(port: int) -> list[str]:
    """`chainlit run app.py --headless` on loopback, with the venv's chainlit script."""
    script = Path(PYTHON).with_name("chainlit")
    launcher = [str(script)] if script.exists() else [PYTHON, "-m", "chainlit"]
    return [*launcher, "run", "app.py", "--headless", "--host", "127.0.0.1", "--port", str(port)]


def start_app(env: dict[str, str], *, name: str = "chainlit-app",
              timeout_s: float = APP_START_TIMEOUT_S) -> AppServer:
    """Start the app with `env` on top of this process's environment; return once it serves its page.
    Without a DATABASE_URL in `env` it gets a fresh SQLite file of its own (never the user's)."""
    port = free_port()
    database = env.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp(prefix='lab-db-')}/lab.db"
    full_env = {"CHAINLIT_APP_ROOT": str(REPO), **env, "DATABASE_URL": database}
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess(name, chainlit_command(port), env=full_env).start_serving(url + "/", timeout_s)
    return AppServer(url, process, full_env)


def backend_env(name: str, *, kind: str, base_url: str = "", label: str = "", **more: str) -> dict[str, str]:
    """The `N_...` variables of one configured backend (see config.py), e.g. N_KIND, N_BASE_URL."""
    prefix = env_prefix(name)
    values = {"KIND": kind, "BASE_URL": base_url, "LABEL": label, **{k.upper(): v for k, v in more.items()}}
    return {prefix + key: value for key, value in values.items() if value}


def client_from(address: str, *, timeout_s: float = 120.0) -> httpx.Client:
    """An HTTP client whose connections leave from `address`: any 127.x.y.z reaches the app on
    loopback and is the client address the app sees (uvicorn trusts forwarded headers from
    127.0.0.1 only, so these are real addresses, not claims). It keeps cookies, as a browser does."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=timeout_s)


def log_in(client: httpx.Client, url: str, name: str, password: str) -> httpx.Response:
    """`POST /login` as the login page sends it (a multipart form)."""
    return client.post(url + "/login", files={"username": (None, name), "password": (None, password)})


def run_coroutine(coroutine):
    """Run a coroutine to its end from sync code, even where this thread already runs an event loop
    (Playwright's sync API holds one): in a thread of its own."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # handed back to the caller below
            outcome["error"] = error

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def stored(url: str, what: str, *args):
    """Read the app's database the way the app does: `await Store.<what>(*args)` on `url`."""
    from store import Store

    store = await Store.open(url)
    try:
        return await getattr(store, what)(*args)
    finally:
        await store.aclose()
