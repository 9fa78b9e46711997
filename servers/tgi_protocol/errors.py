"""The errors the TGI-protocol stand-in answers with, as TGI's router words and numbers them."""

from __future__ import annotations


class InferError(Exception):
    """An error TGI reports as `{"error", "error_type"}` with an HTTP status."""

    def __init__(self, message: str, error_type: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type
        self.status = status
        self.headers: dict[str, str] = {}  # e.g. Retry-After, when a test fault asks for one

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


def validation_error(detail: str) -> InferError:
    return InferError(f"Input validation error: {detail}", "validation", 422)


def overloaded_error() -> InferError:
    return InferError("Model is overloaded", "overloaded", 429)


def template_error(detail: str) -> InferError:
    return InferError(f"Template error: {detail}", "template_error", 422)


def generation_error(detail: str) -> InferError:
    return InferError(f"Request failed during generation: Server error: {detail}", "generation", 424)


def incomplete_error(message: str = "Incomplete generation") -> InferError:
    return InferError(message, "incomplete_generation", 500)


def injected_error(error_type: str, after_tokens: int) -> InferError:
    """The failure a test fault injects: mid-stream generation error, or an incomplete stream."""
    if error_type == "incomplete_generation":
        return incomplete_error("Incomplete generation stream")
    return generation_error(f"injected test failure after {after_tokens} tokens")
