"""Images in a reply load only from the app's own origin (or LAB_IMAGE_ORIGINS); others become links.

Why: a prompt can steer a model into writing `![](https://host/x.png)`. Every classmate whose
browser draws that reply (a chat, a compare or blind round, a reopened thread) would send the
host their address and the time they looked, and a per-viewer URL would say who. The promise
has two layers, so a case one of them misses is still held by the other:

1. The page's Content-Security-Policy (`content_security_policy`, sent with every answer by
   ui/page_headers.py): `img-src` and `media-src` allow the app's own origin, `data:`, `blob:`
   and LAB_IMAGE_ORIGINS, nothing else. The browser refuses any other image or video whatever
   drew it, and whatever Markdown parser it came through. This is the guarantee, and the only
   one while a chat reply streams.
2. `remote_images_as_links`: the text a person is shown has every other image turned into a link
   whose text is the address, so they see where it points (and may follow it) instead of a
   broken picture.

Where the rewrite runs, and why there:
- Never on streamed chunks. Markdown arrives cut anywhere (`![a](ht` then `tps://h/x.png)`), so
  a chunk cannot be judged alone, and Chainlit appends chunks in the browser. While a chat reply
  streams, layer 1 alone holds; the picture shows as blocked until the reply ends.
- On whole texts, on the server, once per text that leaves it: a round's columns are sent whole
  at every refresh (core/rounds.py `round_props`), so each refresh is rewritten; a chat reply's
  final text is rewritten once when it ends (the update that replaces the streamed text, and
  what the chat history keeps). A text without `![` (no image can be written without it) is
  returned as it is after one substring search: the reply path pays nothing for it.
- In Python rather than in the browser's element: the text that leaves the server is already
  safe, a reopened thread or round shows what was stored, and one implementation is tested.

The scanner follows CommonMark's rules for images (inline `![alt](dest "title")`, reference
`![alt][label]`, `![alt][]`, `![alt]` with `[label]: dest`; escapes, entities, nested brackets,
code spans and autolinks first). It never changes code: fenced and indented code blocks are
found leniently (a line that might open one is taken as one), so where it is unsure it leaves
text alone and layer 1 still blocks the picture. It does not strip container prefixes (`> `,
list indentation) inside one image, so an image cut across quoted lines is left to layer 1 too.
"""

from __future__ import annotations

import html.entities
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping
from urllib.parse import urlsplit

from config import ConfigurationError
from core.texts import text as ui_text

ORIGINS_VARIABLE = "LAB_IMAGE_ORIGINS"
# What the page itself needs besides its own origin: Chainlit draws a few icons from data: URLs
# (its CSS) and previews (audio, uploads) from blob: URLs; neither reaches another host.
PAGE_SOURCES = ("'self'", "data:", "blob:")
# A Content-Security-Policy source names a host by letters, digits, dots and dashes only (no IPv6).
_ORIGIN = re.compile(r"^(https?)://([a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)(?::(\d{1,5}))?/?$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class ImageOrigins:
    """The origins besides the app's own that images and videos in replies may load from."""

    allowed: tuple[str, ...] = ()  # normalised: scheme://host[:port], lower case, no default port

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ImageOrigins":
        """LAB_IMAGE_ORIGINS: origins separated by commas or spaces, e.g. `https://img.example.edu`."""
        raw = env.get(ORIGINS_VARIABLE) or ""
        allowed = []
        for entry in re.split(r"[,\s]+", raw.strip()):
            if not entry:
                continue
            origin = _normalised_origin(entry)
            if origin is None:
                raise ConfigurationError(
                    f"{ORIGINS_VARIABLE} entry {entry!r} is not an origin like https://images.example.edu "
                    "(http or https, a host name or IPv4 address, an optional port; no path, no wildcard, "
                    "no IPv6 address: a Content-Security-Policy cannot name one).")
            if origin not in allowed:
                allowed.append(origin)
        return cls(tuple(allowed))

    def content_security_policy(self) -> str:
        """The page's Content-Security-Policy: images and videos from these origins only."""
        sources = " ".join((*PAGE_SOURCES, *self.allowed))
        return f"img-src {sources}; media-src {sources}"

    def loads(self, destination: str) -> bool:
        """Whether the browser may load an image at `destination` (a decoded Markdown destination):
        a path on the app's own origin, data:, blob:, or an allowed origin. Anything unclear is not."""
        # The URL parser drops surrounding spaces and controls and every tab or newline inside,
        # and reads a backslash as a slash in http(s) URLs.
        url = re.sub(r"[\t\n\r]", "", destination.strip("\x00- ")).replace("\\", "/")
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", url)
        if scheme is None:
            return not url.startswith("//")  # a path on this origin; `//host/...` is another host
        name = scheme.group(1).lower()
        if name in ("data", "blob"):
            return True
        if name not in _DEFAULT_PORTS:
            return False
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return False
        if "@" in parts.netloc or not parts.hostname:
            return False
        origin = f"{name}://{parts.hostname}" + (f":{port}" if port and port != _DEFAULT_PORTS[name] else "")
        return origin in self.allowed


def _normalised_origin(entry: str) -> str | None:
    match = _ORIGIN.match(entry.lower())
    if match is None:
        return None
    scheme, host, port = match.groups()
    if port is not None and not 0 < int(port) < 65536:
        return None
    keep_port = port is not None and int(port) != _DEFAULT_PORTS[scheme]
    return f"{scheme}://{host}" + (f":{int(port)}" if keep_port else "")


@lru_cache(maxsize=1)
def configured_image_origins() -> ImageOrigins:
    """LAB_IMAGE_ORIGINS of this process (read once, after .env is loaded)."""
    return ImageOrigins.from_env(os.environ)


# ---------------------------------------------------------------- the rewrite

ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_ESCAPE_OR_ENTITY = re.compile(r"\\([!-/:-@\[-`{-~])|&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_AUTOLINK = re.compile(r"<[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*>|<[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9.-]+>")
_MARKS = re.compile(r"[\\`<!\[\]]")  # where anything the bracket scan looks at can start
_BLANK = re.compile(r"^[ \t>]*$")
# A line after which indented code may start although it is not blank: a heading, a thematic break
# or a definition (none of them is a paragraph that the indented line would continue).
_NOT_A_PARAGRAPH = re.compile(r"^[ \t>]*(?:#{1,6}(?:[ \t]|$)|(?:[-*_][ \t]*){3,}$|\[[^\]]+\]:)")
_CONTAINER = re.compile(r"^[ ]{0,3}(?:>[ ]?|(?:[-+*]|[0-9]{1,9}[.)])(?:[ ]|(?=\t)))")
_FENCE_OPEN = re.compile(r"^[ \t>]*(?:(?:[-+*]|[0-9]{1,9}[.)])[ \t]+)*(`{3,}|~{3,})")
_DEFINITION = re.compile(  # one whole line: [label]: destination "optional title"
    r"^[ \t>]*(?:(?:[-+*]|[0-9]{1,9}[.)])[ \t]+)*\[((?:[^\[\]\\]|\\.){1,999})\]:[ \t]*(<[^<>\n]*>|[^\s<]\S*)"
    r"(?:[ \t]+(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\((?:[^()\\]|\\.)*\)))?[ \t]*$")


@dataclass
class _Opener:
    image: bool
    at: int


@dataclass
class _Span:
    image: bool
    start: int
    text_start: int
    text_end: int
    end: int
    destination: str  # as written (with <> if it had them)
    children: list["_Span"] = field(default_factory=list)


def remote_images_as_links(markdown: str, origins: ImageOrigins, lang: str = "en") -> str:
    """`markdown` with every image the browser may not load (`ImageOrigins.loads`) written as a
    link to its address whose text says it was not shown and gives its alt text and address (in
    `lang`). An image inside a link's text becomes that text, plain (a link cannot hold a link).
    Code is never changed."""
    if "![" not in markdown:
        return markdown
    return _rewritten(markdown, origins, lang)


@lru_cache(maxsize=64)
def _rewritten(markdown: str, origins: ImageOrigins, lang: str) -> str:
    """The rewrite of a text that holds `![`. Remembered: a round sends every column's whole text at
    each refresh, and the columns that have finished send the same text again and again."""
    lines = _classified_lines(markdown)
    definitions = _definitions(lines)
    pieces, done = [], 0
    for start, end in _paragraphs(lines):
        if markdown.find("![", start, end) < 0:
            continue  # no image can be in it
        for span in _spans(markdown, start, end, definitions):
            replacement = _replacement(markdown, span, origins, lang, in_link=False)
            if replacement is not None:
                pieces += [_before(markdown, done, span.start), replacement]
                done = span.end
    return "".join(pieces) + markdown[done:] if pieces else markdown


def _before(markdown: str, done: int, start: int) -> str:
    """The text from `done` to a replacement at `start`, with a `!` right before it escaped: the
    replacement starts with `[`, and `!` + `[` would open an image again."""
    piece = markdown[done:start]
    if piece.endswith("!"):
        backslashes = len(piece) - 1 - len(piece[:-1].rstrip("\\"))
        if backslashes % 2 == 0:  # the ! is not escaped already
            piece = piece[:-1] + "\\!"
    return piece


def _replacement(markdown: str, span: _Span, origins: ImageOrigins, lang: str, *, in_link: bool) -> str | None:
    """The text for `span` and what it holds, or None when none of it changes."""
    if span.image:
        address = decoded(span.destination)
        if origins.loads(address):
            return None  # an image inside an allowed image's alt text is only alt text: never loaded
        alt = " ".join(markdown[span.text_start:span.text_end].split())
        alt = " ".join(decoded(alt).split())
        shown = escaped(ui_text("remote_image" if alt else "remote_image_no_alt", lang, alt=alt, address=address))
        # The address, escaped, in <>: nothing in it can start code or end the link early.
        return shown if in_link else f"[{shown}](<{escaped(address)}>)"
    # A link: rewrite the images in its text, as plain text.
    pieces, done = [], span.text_start
    for child in span.children:
        replacement = _replacement(markdown, child, origins, lang, in_link=True)
        if replacement is not None:
            pieces += [_before(markdown, done, child.start), replacement]
            done = child.end
    if not pieces:
        return None
    return markdown[span.start:span.text_start] + "".join(pieces) + markdown[done:span.end]


def decoded(raw: str) -> str:
    """A Markdown destination or text as the parser reads it: <> removed, backslash escapes and
    entity references resolved (in one pass, as CommonMark does: `\\&amp;` stays `&amp;`)."""
    if raw.startswith("<") and raw.endswith(">"):
        raw = raw[1:-1]

    def one(match: re.Match) -> str:
        if match.group(1) is not None:
            return match.group(1)
        name = match.group(2)
        if name.startswith("#"):
            number = int(name[2:], 16) if name[1] in "xX" else int(name[1:])
            return chr(number) if 0 < number <= 0x10FFFF and not 0xD800 <= number <= 0xDFFF else "\ufffd"
        return html.entities.html5.get(name + ";", match.group(0))

    return _ESCAPE_OR_ENTITY.sub(one, raw)


def escaped(plain: str) -> str:
    """`plain` as Markdown text that renders as exactly these characters: every ASCII punctuation
    mark backslash-escaped, so no emphasis, link, code or image can start in it, and a backtick
    as a character reference, so it cannot close a code span opened before it (escapes do not
    work inside code)."""
    return "".join("&#96;" if char == "`" else "\\" + char if char in ASCII_PUNCTUATION else char
                   for char in plain)


def _label(raw: str) -> str:
    """A link label as CommonMark matches it: case-folded, inner whitespace collapsed."""
    return " ".join(raw.split()).casefold()


def _definitions(lines: list[tuple[int, str, str]]) -> dict[str, str]:
    """`[label]: destination` lines (the first of each label wins) where a paragraph could start,
    whole lines only, marked "definition" in `lines`: one this misses leaves its images to the
    page policy."""
    found: dict[str, str] = {}
    previous = "blank"
    for index, (offset, content, kind) in enumerate(lines):
        if (kind == "prose" and previous != "prose" and (match := _DEFINITION.match(content))
                and (match.group(2).startswith("<")
                     or _raw_destination_end(match.group(2), 0, len(match.group(2))) == len(match.group(2)))):
            found.setdefault(_label(match.group(1)), match.group(2))
            kind = "definition"
            lines[index] = (offset, content, kind)
        previous = kind
    return found


def _paragraphs(lines: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(start, end) of each run of prose lines, split where a line starts a block of its own."""
    paragraphs: list[tuple[int, int]] = []
    start, previous = None, ""
    for offset, content, kind in lines:
        if start is not None and (kind != "prose" or _starts_block(content, previous)):
            paragraphs.append((start, offset))
            start = None
        if kind == "prose" and start is None:
            start = offset
        previous = content
    if start is not None and lines:
        last_offset, last_content, _ = lines[-1]
        paragraphs.append((start, last_offset + len(last_content)))
    return paragraphs


def _quote_depth(line: str) -> tuple[int, str]:
    depth = 0
    while (marker := re.match(r"^[ ]{0,3}>[ ]?", line)) is not None:
        depth, line = depth + 1, line[marker.end():]
    return depth, line


def _starts_block(line: str, previous: str) -> bool:
    """Whether `line` interrupts the paragraph `previous` is in: a deeper block quote, a heading, a
    thematic break, or a list item that may interrupt one (a bullet, or 1.), not empty."""
    depth, rest = _quote_depth(line)
    if depth > _quote_depth(previous)[0]:
        return True
    return re.match(r"^[ ]{0,3}(?:#{1,6}(?:[ \t]|$)|(?:[-*_][ \t]*){3,}$|(?:[-+*]|1[.)])[ \t]+\S)", rest) is not None


def _classified_lines(markdown: str) -> list[tuple[int, str, str]]:
    """(offset, line without its ending, "code" | "blank" | "prose") for each line.

    Code is found leniently, so that code is never taken for prose: a line that may open a fence
    does; a fence ends at its closing line, at a line outside the block quote or list item it
    opened in, or at the end; a line indented 4 columns after a blank line is indented code."""
    lines: list[tuple[int, str, str]] = []
    fence: tuple[str, int, bool, int] | None = None  # character, length, in a quote, list content column
    previous_kind, previous = "blank", ""  # the document's start counts as after a blank line
    in_indented_code = False
    offset = 0
    for line in markdown.splitlines(keepends=True):
        content = line.rstrip("\r\n")
        if fence is not None and _leaves_container(content, fence):
            fence = None
        kind, indented = "prose", False
        if fence is not None:
            kind = "code"
            closing = re.match(r"^[ \t>]*(`{3,}|~{3,})[ \t]*$", content)
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= fence[1]:
                fence = None
        elif (opening := _FENCE_OPEN.match(content)) is not None and not (
                opening.group(1)[0] == "`" and "`" in content[opening.end():]):  # else a code span
            prefix = content[:opening.start(1)]
            listed = re.search(r"(?:[-+*]|[0-9]{1,9}[.)])[ \t]", prefix) is not None
            kind = "code"
            fence = (opening.group(1)[0], len(opening.group(1)), ">" in prefix, len(prefix) if listed else 0)
        elif (indent := _indented(content))[1] or indent[0] and (
                previous_kind != "prose" or in_indented_code or _NOT_A_PARAGRAPH.match(previous)
                or _quote_depth(content)[0] > _quote_depth(previous)[0]):
            kind, indented = "code", True
        elif _BLANK.match(content):
            kind = "blank"
        if indented:
            in_indented_code = True  # it goes on across blank lines, to the next line less indented
        elif kind != "blank":
            in_indented_code = False
        previous_kind, previous = kind, content
        lines.append((offset, content, kind))
        offset += len(line)
    return lines


def _leaves_container(line: str, fence: tuple[str, int, bool, int]) -> bool:
    """Whether a non-blank line ends the block quote or list item a fence opened in (and so the fence)."""
    _, _, quoted, list_column = fence
    if not line.strip():
        return False
    if quoted and not re.match(r"^[ ]{0,3}>", line):
        return True
    return list_column > 0 and len(line) - len(line.lstrip(" ")) < list_column


def _indented(line: str) -> tuple[bool, bool]:
    """(may be indented code after a blank line, is code wherever it stands) for one line, inside
    its block quotes and list markers (each with the one space it takes; tabs count 4 columns).
    A list item whose text starts 4 columns after its marker's space starts with code; a line
    indented 8 columns or more is taken as code anywhere (a list item's code; rarely a lazy line)."""
    rest, listed = line, False
    while (container := _CONTAINER.match(rest)) is not None and container.end() > 0:
        listed = listed or ">" not in container.group(0)
        rest = rest[container.end():]
    indent = len(rest) - len(rest.lstrip(" \t"))
    columns = len(rest[:indent].expandtabs(4))
    if not rest.strip():
        return False, False
    return columns >= 4, (listed and columns >= 4) or len(line[:len(line) - len(line.lstrip(" \t>"))].expandtabs(4)) >= 8


def _spans(markdown: str, start: int, end: int, definitions: dict[str, str]) -> list[_Span]:
    """The outermost links and images of one paragraph, each with the ones inside its text,
    found as CommonMark's bracket algorithm finds them."""
    openers: list[_Opener] = []
    found: list[_Span] = []  # in order, none inside another
    inactive_below = 0  # link openers below this height of the stack can no longer open a link
    unclosed_runs: set[int] = set()  # lengths of backtick runs with no closing run further on
    at = start
    while (next_mark := _MARKS.search(markdown, at, end)) is not None:
        at = next_mark.start()
        char = markdown[at]
        if char == "\\" and at + 1 < end and markdown[at + 1] in ASCII_PUNCTUATION:
            at += 2
        elif char == "`":
            at = _after_code_span(markdown, at, end, unclosed_runs)
        elif char == "<" and (autolink := _AUTOLINK.match(markdown, at, end)) is not None:
            at = autolink.end()
        elif char == "!" and markdown.startswith("[", at + 1) and at + 1 < end:
            openers.append(_Opener(image=True, at=at))
            at += 2
        elif char == "[":
            openers.append(_Opener(image=False, at=at))
            at += 1
        elif char == "]" and openers:
            opener = openers.pop()
            inactive = not opener.image and len(openers) < inactive_below
            inactive_below = min(inactive_below, len(openers))  # its place on the stack is free again
            if inactive:
                at += 1
                continue
            text_start = opener.at + (2 if opener.image else 1)
            tail = _inline_tail(markdown, at + 1, end) or _reference_tail(
                markdown, at + 1, end, markdown[text_start:at], definitions)
            if tail is None:
                at += 1
                continue
            destination, after = tail
            span = _Span(opener.image, opener.at, text_start, at, after, destination)
            while found and found[-1].start >= text_start:  # what closed inside its text
                span.children.insert(0, found.pop())
            found.append(span)
            if not opener.image:  # no link inside a link: no [ below can open one any more
                inactive_below = len(openers)
            at = after
        else:
            at += 1
    return found


def _after_code_span(markdown: str, at: int, end: int, unclosed_runs: set[int]) -> int:
    """Past a code span starting at `at`, or past the backtick run if it never closes (then its
    length goes into `unclosed_runs`: no later run of that length closes either)."""
    run_end = at
    while run_end < end and markdown[run_end] == "`":
        run_end += 1
    run = run_end - at
    search = run_end
    while run not in unclosed_runs and (close := markdown.find("`" * run, search, end)) >= 0:
        close_end = close + run
        while close_end < end and markdown[close_end] == "`":
            close_end += 1
        if close_end - close == run:
            return close_end
        search = close_end
    unclosed_runs.add(run)
    return run_end


def _inline_tail(markdown: str, at: int, end: int) -> tuple[str, int] | None:
    """`(destination "title")` at `at`: (the destination as written, the index after `)`)."""
    if not markdown.startswith("(", at) or at >= end:
        return None
    at = _skip_space(markdown, at + 1, end)
    if at < end and markdown[at] == "<":
        close = at + 1
        while close < end and markdown[close] not in "<>\n":
            close += 2 if markdown[close] == "\\" and close + 1 < end else 1
        if close >= end or markdown[close] != ">":
            return None
        destination, at = markdown[at:close + 1], close + 1
    else:
        begin = at
        at = _raw_destination_end(markdown, at, end)
        if at is None:
            return None
        destination = markdown[begin:at]
    before_title = at
    at = _skip_space(markdown, at, end)
    if at < end and markdown[at] in "\"'(" and at > before_title:
        closer = ")" if markdown[at] == "(" else markdown[at]
        at += 1
        while at < end and markdown[at] != closer:
            if markdown[at] == "(" and closer == ")":
                return None
            at += 2 if markdown[at] == "\\" and at + 1 < end else 1
        if at >= end:
            return None
        at = _skip_space(markdown, at + 1, end)
    if at < end and markdown[at] == ")":
        return destination, at + 1
    return None


def _raw_destination_end(markdown: str, at: int, end: int) -> int | None:
    """Where a destination without <> starting at `at` ends (at a space, a control character or an
    unmatched `)`); None if its parentheses do not balance, so that it is no destination."""
    depth = 0
    while at < end:
        char = markdown[at]
        if char == "\\" and at + 1 < end and markdown[at + 1] in ASCII_PUNCTUATION:
            at += 2
            continue
        if char.isspace() or ord(char) < 0x20:
            break
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                break
            depth -= 1
        at += 1
    return None if depth else at


def _reference_tail(markdown: str, at: int, end: int, text: str,
                    definitions: dict[str, str]) -> tuple[str, int] | None:
    """`[label]`, `[]` or nothing after the text: (the defined destination, the index after)."""
    label, after = text, at
    if markdown.startswith("[", at) and at < end:
        close = at + 1
        while close < end and markdown[close] not in "[]":
            close += 2 if markdown[close] == "\\" and close + 1 < end else 1
        if close < end and markdown[close] == "]":
            inner = markdown[at + 1:close]
            label, after = (inner if inner.strip() else text), close + 1
    destination = definitions.get(_label(label)) if label.strip() else None
    return (destination, after) if destination is not None else None


def _skip_space(markdown: str, at: int, end: int) -> int:
    while at < end and markdown[at] in " \t\n":
        at += 1
    return at
