"""MkDocs hook: the Python API page, written from the code's own signatures and docstrings at build time.

A page asks with a marker line: ``<!-- api: edgedeploy.optimize -->`` (a function or class of the checkout's
``src/edgedeploy``) or ``<!-- api-all: edgedeploy.api -->`` (every name in a module's ``__all__``). A class
lists its public methods and properties. A public name without a docstring is logged as a warning, which
``mkdocs build --strict`` turns into a failed build, so the page documents every public function and object
(and every public member of the classes named one by one).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- (api|api-all): ([\w.]+) -->$", re.M)
log = logging.getLogger("mkdocs.hooks.pyapi")


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = str(REPO / "src")
    if src not in sys.path:
        sys.path.insert(0, src)

    def replace(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        if kind == "api-all":
            module = importlib.import_module(name)
            return "\n\n".join(render(f"{name}.{n}", getattr(module, n), level=3, strict=False)
                                 for n in module.__all__)
        return render(name, resolve(name), level=3)

    return MARKER.sub(replace, markdown)


def resolve(dotted: str) -> Any:
    """``edgedeploy.optimize`` (an attribute of the package, before a subpackage of that name), or
    ``edgedeploy.interactive.optimize_run.OptimizeRun`` ..."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], start=2):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i]))
    return obj


def markdown_doc(doc: str) -> str:
    """A docstring's reST roles and Google-style sections as Markdown."""
    doc = re.sub(r":(?:func|class|mod|meth|data|attr):`~?([^`]+)`", lambda m: f"`{m.group(1)}`", doc)
    doc = doc.replace("``", "`")
    out: list[str] = []
    section = None
    for line in doc.splitlines():
        head = re.match(r"^(Args|Returns|Raises):\s*$", line)
        if head:
            section = head.group(1)
            out += ["", f"**{section}**", ""]
            continue
        if section == "Args":
            item = re.match(r"^    (\*{0,2}\w+): (.*)$", line)
            if item:
                out.append(f"- `{item.group(1)}`: {item.group(2)}")
                continue
            if line.startswith("        "):
                out[-1] += " " + line.strip()
                continue
        if section == "Returns" and line.startswith("    "):
            out.append(line.strip())
            continue
        section = None if line and not line.startswith(" ") else section
        out.append(line)
    return "\n".join(out).strip()


def _wrapped(obj: Any) -> Any | None:
    """The function a ``(*args, **kwargs)`` wrapper names in its docstring (``See :func:`X```), if any."""
    m = re.search(r":func:`~?([\w.]+)`", inspect.getdoc(obj) or "")
    if not m:
        return None
    try:
        return resolve(m.group(1))
    except (ImportError, AttributeError):
        return None


def signature(name: str, obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = list(sig.parameters.values())
    if [p.kind for p in params] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        target = _wrapped(obj)
        if target is not None and target is not obj:
            sig = inspect.signature(target)
    text = str(sig).replace("'", "")
    return f"{name}{text}"


def render(name: str, obj: Any, level: int, strict: bool = True) -> str:
    """``obj`` as Markdown; ``strict``: a public method or property without a docstring is a warning too (else
    only the object itself must have one)."""
    short = name.rsplit(".", 1)[-1]
    doc = inspect.getdoc(obj)
    if not doc:
        log.warning("%s has no docstring for the Python API page", name)
        doc = ""
    hashes = "#" * level
    if inspect.isclass(obj):
        parts = [f"{hashes} `{short}`", "", f"```python\nclass {signature(short, obj)}\n```", "", markdown_doc(doc)]
        if dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            parts[-1] = "A dataclass (fields in the signature above)."
        for attr, member in vars(obj).items():
            if attr.startswith("_") and attr != "_repr_html_":
                continue
            if isinstance(member, property):
                mdoc = inspect.getdoc(member)
                if not mdoc and strict:
                    log.warning("%s.%s has no docstring for the Python API page", name, attr)
                parts += ["", f"{hashes}# `{short}.{attr}` (property)", "", markdown_doc(mdoc or "")]
            elif inspect.isfunction(member):
                mdoc = inspect.getdoc(member)
                if not mdoc:
                    if attr == "_repr_html_":
                        mdoc = "The object's HTML, which Jupyter shows when it is a cell's result."
                    elif strict:
                        log.warning("%s.%s has no docstring for the Python API page", name, attr)
                parts += ["", f"{hashes}# `{short}.{attr}`", "",
                          f"```python\n{signature(attr, member).replace('(self, ', '(').replace('(self)', '()')}\n```",
                          "", markdown_doc(mdoc or "")]
        return "\n".join(parts)
    return "\n".join([f"{hashes} `{short}`", "", f"```python\n{signature(short, obj)}\n```", "", markdown_doc(doc)])
