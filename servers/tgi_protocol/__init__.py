"""A stand-in server that speaks TGI's HTTP protocol, on a real GGUF model or a paced engine.

No TGI can run on these machines, so tests, benchmarks and classroom demos talk
to this instead; its numbers are a stand-in's, and /info says so in `router`
(the app's TGI backend labels them). It serves a real model (llama.cpp, in
process, one generation at a time in a worker thread) or, with `--paced-rate`,
streams ` w1 w2 ...` at an exact rate with no model; either way it answers in
exactly the schemas of TGI's OpenAPI spec: every response body and every SSE
event is checked against the spec (contract.py) before it is sent.

Behaviour copied from TGI's router (3.x):
- `/generate_stream`, `/` with `"stream": true` and streaming
  `/v1/chat/completions` always answer 200; a validation error, "Model is
  overloaded" or a failure during generation arrives as an SSE event
  `{"error", "error_type"}` (TGI decides to stream before it validates). The
  spec lists these error bodies under 422/424/429/500, so that is the schema
  each error event is checked against. Non-streaming routes answer with the
  HTTP status itself.
- Validation, in TGI's order and with its messages (validation.py).
- More than --max-concurrent requests in flight (queued or generating):
  "Model is overloaded" (scheduler.py).
- One SSE event per generated token, the last one carrying `details`; the
  end-of-sequence token is an event too (`special: true`), counted in
  `generated_tokens` and left out of `generated_text`. The Messages API sends
  one chunk per token (empty content for a special token), the
  `finish_reason` on the last, then a usage chunk with no choices when
  `stream_options.include_usage` is set, then `data: [DONE]`.
- `model` other than "tgi" on the Messages API, or `parameters.adapter_id`,
  names a LoRA adapter. This server has no adapter weights: like TGI with an
  adapter it did not load, it generates with the base model. The request log
  shows which adapter was asked for.
- Generation stops when the client disconnects.
- GET /metrics answers with TGI's own metric names, as TGI writes them (metrics.py).
- GET /v1/models answers a single `ModelInfo`, as the spec declares (TGI
  itself wraps it in a list; the spec is the contract here).

Test-only routes (not part of TGI, routes.py): the contract violations so far,
every request, each generation's status and send times, the requests in
flight, and the test faults (faults.py).

Modules: engines.py (llama.cpp and paced), validation.py, errors.py,
scheduler.py, streaming.py, responses.py, routes.py, metrics.py, faults.py,
contract.py; __main__.py runs it (`python -m servers.tgi_protocol --help`);
handle.py starts one in a process of its own and reads its test-only routes.
"""

from servers.tgi_protocol.handle import TGIServer, start_paced_tgi_server, start_tgi_server

__all__ = ["TGIServer", "start_paced_tgi_server", "start_tgi_server"]
