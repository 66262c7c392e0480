"""Text that names from files reach people through: a terminal, a Markdown report, one-line messages.

Graph, node, device and cluster names come from files anyone may write. Shown
as they are, a name could clear the screen or set the terminal's title
(``ESC [2J``, an OSC sequence), turn the one line of an error into pages, or
put HTML into a Markdown report. Every such name passes through one of these
functions on its way out:

* :func:`terminal`: control characters escaped as Python writes them (``\\x1b``).
* :func:`markdown`: that, and the characters Markdown or HTML would read as markup escaped.
* :func:`one_line`: a whole message for stderr: control characters escaped, long values cut with an ellipsis.

``repr`` (a name quoted with ``!r``) escapes control characters already;
:func:`placer.io.shown` quotes a value cut to a length.
"""

from __future__ import annotations

import re

__all__ = ["terminal", "markdown", "one_line", "MESSAGE_CHARS", "RUN_CHARS"]

#: Control characters (C0, DEL, C1), the line and paragraph separators, and the marks that reorder text
#: (bidirectional embeddings, overrides and isolates: a name could show other characters than it holds).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")

#: What Markdown (CommonMark, GitHub's tables) would read as a link, an image, code, emphasis, a table
#: cell's end or an escape: each escaped with a backslash, which CommonMark defines for ASCII punctuation.
_MARKDOWN = re.compile(r"([\\`*\[\]|~])")
#: What inline HTML starts with: written as entities, which every Markdown renderer shows as the character.
_HTML = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})

#: The longest one-line message :func:`one_line` passes whole; a longer one keeps its start and its end.
MESSAGE_CHARS = 2000
#: The longest run of characters without a space :func:`one_line` passes whole (a path or a name).
RUN_CHARS = 200

_LONG_RUN = re.compile(r"\S{%d,}" % (RUN_CHARS + 1))


def _escape(found: re.Match) -> str:
    return found.group().encode("unicode_escape").decode("ascii")


def terminal(text: object) -> str:
    """``text`` with its control characters escaped, as ``repr`` would write them.

    Parameters
    ----------
    text : object
        A name or a line; anything else is shown with ``str``.

    Returns
    -------
    str
        No character that moves the cursor, clears the screen, rings, starts an
        escape sequence, breaks the line or reorders what follows.

    Examples
    --------
    >>> terminal("conv1\\x1b[2J")
    'conv1\\\\x1b[2J'
    >>> terminal("a\\nb\\u202ec")
    'a\\\\nb\\\\u202ec'
    >>> terminal("résumé")
    'résumé'
    """
    return _CONTROL.sub(_escape, str(text))


def markdown(text: object) -> str:
    """``text`` for a Markdown document: control characters escaped (:func:`terminal`: a name breaks
    no line, heading or table row), ``&``, ``<`` and ``>`` as HTML entities, and what would make a link,
    code, emphasis or a table cell escaped with a backslash, so that a name renders as written: no HTML,
    link or cell comes of it.

    Examples
    --------
    >>> markdown("<script>alert(1)</script>")
    '&lt;script&gt;alert(1)&lt;/script&gt;'
    >>> markdown("[x](javascript:y) a|b")
    '\\\\[x\\\\](javascript:y) a\\\\|b'
    >>> markdown("round_robin on 2x4xV100 (1.5 ms)")
    'round_robin on 2x4xV100 (1.5 ms)'
    """
    return _MARKDOWN.sub(r"\\\1", terminal(text)).translate(_HTML)


def _cut_run(found: re.Match) -> str:
    run = found.group()
    return f"{run[: RUN_CHARS // 2]}... ({len(run):,} characters)"


def one_line(message: object) -> str:
    """A message for one line of stderr: control characters escaped (:func:`terminal`), each run of more
    than :data:`RUN_CHARS` characters without a space cut with an ellipsis and its length, and a message
    still longer than :data:`MESSAGE_CHARS` cut in its middle.

    Values in messages are often quoted whole (a node id, a list of them); a file's 200,000-character id
    would otherwise make the line 200 KB long.

    Examples
    --------
    >>> line = one_line("duplicate node id '" + "x" * 200_000 + "'")
    >>> len(line), line[:24], line[-24:]
    (142, "duplicate node id 'xxxxx", '... (200,002 characters)')
    >>> one_line("bell\\x07")
    'bell\\\\x07'
    """
    text = _LONG_RUN.sub(_cut_run, terminal(message))
    if len(text) > MESSAGE_CHARS:
        head, tail = text[: MESSAGE_CHARS * 3 // 4], text[-MESSAGE_CHARS // 4 :]
        text = f"{head} ... ({len(text) - len(head) - len(tail):,} characters left out) ... {tail}"
    return text
