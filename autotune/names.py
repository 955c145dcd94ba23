"""Closest known names to a mistyped one, for the "did you mean" part of one-line errors.

`difflib` on lower-cased names with punctuation ignored (``gptoss-120b`` -> ``gpt-oss-120b``, ``mtbench`` ->
``mt-bench``), keeping the matches about as close as the best one; then names that hold the typed one as a whole
dash-separated part (``p-eagle`` -> ``gpt-oss-120b-p-eagle``). Pure: callers pass the names they know.

`name_problem` says why a name or label given by a user cannot be used (not valid Unicode, not printable, too long).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

#: Most names a suggestion lists.
MAX_SUGGESTIONS = 3
#: difflib similarity (0 to 1) a name needs to be suggested: its default. "h2000" -> "h200" scores 0.89, "mtbench"
#: -> "mt-bench" 1.0 (punctuation ignored), "h20" -> "h100" 0.57 (not suggested).
CUTOFF = 0.6
#: Matches more than this below the best one are left out ("h2000": h200 at 0.89, not h100 or b200 at 0.67).
SPREAD = 0.1


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", name.lower())


def closest(word: str, known: Mapping[str, str] | Iterable[str], *, n: int = MAX_SUGGESTIONS) -> list[str]:
    """Up to `n` suggestions for `word`, best first; [] when nothing is close or `word` is itself known.

    `known`: the names accepted, or a mapping name -> what to suggest for it (e.g. every alias of a model -> its
    short name), so one entry is suggested once whichever of its names matched."""
    shown = dict(known) if isinstance(known, Mapping) else {k: k for k in known}
    shown = {name: show for name, show in shown.items() if name}
    typed = word.strip()
    if not typed or not shown or typed.lower() in {name.lower() for name in shown}:
        return []
    by_key: dict[str, str] = {}
    for name in shown:
        by_key.setdefault(_key(name), name)
    wanted = _key(typed)
    if wanted in by_key:  # the same letters and digits: only punctuation differs
        return [shown[by_key[wanted]]]
    scored = sorted(((difflib.SequenceMatcher(None, wanted, k).ratio(), k) for k in by_key), key=lambda s: -s[0])
    best = scored[0][0] if scored else 0.0
    found = [shown[by_key[k]] for ratio, k in scored if ratio >= max(CUTOFF, best - SPREAD)]
    part = typed.lower()
    if len(part) >= 3:
        for name, show in shown.items():
            pieces = re.split(r"[/:]", name.lower())
            if any(p.endswith("-" + part) or p.startswith(part + "-") or f"-{part}-" in p for p in pieces):
                found.append(show)
    return list(dict.fromkeys(found))[:n]


def did_you_mean(word: str, known: Mapping[str, str] | Iterable[str]) -> str:
    """``"did you mean gpt-oss-120b? "`` (ending in a space, to start a message), or "" when nothing is close."""
    found = closest(word, known)
    if not found:
        return ""
    listed = found[0] if len(found) == 1 else ", ".join(found[:-1]) + " or " + found[-1]
    return f"did you mean {listed}? "


def name_problem(value: str, limit: int) -> str | None:
    """Why `value` is no usable name or label (a lone surrogate, a control character or line break, longer than
    `limit` characters), or None. Names are shown in terminals, written into files and stored, so each must be
    printable Unicode of bounded length.

    Example: ``name_problem("c\\ud800", 64)`` -> ``"holds a lone surrogate '\\ud800' at character 1 (...)"``.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds a lone surrogate {value[exc.start]!r} at character {exc.start} (it is not valid Unicode)"
    if len(value) > limit:
        return f"is {len(value):,} characters long (at most {limit:,})"
    if not value.isprintable():
        i, char = next((i, c) for i, c in enumerate(value) if not c.isprintable())
        return f"holds the control character {char!r} at character {i}"
    return None
