"""Serving Lab: chat with vLLM, TGI or llama.cpp and watch TTFT and tokens/s live.

Start with `chainlit run app.py -w`. The handlers stay thin; the work is in
chat/session.py (UI flow), chat/live.py (rendering), timing.py (measurement)
and backends/ (one interface, one file per serving stack).
"""

import logging

import chainlit as cl

from chat import session

# Under `chainlit run -w`, every refresh of the live figures writes a file under
# .files/, and the file watcher would log each one (~10 lines a second).
logging.getLogger("watchfiles.main").setLevel(logging.WARNING)


@cl.on_chat_start
async def on_chat_start() -> None:
    await session.start()


@cl.on_settings_update
async def on_settings_update(values: dict) -> None:
    await session.update_settings(values)


@cl.on_message
async def on_message(message: cl.Message) -> None:
    await session.reply(message.content)


@cl.action_callback("retry")
async def on_retry(action: cl.Action) -> None:
    await session.retry()
