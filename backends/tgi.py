"""Text Generation Inference (TGI), on either of its two routes.

Written against TGI's own OpenAPI spec. The streaming requests go through
huggingface_hub's `AsyncInferenceClient` (its SSE parsing and TGI error
parsing); /info, /health, /chat_tokenize and /tokenize are plain JSON calls
with httpx.

- route "messages" (default): `POST /v1/chat/completions` with
  `stream_options.include_usage`; TGI applies the model's chat template.
  A LoRA adapter is selected by sending its id as `model` ("tgi" = none).
- route "generate": TGI's native `POST /generate_stream` with `details`.
  The prompt is the server's own templating of the conversation
  (`/chat_tokenize` -> `templated_text`), or a Jinja chat template from
  configuration rendered here. A LoRA adapter goes in `parameters.adapter_id`.

Token counts are exact: TGI sends one event per generated token (the final
end-of-sequence token included, with `special: true`; its text is not shown).
The server's own figures (`details` or `usage`) ride on the last chunk.

TGI answers a streaming request with 200 and reports later problems as an
event `{"error", "error_type"}`; a proxy or an older server may answer with
the HTTP status instead. Both become the same typed errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Sequence

import httpx
import httpx2
from huggingface_hub import AsyncInferenceClient
from huggingface_hub.errors import (
    GenerationError,
    HfHubHTTPError,
    IncompleteGenerationError,
    InferenceTimeoutError,
    OfflineModeIsEnabled,
    OverloadedError,
    TextGenerationError,
    ValidationError,
)
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from backends.base import BackendInfo, ChatMessage, GenerationParams, ServerFigures, StreamChunk
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    GenerationFailed,
    InputRejected,
)
from config import BackendConfig

ROUTES = ("messages", "generate")
NO_ADAPTER_MODEL = "tgi"  # the Messages API's `model` meaning "the base model, no LoRA adapter"
# TGI's vocabularies: native `details.finish_reason`, and the OpenAI-style one the UI shows.
FINISH_REASONS = {"eos_token": "stop", "stop_sequence": "stop", "length": "length", "stop": "stop"}
SERVER_TEXT_LIMIT = 500  # characters of a server's error body quoted in a message


class TGIBackend:
    """A TGI server (or anything speaking its protocol) on one of its two routes."""

    kind = "tgi"

    def __init__(self, config: BackendConfig) -> None:
        if config.tgi_route not in ROUTES:
            raise ConfigurationError(
                f"{config.env_prefix}ROUTE={config.tgi_route!r}: use one of {', '.join(ROUTES)}."
            )
        if not config.base_url:
            raise ConfigurationError(f"Set {config.env_prefix}BASE_URL to the TGI server's URL.")
        self.config = config
        self.name = config.name
        self.label = config.label
        self.url = config.base_url.rstrip("/")
        self.route = config.tgi_route
        self.adapter_id = config.tgi_adapter_id or None
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        # huggingface_hub would otherwise send a locally stored Hugging Face token
        # to whatever server is configured; only the configured key is sent.
        self._auth_headers = {"authorization": f"Bearer {config.api_key}" if config.api_key else None}
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=self._timeout,
            headers={k: v for k, v in self._auth_headers.items() if v is not None},
        )
        self._template = _compile_template(config) if config.tgi_chat_template else None

    # ------------------------------------------------------------ streaming

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[StreamChunk]:
        """Stream the reply on the configured route; the HTTP stream is closed when this ends or is closed."""
        chunks = self._stream_messages(messages, params) if self.route == "messages" else \
            self._stream_generate(messages, params)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    async def _stream_messages(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[StreamChunk]:
        # One client per request: it owns the HTTP stream, so closing it ends the request.
        client = self._inference_client(self.url)
        finish_reason: str | None = None
        try:
            events = await client.chat_completion(
                [message.as_dict() for message in messages],
                model=self.adapter_id or NO_ADAPTER_MODEL,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=params.max_new_tokens,
                temperature=params.temperature,  # TGI maps 0 to greedy decoding
                # ...but still samples when top_p < 1 is sent, so greedy sends none.
                top_p=_top_p(params.top_p) if params.temperature > 0 else None,
                seed=params.seed,
            )
            async for event in events:
                for choice in event.choices:
                    # One chunk = one generated token (a special token has empty content).
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
                    yield StreamChunk(
                        text=choice.delta.content or "",
                        token_count=1,
                        finish_reason=_finish_reason(choice.finish_reason),
                    )
                if event.usage is not None:
                    yield StreamChunk(
                        token_count=0,
                        finish_reason=_finish_reason(finish_reason),
                        server_figures=ServerFigures(
                            source="TGI usage",
                            output_tokens=event.usage.completion_tokens,
                            input_tokens=event.usage.prompt_tokens,
                            finish_reason=finish_reason,
                        ),
                    )
        except (TextGenerationError, HfHubHTTPError, httpx2.HTTPError, OfflineModeIsEnabled) as error:
            raise self.translate_error(error, "/v1/chat/completions") from error
        finally:
            await client.close()

    async def _stream_generate(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[StreamChunk]:
        prompt = await self.build_prompt(messages)
        # Given a URL as its model, the client posts to exactly that URL.
        client = self._inference_client(f"{self.url}/generate_stream")
        sample = params.temperature > 0
        try:
            events = await client.text_generation(
                prompt,
                stream=True,
                details=True,
                max_new_tokens=params.max_new_tokens,
                # TGI refuses temperature 0 here; greedy decoding is do_sample=false.
                do_sample=sample,
                temperature=params.temperature if sample else None,
                top_p=_top_p(params.top_p) if sample else None,
                seed=params.seed if sample else None,
                adapter_id=self.adapter_id,
            )
            async for event in events:
                token = event.token
                text = "" if token.special else token.text
                details = event.details
                if details is None:
                    yield StreamChunk(text=text, token_count=1)
                    continue
                yield StreamChunk(
                    text=text,
                    token_count=1,
                    finish_reason=_finish_reason(details.finish_reason),
                    server_figures=ServerFigures(
                        source="TGI details",
                        output_tokens=details.generated_tokens,
                        input_tokens=details.input_length,
                        finish_reason=details.finish_reason,
                    ),
                )
        except (TextGenerationError, HfHubHTTPError, httpx2.HTTPError, OfflineModeIsEnabled) as error:
            raise self.translate_error(error, "/generate_stream") from error
        finally:
            await client.close()

    def _inference_client(self, model_url: str) -> AsyncInferenceClient:
        return AsyncInferenceClient(
            model=model_url,
            # Passed through to the transport as is: a read timeout between chunks, and a connect timeout.
            timeout=httpx2.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s),
            headers=dict(self._auth_headers),
        )

    # ------------------------------------------------------------ prompt

    async def build_prompt(self, messages: Sequence[ChatMessage]) -> str:
        """The text the native route sends: the configured template, else the server's own templating."""
        if self._template is not None:
            try:
                return self._template.render(
                    messages=[message.as_dict() for message in messages],
                    add_generation_prompt=True,
                    bos_token="",
                    eos_token="",
                )
            except TemplateError as error:
                raise InputRejected(
                    self.label, self.url, f"the configured chat template failed on this conversation: {error}",
                    hint=f"Fix {self.config.env_prefix}CHAT_TEMPLATE, or unset it to let TGI template the chat.",
                ) from None
        tokenized = await self._chat_tokenize(messages)
        if tokenized is None:
            raise BackendUnavailable(
                self.label, self.url, "the server cannot template the chat (/chat_tokenize answered 404).",
                hint=f"Set {self.config.env_prefix}CHAT_TEMPLATE to the model's chat template, "
                     f"or use {self.config.env_prefix}ROUTE=messages.",
            )
        return tokenized["templated_text"]

    async def _chat_tokenize(self, messages: Sequence[ChatMessage]) -> dict[str, Any] | None:
        """TGI's ChatTokenizeResponse for this conversation, or None when the server cannot template."""
        body = {"model": self.adapter_id or NO_ADAPTER_MODEL, "messages": [m.as_dict() for m in messages]}
        response = await self._request("POST", "/chat_tokenize", json=body)
        if response.status_code == 404:
            return None
        self._raise_for_status(response, "/chat_tokenize")
        return response.json()

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """Prompt tokens as the server counts them (/chat_tokenize, or /tokenize of the local template)."""
        if self._template is not None:
            prompt = await self.build_prompt(messages)
            response = await self._request("POST", "/tokenize", json={"inputs": prompt})
            if response.status_code == 404:
                return None
            self._raise_for_status(response, "/tokenize")
            return len(response.json())
        tokenized = await self._chat_tokenize(messages)
        return None if tokenized is None else len(tokenized["tokenize_response"])

    # ------------------------------------------------------------ health and info

    async def health(self) -> None:
        """Return if GET /health answers 200; raise BackendUnavailable with the server's reason otherwise."""
        response = await self._request("GET", "/health")
        if response.status_code == 200:
            return
        if response.status_code != 503:
            self._raise_for_status(response, "/health")
        reason = _server_text(response) or "HTTP 503"
        raise BackendUnavailable(
            self.label, self.url, f"TGI reports it is not healthy ({reason}).",
            hint="Wait for the model to finish loading, or check the TGI server's log.",
        )

    async def info(self) -> BackendInfo:
        """Model id, token limits and version from GET /info."""
        response = await self._request("GET", "/info")
        self._raise_for_status(response, "/info")
        data = response.json()
        details = {"route": self.route, "router": str(data.get("router", ""))}
        if self.adapter_id:
            details["adapter_id"] = self.adapter_id
        if data.get("max_concurrent_requests") is not None:
            details["max_concurrent_requests"] = str(data["max_concurrent_requests"])
        return BackendInfo(
            model_id=str(data.get("model_id", "")),
            context_length=data.get("max_total_tokens"),
            server_version=data.get("version"),
            max_input_tokens=data.get("max_input_tokens"),
            details=details,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------ errors

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise self.translate_error(error, path) from error

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        if response.is_success:
            return
        payload = _json_or_none(response)
        error_type = payload.get("error_type") if isinstance(payload, dict) else None
        raise self._from_status(response.status_code, error_type, _server_text(response), path)

    def translate_error(self, error: Exception, path: str) -> BackendError:
        """One typed error, naming this backend and its URL, for anything the transport or TGI reports."""
        if isinstance(error, OfflineModeIsEnabled):
            return BackendUnavailable(
                self.label, self.url, "HF_HUB_OFFLINE is set in the app's environment, and huggingface_hub "
                "(the TGI client) then refuses every request, even to a local server.",
                hint="Unset HF_HUB_OFFLINE for the chat app; the app never downloads from a model hub anyway.",
            )
        if isinstance(error, ValidationError):
            return self._from_status(422, "validation", str(error), path)
        if isinstance(error, OverloadedError):
            return self._from_status(429, "overloaded", str(error), path)
        if isinstance(error, IncompleteGenerationError):
            return self._from_status(500, "incomplete_generation", str(error), path)
        if isinstance(error, GenerationError):
            return self._from_status(424, "generation", str(error), path)
        if isinstance(error, TextGenerationError):
            # An error event of a type huggingface_hub does not know (an OpenAI-style
            # {"error": {"message", "http_status_code"}} arrives here as a dict).
            detail = error.args[0] if error.args else ""
            if isinstance(detail, dict):
                status = int(detail.get("http_status_code") or 424)
                return self._from_status(status, None, str(detail.get("message", detail)), path)
            return self._from_status(424, None, str(detail), path)
        if isinstance(error, HfHubHTTPError):
            response = error.response
            payload = _json_or_none(response)
            error_type = payload.get("error_type") if isinstance(payload, dict) else None
            return self._from_status(response.status_code, error_type, _server_text(response) or str(error), path)
        if isinstance(error, (InferenceTimeoutError, httpx.TimeoutException, httpx2.TimeoutException)):
            # huggingface_hub wraps the transport's timeout; the cause says which phase timed out.
            cause = error.__cause__ if isinstance(error, InferenceTimeoutError) else error
            if isinstance(cause, (httpx.ConnectTimeout, httpx2.ConnectTimeout)):
                return BackendUnavailable(
                    self.label, self.url, f"no answer to the connection within {self.config.connect_timeout_s:g} s.",
                    hint=self._start_hint(),
                )
            return BackendTimeout(
                self.label, self.url, f"no reply from {path} within {self.config.timeout_s:g} s.",
                hint=f"The server may be overloaded; try again, or raise {self.config.env_prefix}TIMEOUT_S.",
            )
        if isinstance(error, (httpx.ConnectError, httpx2.ConnectError)):
            return BackendUnavailable(self.label, self.url, "the server is not reachable (connection refused).",
                                      hint=self._start_hint())
        if isinstance(error, (httpx.HTTPError, httpx2.HTTPError)):
            return BackendUnavailable(
                self.label, self.url, f"the connection failed during {path}: {error or type(error).__name__}.",
                hint="Check that the server is running and the URL points at TGI.",
            )
        raise TypeError(f"not a transport or TGI error: {error!r}")

    def _from_status(self, status: int, error_type: str | None, server_text: str, path: str) -> BackendError:
        said = f" TGI said: {server_text[:SERVER_TEXT_LIMIT]}" if server_text else ""
        kind = error_type or {422: "validation", 424: "generation", 429: "overloaded",
                              500: "incomplete_generation"}.get(status, "")
        if kind == "validation" or kind == "template_error" or status == 422:
            return InputRejected(
                self.label, self.url, f"the request was rejected.{said}",
                hint="Shorten the conversation or lower max new tokens, then send again.",
            )
        if kind == "overloaded" or status == 429:
            return BackendOverloaded(
                self.label, self.url, f"the server is at capacity.{said}",
                hint="Wait a moment and send again, or choose another backend.",
            )
        if kind == "incomplete_generation":
            return GenerationFailed(
                self.label, self.url, f"the reply ended before generation finished.{said}",
                hint="Send again; if it keeps happening, check the TGI server's log.",
            )
        if kind == "generation" or status == 424:
            return GenerationFailed(
                self.label, self.url, f"generation failed on the server.{said}",
                hint="Send again; if it keeps happening, check the TGI server's log.",
            )
        if status in (401, 403):
            return BackendUnavailable(
                self.label, self.url, f"the server refused the credentials (HTTP {status}).{said}",
                hint=f"Set {self.config.env_prefix}API_KEY to a key this server accepts.",
            )
        if status == 404:
            return BackendUnavailable(
                self.label, self.url, f"{path} does not exist on this server (HTTP 404).{said}",
                hint=f"Check that {self.config.env_prefix}BASE_URL points at a TGI server (no /v1 suffix).",
            )
        if status == 503:
            return BackendUnavailable(
                self.label, self.url, f"the server is not ready (HTTP 503).{said}",
                hint="Wait for the model to finish loading, then send again.",
            )
        return GenerationFailed(
            self.label, self.url, f"{path} failed with HTTP {status}.{said}",
            hint="Check the TGI server's log.",
        )

    def _start_hint(self) -> str:
        return (f"Start the TGI server, or set {self.config.env_prefix}BASE_URL in .env "
                f"to where it runs (now {self.url}).")


def _top_p(top_p: float) -> float | None:
    """TGI accepts top_p only strictly between 0 and 1; 1.0 means "no nucleus filter", so omit it."""
    return top_p if 0.0 < top_p < 1.0 else None


def _finish_reason(reason: str | None) -> str | None:
    if not reason:
        return None
    return FINISH_REASONS.get(reason, reason)


def _json_or_none(response: Any) -> Any:
    try:
        return response.json()
    except (ValueError, httpx.ResponseNotRead, httpx2.ResponseNotRead):
        return None


def _server_text(response: Any) -> str:
    """The server's own error text: TGI's `error` field, else the body."""
    payload = _json_or_none(response)
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error:
            return str(error)
    try:
        return response.text.strip()
    except (httpx.ResponseNotRead, httpx2.ResponseNotRead):
        return ""


def _compile_template(config: BackendConfig):
    """The configured chat template: Jinja source, or a path to a file holding it."""
    source = config.tgi_chat_template
    if "{" not in source and len(source) < 4096 and Path(source).expanduser().is_file():
        source = Path(source).expanduser().read_text(encoding="utf-8")
    # The sandbox Hugging Face uses for chat templates.
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_template_error
    try:
        return environment.from_string(source)
    except TemplateError as error:
        raise ConfigurationError(f"{config.env_prefix}CHAT_TEMPLATE is not a valid Jinja template: {error}") from None


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)
