"""Serving Lab: chat with vLLM, TGI or llama.cpp, compare them side by side, and watch
TTFT and tokens/s live.

Start with `chainlit run app.py -w`. The handlers stay thin; the work is in
chat/ (the reply flow, rounds, reports), compare/ (rounds and ratings),
core/timing.py (measurement), store/ (the database) and backends/ (one interface,
one file per serving stack).
"""

import gc
import logging

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.server import app as chainlit_server
from fastapi.routing import APIRoute

from core.ratings import one_blas_thread

one_blas_thread()  # before anything imports numpy

from ui import browser_id, commands, engines_view, lab_state, live_tap, login_guard, page_headers, rounds_view  # noqa: E402
from ui import body_limit, sign_out  # noqa: E402
from ui import session_view as session  # noqa: E402
from core.auth import current_config  # noqa: E402
from ui.session_view import guarded  # noqa: E402
from ui.socket_guard import guard_socket  # noqa: E402
from config import ConfigurationError, load_env  # noqa: E402
from core.images import configured_image_origins  # noqa: E402
from store import DatabaseUnavailable, StoreError  # noqa: E402
from store.db import migrate_blocking  # noqa: E402

# Under `chainlit run -w`, every refresh of the live figures writes a file under
# .files/, and the file watcher would log each one (~10 lines a second).
logging.getLogger("watchfiles.main").setLevel(logging.WARNING)

load_env()
AUTH = current_config()
# Chainlit's socket: allow_origins (.chainlit/config.toml) applies to it too; oversized messages get an answer.
guard_socket(is_teacher=AUTH.is_teacher)
# Before the first page: engine imports, the embedded model starts loading (never on the event loop).
session.start_up()

try:
    # The tables exist before Chainlit's data layer first touches them (a login reads users).
    migrate_blocking()
except DatabaseUnavailable as error:  # down or hung now: history waits for it (core.app_state retries)
    logging.getLogger(__name__).error("the database does not answer; chat history waits for it: %s", error)
    HISTORY = True
except (StoreError, ConfigurationError) as error:  # DATABASE_URL unusable, or a newer schema
    logging.getLogger(__name__).error("storage unavailable, history and votes are off: %s", error)
    HISTORY = False
else:
    HISTORY = True

if HISTORY:
    from ui.chat_history import chainlit_data_layer, flush_history, owned_routes

    # Feedback is written only on a message of the person's own chats (the ids come from the browser).
    owned_routes()

    @cl.data_layer
    def data_layer():
        return chainlit_data_layer()

    @cl.on_app_shutdown
    async def on_app_shutdown() -> None:
        await flush_history()  # the chat history is written in batches: the last one before the app stops
else:
    @cl.data_layer
    def data_layer():
        return None  # else Chainlit would start its own layer on DATABASE_URL, with another schema


# Ahead of Chainlit's catch-all route for its UI, which would otherwise answer it.
chainlit_server.router.routes.insert(0, APIRoute("/lab/state", lab_state.state_endpoint, methods=["GET"]))
# Every answer names the replica that gave it (X-Lab-Replica), behind a proxy in front of several.
chainlit_server.add_middleware(lab_state.ReplicaHeader)
# Images and videos load only from the app's own origin or LAB_IMAGE_ORIGINS (core/images.py).
chainlit_server.add_middleware(page_headers.PageHeaders, origins=configured_image_origins())
# Without login, a browser is the person a blind round's rule belongs to (core/disclosure.py): its id cookie.
chainlit_server.add_middleware(browser_id.BrowserId, root_path=chainlit_config.run.root_path or "/")

if AUTH.enabled:
    # Passwords are checked off the event loop, behind per-name and per-address limits.
    login_guard.install(AUTH)
    # A token that logged out, or whose person a teacher signed out, works nowhere (ui/sign_out.py).
    chainlit_server.add_middleware(sign_out.SignedOutTokens, revocations=sign_out.install(AUTH),
                                   root_path=chainlit_config.run.root_path or "")
# Over https every cookie the app sets is Secure (ui/page_headers.py): outside the others, it sees every cookie.
chainlit_server.add_middleware(page_headers.SecureCookies)
# Request bodies over LAB_MAX_BODY_MB get 413 before they are read, chunked ones included (ui/body_limit.py).
chainlit_server.add_middleware(body_limit.BodyLimit, max_bytes=body_limit.max_body_bytes())


# What start-up built (every import, the routes, the backends) lives as long as the process: out of
# the collector's sight. A full collection walked all of it (~255,000 objects, ~130 ms here) with the
# interpreter held, stalling every reply and every stamp of a chunk's arrival in the middle of a class
# burst (experiments/class_burst.py found them as 146-170 ms gaps on both the app's and the backend
# loop's threads).
gc.collect()
gc.freeze()


@cl.on_chat_start
@guarded
async def on_chat_start() -> None:
    await session.start(actions=commands.report_actions())
    await commands.announce_commands()


@cl.on_chat_resume
@guarded
async def on_chat_resume(thread: dict) -> None:
    await session.resume(thread)
    await rounds_view.resume(thread)


@cl.on_window_message
@guarded
async def on_window_message(data) -> None:
    await live_tap.on_window_message(data)
    await session.ready_next_figures()


@cl.on_settings_update
@guarded
async def on_settings_update(values: dict) -> None:
    await session.update_settings(values)


@cl.on_message
@guarded
async def on_message(message: cl.Message) -> None:
    await commands.on_message(message)


@cl.action_callback("retry")
@guarded
async def on_retry(action: cl.Action) -> None:
    await commands.retry()


@cl.action_callback("vote")
@guarded
async def on_vote(action: cl.Action) -> dict:
    return await rounds_view.vote(action.payload)


@cl.action_callback("blind_insist")
@guarded
async def on_blind_insist(action: cl.Action) -> None:
    await commands.insist(action.payload)


@cl.action_callback("leaderboard")
@guarded
async def on_leaderboard(action: cl.Action) -> None:
    await commands.run_action("leaderboard")


@cl.action_callback("leaderboard_view")
@guarded
async def on_leaderboard_view(action: cl.Action) -> None:
    await commands.run_action("leaderboard", commands.view_arguments(action.payload))


@cl.action_callback("export_votes")
@guarded
async def on_export_votes(action: cl.Action) -> None:
    await commands.run_action("export_votes")


@cl.action_callback("prompt")
@guarded
async def on_prompt(action: cl.Action) -> None:
    await commands.run_action("prompt")


@cl.action_callback("stats")
@guarded
async def on_stats(action: cl.Action) -> None:
    await commands.run_action("stats")


@cl.action_callback("replay")
@guarded
async def on_replay(action: cl.Action) -> None:
    await commands.run_action("replay")


@cl.action_callback("engines")
@guarded
async def on_engines(action: cl.Action) -> None:
    await commands.run_action("engines")


@cl.action_callback("bench")
@guarded
async def on_bench(action: cl.Action) -> None:
    await commands.run_action("bench")


@cl.action_callback("status")
@guarded
async def on_status(action: cl.Action) -> None:
    await commands.run_action("status")


@cl.action_callback("close_rounds")
@guarded
async def on_close_rounds(action: cl.Action) -> None:
    await commands.run_action("close_rounds")


@cl.action_callback("simulate")
@guarded
async def on_simulate(action: cl.Action) -> dict:
    return await engines_view.simulate(action.payload)


@cl.action_callback("capacity_sweep")
@guarded
async def on_capacity_sweep(action: cl.Action) -> dict:
    return await engines_view.capacity_sweep(action.payload)


@cl.action_callback("cache_lesson")
@guarded
async def on_cache_lesson(action: cl.Action) -> dict:
    return await engines_view.cache_lesson(action.payload)


@cl.action_callback("class_fit")
@guarded
async def on_class_fit(action: cl.Action) -> dict:
    return await engines_view.class_fit(action.payload)


@cl.action_callback("close_panel")
@guarded
async def on_close_panel(action: cl.Action) -> None:
    await engines_view.close_panel()


@cl.on_chat_end
@guarded
async def on_chat_end() -> None:
    await engines_view.close_panel()
