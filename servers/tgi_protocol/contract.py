"""TGI's OpenAPI spec as an executable contract: what the stand-in checks every answer against.

`validate(path, method, status, content_type, payload)` checks one payload
(a response body, or one event of an SSE stream) against the schema the spec
declares for that operation, status and content type. `validate_request`
does the same for a request body. Both raise `ContractViolation` listing
every mismatch; `violations(...)` returns the list instead.

The spec is OpenAPI 3.0 (written by TGI's router with utoipa). It is turned
into JSON Schema 2020-12 once, so jsonschema can check it:
- `nullable: true` becomes "or null" (`type: [t, "null"]`, or an `anyOf`
  with `{"type": "null"}` where the schema is an `allOf`/`$ref`);
- a boolean `exclusiveMinimum`/`exclusiveMaximum` (the 3.0 form) becomes the
  numeric 2020-12 form; the numeric form the file uses is kept as it is;
- `$ref`s point into `#/components/schemas`, which every compiled schema
  carries along, so they resolve without a network or a registry.

The spec's file is `../shared/tgi-openapi.json` next to the repository,
or the path in the environment variable `TGI_OPENAPI_PATH`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from config import REPO

DEFAULT_SPEC_PATH = REPO.parent / "shared" / "tgi-openapi.json"
SPEC_PATH_VARIABLE = "TGI_OPENAPI_PATH"

# Keywords of OpenAPI 3.0 that are annotations only; dropped so they cannot
# be mistaken for constraints (the spec writes `"default": "null"` as a string).
_ANNOTATIONS = ("example", "default", "nullable", "description", "format")


class ContractViolation(AssertionError):
    """A payload that does not match what the spec declares for its operation."""

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where = where
        self.problems = problems
        super().__init__(f"{where}: " + "; ".join(problems))


@dataclass(frozen=True)
class MediaExample:
    """An example payload the spec itself gives for one response."""

    path: str
    method: str
    status: int
    content_type: str
    payload: Any


def spec_path() -> Path:
    """Where the spec is read from: $TGI_OPENAPI_PATH, else ../shared/tgi-openapi.json."""
    return Path(os.environ.get(SPEC_PATH_VARIABLE) or DEFAULT_SPEC_PATH)


@lru_cache(maxsize=4)
def load_spec(path: str | None = None) -> dict:
    """The spec as a dict (cached per path)."""
    source = Path(path) if path else spec_path()
    try:
        return json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"TGI's OpenAPI spec is not at {source}; set {SPEC_PATH_VARIABLE} to its path."
        ) from None


def spec_version() -> str:
    """The TGI version the spec describes (its `info.version`)."""
    return str(load_spec(_source())["info"]["version"])


def _source() -> str:
    # Every cache below is keyed by the spec's path, so changing TGI_OPENAPI_PATH takes effect.
    return str(spec_path())


def to_json_schema(node: Any) -> Any:
    """Convert one OpenAPI 3.0 schema (and everything under it) to JSON Schema 2020-12."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATIONS:
            continue
        if key == "properties":
            converted[key] = {name: to_json_schema(schema) for name, schema in value.items()}
        else:
            converted[key] = to_json_schema(value)
    for bound in ("Minimum", "Maximum"):
        exclusive = converted.get(f"exclusive{bound}")
        if isinstance(exclusive, bool):
            limit = converted.pop(bound.lower(), None)
            converted.pop(f"exclusive{bound}")
            if exclusive and limit is not None:
                converted[f"exclusive{bound}"] = limit
            elif limit is not None:
                converted[bound.lower()] = limit
    if node.get("nullable") is True:
        converted = _or_null(converted)
    return converted


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        nullable = dict(schema, type=[kind, "null"])
        if "enum" in nullable:
            nullable["enum"] = [*nullable["enum"], None]
        return nullable
    if isinstance(kind, list):
        return schema if "null" in kind else dict(schema, type=[*kind, "null"])
    return {"anyOf": [{"type": "null"}, schema]}


@lru_cache(maxsize=4)
def _components(path: str) -> dict[str, Any]:
    schemas = load_spec(path).get("components", {}).get("schemas", {})
    return {"schemas": {name: to_json_schema(schema) for name, schema in schemas.items()}}


def _operation(source: str, path: str, method: str) -> dict[str, Any]:
    spec = load_spec(source)
    operations = spec["paths"].get(path)
    if operations is None:
        raise ContractViolation(f"{method.upper()} {path}", ["the spec has no such path"])
    operation = operations.get(method.lower())
    if operation is None:
        raise ContractViolation(f"{method.upper()} {path}", [f"the spec has no {method.upper()} for this path"])
    return operation


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def response_schema(path: str, method: str, status: int, content_type: str | None) -> dict | None:
    """The schema the spec declares for this response, or None when it declares no body.

    Raises ContractViolation when the status, or the content type for it, is not declared.
    """
    return _response_schema(_source(), path, method, status, content_type)


def _response_schema(source: str, path: str, method: str, status: int, content_type: str | None) -> dict | None:
    where = f"{method.upper()} {path} -> {status}"
    responses = _operation(source, path, method)["responses"]
    response = responses.get(str(status))
    if response is None:
        raise ContractViolation(where, [f"status {status} is not declared (declared: {', '.join(responses)})"])
    content = response.get("content") or {}
    if not content:
        return None
    media_type = _media_type(content_type or "")
    if media_type not in content:
        raise ContractViolation(
            where, [f"content type {media_type or 'none'!r} is not declared (declared: {', '.join(content)})"]
        )
    return content[media_type].get("schema", {})


@lru_cache(maxsize=256)
def _validator(source: str, path: str, method: str, status: int, media_type: str) -> Draft202012Validator | None:
    schema = _response_schema(source, path, method, status, media_type)
    return None if schema is None else _compile(source, schema)


def _compile(source: str, schema: dict) -> Draft202012Validator:
    # Refs are "#/components/schemas/X": carrying the components at the root
    # of every compiled schema makes them resolve locally.
    root = dict(to_json_schema(schema), components=_components(source))
    root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(root)
    return Draft202012Validator(root)


def _describe(errors) -> list[str]:
    problems = []
    for error in sorted(errors, key=lambda e: [str(part) for part in e.absolute_path]):
        # For "or null" and oneOf branches, name the deepest reason, not just "no branch matched".
        deepest = error
        if error.context:
            # A non-null value that fails an "or null" schema: the reason is in the non-null branch.
            reasons = [e for e in error.context if not (e.validator == "type" and e.validator_value == "null")]
            deepest = best_match(reasons or error.context)
        location = "/".join(str(part) for part in deepest.absolute_path) or "(root)"
        problems.append(f"at {location}: {deepest.message}")
    return problems


def violations(path: str, method: str, status: int, content_type: str | None, payload: Any) -> list[str]:
    """Every way `payload` departs from the spec for this response; empty when it conforms."""
    try:
        validator = _validator(_source(), path, method.lower(), int(status), _media_type(content_type or ""))
    except ContractViolation as violation:
        return violation.problems
    if validator is None:
        if payload in (None, b"", ""):
            return []
        return ["the spec declares no body for this response, but one was sent"]
    return _describe(validator.iter_errors(payload))


def validate(path: str, method: str, status: int, content_type: str | None, payload: Any) -> None:
    """Raise ContractViolation unless `payload` matches the spec for this response."""
    problems = violations(path, method, status, content_type, payload)
    if problems:
        raise ContractViolation(f"{method.upper()} {path} -> {status} {_media_type(content_type or '')}", problems)


@lru_cache(maxsize=64)
def _request_validator(source: str, path: str, method: str) -> Draft202012Validator | None:
    body = _operation(source, path, method).get("requestBody")
    if not body:
        return None
    schema = body.get("content", {}).get("application/json", {}).get("schema")
    return None if schema is None else _compile(source, schema)


def request_violations(path: str, method: str, payload: Any) -> list[str]:
    """Every way a JSON request body departs from the spec's request schema."""
    try:
        validator = _request_validator(_source(), path, method.lower())
    except ContractViolation as violation:
        return violation.problems
    if validator is None:
        return []
    return _describe(validator.iter_errors(payload))


def validate_request(path: str, method: str, payload: Any) -> None:
    """Raise ContractViolation unless `payload` matches the spec's request body for this operation."""
    problems = request_violations(path, method, payload)
    if problems:
        raise ContractViolation(f"{method.upper()} {path} request", problems)


def media_examples() -> Iterator[MediaExample]:
    """The example payloads the spec gives for its responses."""
    spec = load_spec(_source())
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation.get("responses", {}).items():
                for content_type, media in (response.get("content") or {}).items():
                    if "example" in media:
                        yield MediaExample(path, method, int(status), content_type, media["example"])
