"""TGI event -> chunk conversion and request shaping: pure functions, on recorded events.

The recordings come from the TGI-protocol test server serving the real bundled
model, whose every event was checked against TGI's OpenAPI spec when sent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from huggingface_hub import ChatCompletionStreamOutput, TextGenerationStreamOutput

from backends.base import ChatMessage, GenerationParams
from backends.errors import BackendOverloaded, GenerationFailed, InputRejected
from backends.tgi import (
    ROUTES,
    TGIBackend,
    chat_event_chunks,
    generate_event_chunk,
    header_figures,
    messages_fields,
    native_parameters,
)
from core.figures import ignored_lines
from config import BackendConfig
from core.timing import StreamMeter

RECORDINGS = Path(__file__).parent / "recordings"


def events(name: str) -> list[dict]:
    lines = (RECORDINGS / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line[len("data:"):]) for line in lines
            if line.startswith("data:") and line[len("data:"):].strip() != "[DONE]"]


def measured(chunks) -> object:
    meter = StreamMeter(clock=iter(range(1000)).__next__)
    meter.start()
    for chunk in chunks:
        meter.observe(chunk)
    return meter.finish("completed", backend="tgi", model="m")


def test_native_events_are_one_token_each_and_the_end_token_is_counted_but_hidden():
    chunks = [generate_event_chunk(TextGenerationStreamOutput.parse_obj_as_instance(event))
              for event in events("tgi-3.3-generate-eos.sse")]
    assert all(chunk.token_count == 1 for chunk in chunks)
    assert "".join(chunk.text for chunk in chunks) == "The capital of France is Paris."
    last = chunks[-1]
    assert last.text == "" and last.finish_reason == "stop"
    assert last.server_figures.source == "TGI details"
    assert (last.server_figures.output_tokens, last.server_figures.input_tokens) == (8, 40)
    record = measured(chunks)
    assert record.output_tokens == 8 and record.tokens_exact and record.count_disagreement is None


def test_messages_chunks_carry_text_and_the_closing_usage_is_the_count():
    chunks = [chunk for event in events("tgi-3.3-messages-eos.sse")
              for chunk in chat_event_chunks(ChatCompletionStreamOutput.parse_obj_as_instance(event))]
    assert "".join(chunk.text for chunk in chunks) == "The capital of France is Paris."
    assert all(chunk.token_count is None for chunk in chunks if chunk.text)
    finishing = [chunk for chunk in chunks if chunk.finish_reason]
    assert len(finishing) == 1 and finishing[0].text == "" and finishing[0].token_count == 0
    usage = [chunk.server_figures for chunk in chunks if chunk.server_figures]
    assert len(usage) == 1 and usage[0].output_tokens == 8
    record = measured(chunks)
    assert record.output_tokens == 8 and record.tokens_exact and record.count_disagreement is None


def test_a_role_only_first_chunk_and_a_separate_finish_chunk_add_no_tokens():
    """Another server's Messages API: role alone first, finish alone last. Counted from usage, no warning."""
    recorded = events("tgi-3.3-messages-eos.sse")
    role_only = json.loads(json.dumps(recorded[0]))
    role_only["choices"][0]["delta"] = {"role": "assistant", "content": ""}
    finish_only = json.loads(json.dumps(recorded[-2]))
    finish_only["choices"][0]["delta"] = {"role": "assistant", "content": ""}
    stream = [role_only, *recorded[:-2], finish_only, recorded[-1]]
    chunks = [chunk for event in stream
              for chunk in chat_event_chunks(ChatCompletionStreamOutput.parse_obj_as_instance(event))]
    record = measured(chunks)
    assert record.output_tokens == 8 and record.count_disagreement is None
    assert record.first_byte_s < record.first_token_s  # the role chunk is the first byte


def backend(route: str = "generate") -> TGIBackend:
    return TGIBackend(BackendConfig(name="tgi", kind="tgi", label="TGI", base_url="http://127.0.0.1:9",
                                    options={"route": route}))


def test_an_error_event_becomes_the_typed_error_with_tgis_words():
    (error_event,) = [event for event in events("tgi-3.3-generate-error-event.sse") if "error" in event]
    with pytest.raises(GenerationFailed) as raised:
        backend()._event_chunks(json.dumps(error_event), "/generate_stream")
    assert "injected test failure after 2 tokens" in str(raised.value)
    overloaded = {"error": "Model is overloaded", "error_type": "overloaded"}
    assert isinstance(backend().event_error(overloaded, "/generate_stream"), BackendOverloaded)
    openai_style = {"error": {"message": "prompt too long", "http_status_code": 422}}
    assert isinstance(backend().event_error(openai_style, "/v1/chat/completions"), InputRejected)


@pytest.mark.parametrize("data", ["not json", "[1, 2]", '{"index": 1}'])
def test_an_event_that_is_not_tgis_is_a_clear_error(data):
    with pytest.raises(GenerationFailed) as raised:
        backend()._event_chunks(data, "/generate_stream")
    assert "/generate_stream" in str(raised.value)


def test_timing_headers_are_read_where_present():
    figures = header_figures({"x-queue-time": "12", "x-inference-time": "340", "x-time-per-token": "17"})
    assert (figures.queue_s, figures.inference_s, figures.time_per_output_token_s) == (0.012, 0.34, 0.017)
    assert figures.source == "TGI timing headers"
    assert header_figures({"content-type": "text/event-stream"}) is None
    assert header_figures({"x-queue-time": "soon"}) is None


def test_native_parameters_send_only_what_the_panel_set():
    parameters, notes = native_parameters(GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=8), None)
    assert parameters == {"max_new_tokens": 8, "details": True, "do_sample": True, "temperature": 0.7, "top_p": 0.9}
    greedy, notes = native_parameters(GenerationParams(temperature=0.0, top_p=0.9, max_new_tokens=8, top_k=5,
                                                       seed=3, repetition_penalty=1.2), "lora")
    assert greedy == {"max_new_tokens": 8, "details": True, "do_sample": False, "repetition_penalty": 1.2,
                      "adapter_id": "lora"}
    assert any("do_sample=false" in note for note in notes)
    no_filter, notes = native_parameters(GenerationParams(temperature=0.5, top_p=1.0, max_new_tokens=8), None)
    assert "top_p" not in no_filter


def test_messages_fields_send_only_what_the_panel_set():
    fields, _ = messages_fields(GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=4))
    assert fields == {"max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 4}
    greedy, notes = messages_fields(GenerationParams(temperature=0.0, top_p=0.9, max_new_tokens=8, seed=4))
    assert greedy == {"max_tokens": 8, "temperature": 0.0} and notes


def prepared_without_a_server(route: str):
    """A TGI backend whose prepare() needs no server: a local chat template, a connection just used."""
    tgi = TGIBackend(BackendConfig(name="tgi", kind="tgi", label="TGI", base_url="http://127.0.0.1:9",
                                   options={"route": route, "chat_template": "{{ messages[0]['content'] }}"}))
    tgi._warmth.used()  # no warm-up request

    async def prepare(params: GenerationParams):
        request = await tgi.prepare([ChatMessage("user", "hi")], params)
        wire = request.body["parameters"] if route == "generate" else request.body
        return request, wire

    return prepare


GREEDY = "is not sent (greedy decoding at temperature 0): ignored"
EVERY_SETTING = dict(top_p=0.9, max_new_tokens=8, top_k=5, seed=3, repetition_penalty=1.2)


@pytest.mark.parametrize("route", ROUTES)
async def test_greedy_decoding_names_each_setting_it_does_not_send_next_to_the_reply(route):
    """At temperature 0 TGI gets no top-p, top-k or seed; the note beside the reply names each."""
    request, wire = await prepared_without_a_server(route)(GenerationParams(temperature=0.0, **EVERY_SETTING))
    assert not {"top_p", "top_k", "seed"} & set(wire)
    lines = ignored_lines(request)
    assert f"top-p {GREEDY}" in lines and f"seed {GREEDY}" in lines
    if route == "generate":
        assert wire["do_sample"] is False and wire["repetition_penalty"] == 1.2
        assert lines == [f"top-p {GREEDY}", f"top-k {GREEDY}", f"seed {GREEDY}"]
    else:
        # top-k and repetition penalty are not part of the Messages API at all: said once, with that reason.
        assert wire["temperature"] == 0.0
        assert len(lines) == 4 and [line for line in lines if line.startswith("top-k")] == [
            "top-k is not supported by TGI's Messages API (TGI_ROUTE=generate sends top-k and repetition "
            "penalty): ignored"]


@pytest.mark.parametrize("route", ROUTES)
async def test_sampling_sends_those_settings_and_notes_nothing_about_greedy(route):
    request, wire = await prepared_without_a_server(route)(GenerationParams(temperature=0.7, **EVERY_SETTING))
    assert (wire["top_p"], wire["seed"], wire["temperature"]) == (0.9, 3, 0.7)
    lines = ignored_lines(request)
    assert not [line for line in lines if "greedy" in line]
    if route == "generate":
        assert wire["top_k"] == 5 and lines == []


@pytest.mark.parametrize("route", ROUTES)
async def test_top_p_one_is_left_out_and_said_so_next_to_the_reply(route):
    request, wire = await prepared_without_a_server(route)(GenerationParams(temperature=0.7, top_p=1.0))
    assert "top_p" not in wire
    assert ignored_lines(request) == [
        "top-p 1.0 is not sent (TGI refuses 1.0; without it no top-p filter applies, the same): ignored"]
