"""The floor: the least a Chainlit app can cost per streamed reply (experiments/class_burst.py).

One pooled AsyncOpenAI client, `stream_token` per chunk, no figures, no storage, an empty chat
start. FLOOR_BASE_URL points it at an OpenAI-protocol server; FLOOR_COLUMNS=N streams N replies
at once into N messages (the floor of an N-column compare round).
"""

import asyncio
import os

import chainlit as cl
from openai import AsyncOpenAI

client = AsyncOpenAI(base_url=os.environ["FLOOR_BASE_URL"], api_key="not-needed", max_retries=0)
COLUMNS = int(os.environ.get("FLOOR_COLUMNS", "1"))


async def stream_into(message: cl.Message, text: str) -> None:
    stream = await client.chat.completions.create(
        model=os.environ.get("FLOOR_MODEL", "paced-test-model"), stream=True,
        messages=[{"role": "user", "content": text}])
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            await message.stream_token(chunk.choices[0].delta.content)
    await message.update()


@cl.on_chat_start
async def on_chat_start() -> None:
    pass


@cl.on_message
async def on_message(message: cl.Message) -> None:
    replies = [cl.Message(content="") for _ in range(COLUMNS)]
    await asyncio.gather(*(stream_into(reply, message.content) for reply in replies))
