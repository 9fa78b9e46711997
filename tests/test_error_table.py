"""The one HTTP status -> typed error table every HTTP kind shares (backends.errors.error_for_status)."""

from __future__ import annotations

import pytest

from backends.errors import (
    BackendOverloaded,
    BackendUnavailable,
    GenerationFailed,
    InputRejected,
    error_for_status,
)

# (status, server text, Retry-After s, server error type, configured model) -> (class, words in the message,
# words in the hint, retry_after_s)
CASES = [
    # vLLM / OpenAI: a prompt too long for the context.
    (400, "This model's maximum context length is 2048 tokens.", None, "BadRequestError", "",
     InputRejected, "the server rejected the request: This model's maximum context length", "Shorten", None),
    # llama.cpp server: the same, with its own type (HTTP 400 even for a stream).
    (400, "request (3031 tokens) exceeds the available context size (2048 tokens)", None,
     "exceed_context_size_error", "", InputRejected, "exceeds the available context size (2048 tokens)",
     "lower max new tokens", None),
    # TGI: validation errors are 422, and the type says so even behind a proxy that changes the status.
    (422, "Input validation error: `inputs` must have less than 1024 tokens", None, "validation", "",
     InputRejected, "must have less than 1024 tokens", "Shorten", None),
    (500, "template failed", None, "template_error", "", InputRejected, "template failed", "", None),
    (429, "Model is overloaded", 7.0, "overloaded", "",
     BackendOverloaded, "busy, retry in 7 s (HTTP 429): Model is overloaded", "does not retry by itself", 7.0),
    (429, "Too many requests", None, None, "", BackendOverloaded, "busy (HTTP 429)", "Wait a moment", None),
    # TGI's in-stream events carry a type and no status.
    (None, "Model is overloaded", None, "overloaded", "", BackendOverloaded, "at capacity, busy:", "", None),
    (None, "injected failure", None, "generation", "", GenerationFailed, "generation failed on the server", "log",
     None),
    (None, "Incomplete generation stream", None, "incomplete_generation", "",
     GenerationFailed, "the reply ended before generation finished", "", None),
    (424, "CUDA out of memory", None, None, "", GenerationFailed, "generation failed on the server", "", None),
    # vLLM's in-band error after the stream started.
    (None, "Internal server error", None, "InternalServerError", "",
     GenerationFailed, "generation failed on the server: Internal server error", "", None),
    # OpenAI's 401 comes with type invalid_request_error: the key, not the input, is the problem.
    (401, "Incorrect API key provided", None, "invalid_request_error", "",
     BackendUnavailable, "refused the API key (HTTP 401)", "LAB_API_KEY", None),
    (403, "", None, None, "", BackendUnavailable, "refused the API key (HTTP 403).", "LAB_API_KEY", None),
    (404, "The model `big` does not exist.", None, "NotFoundError", "big",
     BackendUnavailable, "does not serve the model 'big'", "LAB_MODEL", None),
    (404, "Not Found", None, None, "", BackendUnavailable, "/v1/chat/completions does not exist on this server",
     "LAB_BASE_URL", None),
    (503, "Service Unavailable", 8.0, None, "", BackendUnavailable, "busy, retry in 8 s (HTTP 503)",
     "does not retry by itself", 8.0),
    (503, "Loading model", None, None, "", BackendUnavailable, "not ready (HTTP 503): Loading model",
     "finish loading", None),
    (500, "Internal Server Error", None, "server_error", "", GenerationFailed, "server error (HTTP 500)", "log", None),
    (418, "teapot", None, None, "", GenerationFailed, "unexpected HTTP 418: teapot", "", None),
]


@pytest.mark.parametrize(("status", "said", "retry_after_s", "error_type", "model",
                          "expected", "words", "hint", "retry"), CASES)
def test_each_answer_becomes_the_typed_error_a_person_can_act_on(status, said, retry_after_s, error_type, model,
                                                                 expected, words, hint, retry):
    error = error_for_status(status, said, backend="Lab", url="http://127.0.0.1:9/v1", prefix="LAB_",
                             retry_after_s=retry_after_s, error_type=error_type, model=model,
                             path="/v1/chat/completions")
    assert type(error) is expected
    assert words in error.message, error.message
    assert hint in error.hint, error.hint
    assert error.retry_after_s == retry
    assert error.describe().startswith("Lab at http://127.0.0.1:9/v1: ")


def test_a_long_server_text_is_cut_and_an_empty_one_is_not_quoted():
    long = error_for_status(500, "x" * 5000, backend="Lab", url="u", prefix="LAB_")
    assert len(long.message) < 600
    assert error_for_status(500, "  ", backend="Lab", url="u", prefix="LAB_").message == "server error (HTTP 500)."
