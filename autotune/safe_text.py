"""Text from names (files, the database, arguments) made safe for where it is shown.

- `terminal_text`: what reaches a terminal (rich output and one-line errors) has no control characters: no escape
  sequences (ESC, CSI), no C0/C1 controls but newline and tab, no bidirectional overrides, no line separators;
  a lone surrogate (which no terminal encoding can write) becomes ``?``.
- `shell_word`: one word of a shell command line, quoted; non-printable characters as escapes.
- `printable_line`: one line of printable characters, for text inside a line-based syntax (YAML comments): every
  character Python does not call printable (line breaks of every kind, controls, format characters, separators
  other than the space, lone surrogates) becomes ``?``, so a name can never end the line it is written on.
"""

from __future__ import annotations

import re
import shlex

#: C0 controls but tab and newline, DEL, C1 controls (U+0085 NEL among them), the Arabic letter mark, the
#: left-to-right and right-to-left marks, embeddings, overrides and isolates, line and paragraph separators, BOM.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2028\u2029"
                              "\u2066-\u2069\ufeff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def terminal_text(text: str) -> str:
    """`text` without the characters a terminal would act on instead of showing (see the module docstring).

    They are removed, not replaced: each is zero columns wide, so tables measured with them keep their widths.

    >>> terminal_text("study\\x1b[2J\\x07 \\u202eevil")
    'study[2J evil'
    """
    if _TERMINAL_UNSAFE.search(text):
        text = _TERMINAL_UNSAFE.sub("", text)
    if _SURROGATE.search(text):
        text = _SURROGATE.sub("?", text)
    return text


def printable_line(text: str) -> str:
    """`text` as one line of printable characters: any other character becomes ``?``.

    >>> printable_line("w\\nhost: 0.0.0.0\\u2028port: 1")
    'w?host: 0.0.0.0?port: 1'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def shell_word(word: str) -> str:
    r"""`word` as one word of a POSIX shell command line: `shlex.quote` when every character is printable; else in
    ``$'...'`` quotes (bash, zsh, ksh, POSIX.1-2024 sh) with each non-printable character as an escape, so the line
    shows no raw control character and the shell still reads the exact word.

    >>> print(shell_word("my model"), shell_word("a\x1b[31m'b\n"))
    'my model' $'a\x1b[31m\'b\x0a'
    """
    if word.isprintable():
        return shlex.quote(word)
    out = []
    for ch in word:
        code = ord(ch)
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "$'" + "".join(out) + "'"
