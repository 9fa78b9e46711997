"""Benchmark prompt sets: the built-in zh/en sets, custom JSONL files, errors that name the line."""

import json
import unicodedata

import pytest

from backends.base import ChatMessage
from core.load.prompt_sets import (
    BUILT_IN_SETS,
    PROMPT_SETS_DIR,
    BenchPrompt,
    PromptSetError,
    cycle,
    load_prompt_set,
    prompt_text,
)


def is_cjk(character: str) -> bool:
    return unicodedata.name(character, "").startswith("CJK UNIFIED IDEOGRAPH")


def mostly_cjk(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return sum(is_cjk(c) for c in letters) > len(letters) / 2


def mostly_ascii(text: str) -> bool:
    visible = [c for c in text if not c.isspace()]
    return sum(c.isascii() for c in visible) > len(visible) / 2


def write_lines(tmp_path, lines, name="mine.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- the built-in sets -------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILT_IN_SETS)
def test_built_in_set_has_100_distinct_single_turn_prompts(name):
    prompts = load_prompt_set(name)
    texts = [prompt_text(p) for p in prompts]
    assert len(prompts) == 100
    assert len(set(texts)) == 100, "duplicate prompts"
    assert all(text.strip() for text in texts)
    assert all(p.messages == (ChatMessage("user", prompt_text(p)),) for p in prompts)
    assert [p.source for p in prompts] == [f"{name}:{line}" for line in range(1, 101)]
    assert {p.output_tokens for p in prompts} <= {64, 128, 256}
    assert all(p.category for p in prompts)


def test_zh_set_is_chinese():
    texts = [prompt_text(p) for p in load_prompt_set("zh")]
    assert sum(mostly_cjk(t) for t in texts) >= 95


def test_en_set_is_english():
    texts = [prompt_text(p) for p in load_prompt_set("en")]
    assert sum(mostly_ascii(t) for t in texts) >= 95
    assert sum(mostly_cjk(t) for t in texts) == 0


@pytest.mark.parametrize("name", BUILT_IN_SETS)
def test_built_in_set_spreads_lengths_and_tasks(name):
    prompts = load_prompt_set(name)
    lengths = [len(prompt_text(p)) for p in prompts]
    assert sum(length > 300 for length in lengths) >= 10, "too few long prompts (passages to summarise etc.)"
    assert sum(length < 20 for length in lengths) >= 5, "too few one-liners"
    assert max(lengths) <= 800
    assert len({p.category for p in prompts}) >= 10


@pytest.mark.parametrize("name", BUILT_IN_SETS)
def test_built_in_file_is_readable_utf8_in_vllm_custom_format(name):
    # `vllm bench serve --dataset-name custom` needs a "prompt" column and, with
    # --custom-output-len -1, an integer "output_tokens" on every line.
    text = (PROMPT_SETS_DIR / f"{name}.jsonl").read_text(encoding="utf-8")
    assert "\\u" not in text, "written with ensure_ascii=True: not readable in an editor"
    for line in text.splitlines():
        record = json.loads(line)
        assert set(record) == {"prompt", "category", "output_tokens"}
        assert isinstance(record["prompt"], str) and isinstance(record["output_tokens"], int)


# --- your own JSONL file -----------------------------------------------------------------------


def test_custom_file_with_prompt_lines(tmp_path):
    path = write_lines(tmp_path, [
        json.dumps({"prompt": "Hello?", "category": "greeting", "output_tokens": 32, "completion": "ignored"}),
        "",
        json.dumps({"prompt": "你好"}, ensure_ascii=False),
    ])
    first, second = load_prompt_set(str(path))
    assert first == BenchPrompt((ChatMessage("user", "Hello?"),), "greeting", 32, "mine.jsonl:1")
    # the blank line is skipped but still counted, so the source points at the real line
    assert second == BenchPrompt((ChatMessage("user", "你好"),), None, None, "mine.jsonl:3")


def test_custom_file_with_messages_lines(tmp_path):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And times 3?"},
    ]
    path = write_lines(tmp_path, [json.dumps({"messages": messages, "output_tokens": 16})])
    [prompt] = load_prompt_set(str(path))
    assert prompt.messages == tuple(ChatMessage(m["role"], m["content"]) for m in messages)
    assert prompt_text(prompt) == "And times 3?"
    assert (prompt.category, prompt.output_tokens, prompt.source) == (None, 16, "mine.jsonl:1")


def test_file_saved_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_text(json.dumps({"prompt": "hi"}) + "\n", encoding="utf-8-sig")
    assert prompt_text(load_prompt_set(str(path))[0]) == "hi"


GOOD_LINE = json.dumps({"prompt": "fine"})


@pytest.mark.parametrize(
    "bad_line, problem",
    [
        ('{"prompt": "unterminated', "not valid JSON"),
        ('["a list"]', "expected a JSON object, got a list"),
        ('{"text": "no prompt field"}', 'needs a "prompt" string or a "messages" list'),
        ('{"prompt": ""}', '"prompt" is empty'),
        ('{"prompt": "   "}', '"prompt" is empty'),
        ('{"prompt": 42}', '"prompt" must be a string, got a number'),
        ('{"prompt": null}', '"prompt" must be a string, got null'),
        ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', 'both "prompt" and "messages"'),
        ('{"messages": "hello"}', '"messages" must be a non-empty list'),
        ('{"messages": []}', '"messages" must be a non-empty list'),
        ('{"messages": ["hello"]}', '"messages"[0] must be an object'),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', '"messages"[0] has role "robot"'),
        ('{"messages": [{"role": "user", "content": 7}]}', '"messages"[0] content must be a string'),
        ('{"messages": [{"role": "user"}]}', '"messages"[0] content must be a string, got null'),
        ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
         "the last message must be from the user"),
        ('{"prompt": "x", "category": 3}', '"category" must be a string'),
        ('{"prompt": "x", "output_tokens": "128"}', '"output_tokens" must be a whole number'),
        ('{"prompt": "x", "output_tokens": 0}', '"output_tokens" must be a whole number'),
        ('{"prompt": "x", "output_tokens": 12.5}', '"output_tokens" must be a whole number'),
        ('{"prompt": "x", "output_tokens": true}', '"output_tokens" must be a whole number'),
    ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, bad_line, problem):
    path = write_lines(tmp_path, [GOOD_LINE, "", bad_line, GOOD_LINE])
    with pytest.raises(PromptSetError) as caught:
        load_prompt_set(str(path))
    message = str(caught.value)
    assert f"{path}, line 3: " in message
    assert problem in message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PromptSetError, match="empty.jsonl has no prompts"):
        load_prompt_set(str(path))


def test_file_that_is_not_utf8_is_an_error_naming_it(tmp_path):
    path = tmp_path / "gbk.jsonl"
    path.write_bytes(json.dumps({"prompt": "你好"}, ensure_ascii=False).encode("gbk"))
    with pytest.raises(PromptSetError, match="gbk.jsonl is not UTF-8"):
        load_prompt_set(str(path))


def test_unknown_set_name_lists_the_built_in_sets():
    with pytest.raises(PromptSetError) as caught:
        load_prompt_set("fr")
    assert "'fr'" in str(caught.value) and "zh, en" in str(caught.value)


def test_missing_file_and_directory_are_errors_naming_the_path(tmp_path):
    with pytest.raises(PromptSetError, match="missing.jsonl does not exist"):
        load_prompt_set(str(tmp_path / "missing.jsonl"))
    with pytest.raises(PromptSetError, match="is not a file"):
        load_prompt_set(str(tmp_path))


def test_prompt_set_error_is_a_value_error():
    assert issubclass(PromptSetError, ValueError)


# --- helpers -----------------------------------------------------------------------------------


def numbered(count):
    return [BenchPrompt((ChatMessage("user", f"q{i}"),), None, None, f"t:{i}") for i in range(1, count + 1)]


def test_cycle_takes_the_first_n_and_repeats_in_order():
    prompts = numbered(3)
    assert cycle(prompts, 2) == prompts[:2]
    assert cycle(prompts, 3) == prompts
    assert [p.source for p in cycle(prompts, 8)] == ["t:1", "t:2", "t:3", "t:1", "t:2", "t:3", "t:1", "t:2"]
    assert cycle(prompts, 0) == []


def test_cycle_rejects_impossible_requests():
    with pytest.raises(ValueError, match="empty prompt set"):
        cycle([], 1)
    with pytest.raises(ValueError, match="0 or more"):
        cycle(numbered(2), -1)


def test_prompt_text_is_the_last_user_message():
    prompt = BenchPrompt(
        (ChatMessage("system", "s"), ChatMessage("user", "first"), ChatMessage("user", "second")), None, None, "t:1"
    )
    assert prompt_text(prompt) == "second"
    with pytest.raises(ValueError, match="no user message"):
        prompt_text(BenchPrompt((ChatMessage("system", "s"),), None, None, "t:2"))
