"""Names that become paths or C text, each checked against one strict pattern (a full match).

A target ``name`` becomes a folder, a sweep's model ``name`` a folder, a leaf name a folder and part of C identifiers, ``export --name`` a C
identifier and file names, ``--section`` a linker section in C text. Each kind has one pattern; a name that
does not match it is refused with one line naming where it came from and the allowed form. Text that is not
a name but lands in C goes through ``export.c_literals.c_string`` (strings) or :func:`c_comment` (comments).
"""

from __future__ import annotations

import re

from edgedeploy.errors import EdgeDeployError, UsageError

C_KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int long
register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
_Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert _Thread_local
alignas alignof bool constexpr false nullptr static_assert thread_local true typeof typeof_unqual
asm catch class delete friend mutable namespace new operator private protected public template this throw try
typename using virtual explicit export
""".split())

# kind -> (pattern, the allowed form in words)
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    # a folder name: letters, digits, '-', '_', '.', starting with a letter or digit, no '..'
    "target": (re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]|\.(?!\.)){0,63}"),
               "1-64 letters, digits, '-', '_' or '.', starting with a letter or digit, no '..'"),
    # a model of a sweep: its run folder under the sweep's folder (no '.', so never a file name like sweep.json)
    "model": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"),
              "1-64 letters, digits, '-' or '_', starting with a letter or digit"),
    # leaves and variants: folder names and parts of C identifiers
    "leaf": (re.compile(r"[a-z][a-z0-9_]{0,63}"),
             "1-64 lower-case letters, digits or '_', starting with a letter"),
    # a C identifier that is not a keyword (the export's symbol prefix and file names)
    "c_identifier": (re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}"),
                     "a C identifier: 1-63 letters, digits or '_', not starting with a digit, not a C keyword"),
    # a linker section name: '.', letters, digits, '_' (e.g. .nn_model or nn_model), no '..'
    "section": (re.compile(r"\.?[A-Za-z_](?:[A-Za-z0-9_]|\.(?!\.)){0,62}"),
                "a linker section: letters, digits, '_' and single '.', e.g. nn_model or .bss.nn_model"),
}


def is_valid(kind: str, value: object) -> bool:
    pattern, _ = PATTERNS[kind]
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        return False
    return not (kind == "c_identifier" and value in C_KEYWORDS)


def check_name(kind: str, value: object, where: str, error: type[EdgeDeployError] = UsageError) -> str:
    """``value`` when it is a valid ``kind`` name; otherwise ``error`` naming ``where`` and the allowed form.

    ``where`` says where the name came from: ``"FILE: key `name`"`` or ``"--name"``.
    """
    if isinstance(value, str) and is_valid(kind, value):
        return value
    _, form = PATTERNS[kind]
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    extra = " (a C keyword)" if isinstance(value, str) and value in C_KEYWORDS and kind == "c_identifier" else ""
    raise error(f"{where} is {shown}{extra}; it must be {form}", "rename it")


def c_comment(text: str) -> str:
    """``text`` safe inside a ``/* */`` or ``//`` comment: one line, printable ASCII, no comment delimiters."""
    safe = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text)
    while "*/" in safe or "/*" in safe:
        safe = safe.replace("*/", "* /").replace("/*", "/ *")
    return safe.replace("\\", "/")  # a trailing backslash would continue a // comment onto the next line
