"""The image rule (core/images.py): which images a reply may load, and the rewrite of the others.

The rewrite is checked against a CommonMark parser (markdown-it-py, a test dependency): after
it, the parser finds no image the browser may not load; code is unchanged; every image that was
not allowed is now a link to the same address whose text shows the address. The browser side
(Chainlit's own Markdown renderer, the Content-Security-Policy) is in tests/test_images_browser.py.
"""

from __future__ import annotations

import itertools
import random

import pytest
from markdown_it import MarkdownIt

from config import ConfigurationError
from core.images import ImageOrigins, decoded, escaped, remote_images_as_links

ORIGINS = ImageOrigins.from_env({"LAB_IMAGE_ORIGINS": "https://img.example.edu, http://127.0.0.1:9000"})
PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])

REMOTE = [
    "https://evil.example/x.png",
    "http://evil.example:8080/x.png?who=alice",
    "//evil.example/p.png",  # protocol-relative: another host
    "&#104;ttps://evil.example/entity.png",  # an entity the parser decodes to "https"
    "https&#58;//evil.example/colon.png",
    "<https://evil.example/a b.png>",  # angle brackets allow spaces
    "https://evil.example/paren_(1).png",  # balanced parentheses stay in the address
    "https://img.example.edu@evil.example/userinfo.png",
    "https://img.example.edu.evil.example/suffix.png",
    "HTTPS://EVIL.EXAMPLE/CAPS.PNG",
    "https://img.example.edu:8443/other-port.png",
    "http://img.example.edu/other-scheme.png",
    "ftp://evil.example/x.png",
    "https://evil.example/x.mp4",  # Chainlit draws a video for these
]
ALLOWED = [
    "/public/logo.png",
    "relative/path.png",
    "https://img.example.edu/ok.png",
    "HTTPS://IMG.EXAMPLE.EDU:443/ok.png",
    "http://127.0.0.1:9000/ok.png",
    "data:image/png;base64,iVBORw0KGgo=",
]


def images(markdown: str) -> list[str]:
    """The src of every image a CommonMark parser finds."""
    found = []
    for token in PARSER.parse(markdown):
        for child in token.children or []:
            if child.type == "image":
                found.append(child.attrGet("src"))
    return found


def links(markdown: str) -> list[tuple[str, str]]:
    """(href, text) of every link a CommonMark parser finds."""
    found = []
    for token in PARSER.parse(markdown):
        children = token.children or []
        for index, child in enumerate(children):
            if child.type == "link_open":
                text = "".join(c.content for c in itertools.takewhile(lambda c: c.type != "link_close",
                                                                      children[index + 1:]))
                found.append((child.attrGet("href"), text))
    return found


def code(markdown: str) -> list[str]:
    """The content of every code span and code block."""
    found = []
    for token in PARSER.parse(markdown):
        if token.type in ("fence", "code_block"):
            found.append(token.content)
        found += [child.content for child in token.children or [] if child.type == "code_inline"]
    return found


def not_loadable(markdown: str) -> list[str]:
    return [src for src in images(markdown) if not ORIGINS.loads(src)]


# Where an image can stand in a reply ({image} is replaced): each must be rewritten.
PLACES = [
    "{image}",
    "Look: {image} there.",
    "- item with {image}\n- another",
    "1. step\n2. {image}",
    "> quoted {image}",
    "# Heading {image}",
    "**bold {image}** and _it {image}_",
    "| a | b |\n|---|---|\n| {image} | x |",
    "line one\n{image}\nline three",
    "Text with `code` before {image} and `code` after.",
    "```\ncode first\n```\n\n{image}",
    "~~~\n```\n~~~\n{image}",
    "\\`not code {image}`",
]


@pytest.mark.parametrize("destination", REMOTE)
@pytest.mark.parametrize("place", PLACES)
def test_every_remote_image_becomes_a_link_to_its_address(place: str, destination: str):
    markdown = place.format(image=f"![a cat]({destination})")
    assert not_loadable(markdown), "the case must hold an image the parser finds"
    rewritten = remote_images_as_links(markdown, ORIGINS)
    assert not_loadable(rewritten) == [], rewritten
    address = decoded(destination)
    shown = [text for href, text in links(rewritten) if "image not shown" in text]
    assert shown and all(address in text and "a cat" in text for text in shown), (rewritten, links(rewritten))
    assert {href for href, text in links(rewritten) if "image not shown" in text} == set(images(markdown))


@pytest.mark.parametrize("destination", ALLOWED)
@pytest.mark.parametrize("place", PLACES[:6])
def test_an_image_from_the_apps_origin_data_or_an_allowed_origin_is_left_alone(place: str, destination: str):
    markdown = place.format(image=f"![ok]({destination})")
    assert images(markdown) and not not_loadable(markdown)
    assert remote_images_as_links(markdown, ORIGINS) == markdown


@pytest.mark.parametrize("markdown", [
    "`![x](https://evil.example/x.png)`",
    "``a ` ![x](https://evil.example/x.png) ``",
    "```md\n![x](https://evil.example/x.png)\n```",
    "~~~~\n![x](https://evil.example/x.png)\n~~~\n~~~~",
    "Text.\n\n    ![x](https://evil.example/x.png)\n\n    more code",
    "1. Run:\n   ```bash\n   echo '![x](https://evil.example/x.png)'\n   ```",
    "> ```\n> ![x](https://evil.example/x.png)\n> ```",
])
def test_code_that_shows_an_image_is_never_changed(markdown: str):
    assert not images(markdown)
    assert remote_images_as_links(markdown, ORIGINS) == markdown


def test_a_text_with_code_and_images_keeps_its_code_exactly():
    markdown = ("Use `![x](https://evil.example/x.png)` in Markdown:\n\n```md\n![y](https://evil.example/y.png)\n```\n\n"
                "Rendered: ![z](https://evil.example/z.png)")
    rewritten = remote_images_as_links(markdown, ORIGINS)
    assert code(rewritten) == code(markdown) and not_loadable(rewritten) == []


def test_brackets_around_an_image_and_a_link_are_no_link_so_the_image_becomes_a_link_of_its_own():
    # A link cannot hold a link: after [b](https://b.example) closes, the outer [ is plain text.
    markdown = "[![x](https://evil.example/i.png) [b](https://b.example)](https://t.example) [c](https://c.example)"
    rewritten = remote_images_as_links(markdown, ORIGINS)
    assert [href for href, _ in links(rewritten)] == [
        "https://evil.example/i.png", "https://b.example", "https://c.example"], rewritten


def test_an_image_inside_a_link_becomes_plain_text_and_the_link_stays():
    markdown = "[![build](https://evil.example/badge.svg)](https://ci.example/run/1) done"
    rewritten = remote_images_as_links(markdown, ORIGINS)
    assert images(rewritten) == []
    assert links(rewritten) == [("https://ci.example/run/1",
                                 'image not shown ("build"): https://evil.example/badge.svg')]


@pytest.mark.parametrize("markdown", [
    "![cat][pic]\n\n[pic]: https://evil.example/ref.png",
    "![Pic][]\n\n[pic]: <https://evil.example/ref.png> \"title\"",
    "![PIC]\n\n[pic]: https://evil.example/ref.png",
    "[pic]: https://evil.example/ref.png\n\nAbove: ![pic] and ![again][PIC]",
])
def test_a_reference_image_becomes_a_link(markdown: str):
    assert not_loadable(markdown)
    rewritten = remote_images_as_links(markdown, ORIGINS)
    assert not_loadable(rewritten) == [] and any("evil.example/ref.png" in text for _, text in links(rewritten))


@pytest.mark.parametrize("markdown", [
    "![outer ![inner](https://evil.example/in.png)](https://evil.example/out.png)",
    "![alt with [a link](https://x.example) in it](https://evil.example/out.png)",
    "![multi\nline alt](https://evil.example/x.png \"a title\")",
    "![x](https://evil.example/x.png 'single') ![y](https://evil.example/y.png (paren))",
    "![*emph* `code` \\] bracket](https://evil.example/x.png)",
    "Two: ![a](https://evil.example/a.png)![b](https://evil.example/b.png)",
    "![](https://evil.example/empty-alt.png)",
    "| ![a](https://evil.example/a\\|b.png) | c |\n|---|---|\n| d | e |",
])
def test_odd_but_valid_images_become_links(markdown: str):
    assert not_loadable(markdown)
    assert not_loadable(remote_images_as_links(markdown, ORIGINS)) == []


@pytest.mark.parametrize("markdown", [
    "no images here, just ! and [brackets] and (parens)",
    "![not closed](https://evil.example/x.png",
    "![space in address](https://evil.example/a b.png)",
    "\\![escaped bang](https://evil.example/x.png)",
    "![x]\n\n(no definition)",
    "an ![allowed](/public/x.png) one",
])
def test_text_without_a_remote_image_comes_back_unchanged(markdown: str):
    assert not not_loadable(markdown)
    assert remote_images_as_links(markdown, ORIGINS) == markdown


def test_an_image_in_a_list_continuation_indented_four_spaces_is_left_to_the_page_policy():
    # CommonMark reads it as the list item's paragraph; the scanner cannot tell it from indented
    # code without tracking lists, so it leaves it (the Content-Security-Policy still blocks it).
    markdown = "1. item\n\n    ![x](https://evil.example/x.png)"
    assert remote_images_as_links(markdown, ORIGINS) == markdown


def test_the_link_text_is_in_the_persons_language():
    rewritten = remote_images_as_links("![猫](https://evil.example/x.png)", ORIGINS, "zh")
    assert links(rewritten) == [("https://evil.example/x.png", "未显示的图片（“猫”）：https://evil.example/x.png")]


def test_escaped_text_renders_as_exactly_its_characters():
    plain = "*a* _b_ `c` [d](e) ![f](g) <h> &amp; | \\ # https://x.example/y_z"
    as_html = plain.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert PARSER.renderInline(escaped(plain)) == as_html


def test_allowed_origins_come_from_lab_image_origins_and_shape_the_page_policy():
    origins = ImageOrigins.from_env({"LAB_IMAGE_ORIGINS": "https://Img.Example.edu/ https://img.example.edu:443,"
                                                          " http://10.0.0.5:8080"})
    assert origins.allowed == ("https://img.example.edu", "http://10.0.0.5:8080")
    assert origins.content_security_policy() == (
        "img-src 'self' data: blob: https://img.example.edu http://10.0.0.5:8080; "
        "media-src 'self' data: blob: https://img.example.edu http://10.0.0.5:8080")
    assert ImageOrigins.from_env({}).content_security_policy() == "img-src 'self' data: blob:; media-src 'self' data: blob:"


@pytest.mark.parametrize("entry", ["https://*.example.edu", "img.example.edu", "https://img.example.edu/path",
                                   "https://img.example.edu;script-src *", "javascript:alert(1)", "https://a:99999",
                                   "http://[::1]:8080", "https://bücher.example"])
def test_an_allowed_origin_that_is_not_an_origin_is_refused_with_the_variable_named(entry: str):
    with pytest.raises(ConfigurationError, match="LAB_IMAGE_ORIGINS"):
        ImageOrigins.from_env({"LAB_IMAGE_ORIGINS": entry})


PIECES = ["![a](https://e.x/1.png)", "![b][r]", "[r]: https://e.x/r.png", "`", "``", "```", "~~~", "[", "]", "(",
          ")", "!", "\\", "<", ">", "*", "_", "\n", "\n\n", "    ", "> ", "- ", "1. ", "|", "text", " ", "\t",
          "<https://a.b/c>", "[l](https://t.x)", "&amp;", "&#104;", '"t"', "![c](/own.png)", "![d](<https://e.x/d d.png>)"]


def test_on_random_markdown_the_rewrite_never_changes_code_nor_adds_an_image():
    """Random Markdown-ish text (a fixed seed): code spans and blocks stay exactly as they were, and
    no image the browser may not load appears that was not there (in containers the scanner does
    not follow, an image may stay: the page policy blocks it)."""
    generator = random.Random(20260522)
    left = 0
    for _ in range(3000):
        markdown = "".join(generator.choice(PIECES) for _ in range(generator.randint(1, 14)))
        rewritten = remote_images_as_links(markdown, ORIGINS)
        assert code(rewritten) == code(markdown), (markdown, rewritten)
        remaining = not_loadable(rewritten)
        assert set(remaining) <= set(not_loadable(markdown)), (markdown, rewritten)
        left += bool(remaining)
    assert left < 30, f"{left} of 3000 texts kept an image they should not"  # ~0.5% in list/quote corners
