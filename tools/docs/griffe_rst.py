"""griffe extension: the reStructuredText left in the Google-style docstrings, made Markdown.

The docstrings are Google style (``Args:``, ``Returns:``, ``Raises:``) with Sphinx roles and a
few reST constructs that Markdown would show as they are written. Before griffe parses a
docstring, this rewrites, in its text only (the sources are not touched):

* ``:func:`x```, ``:class:`~a.b.C```, ``:mod:`.x``` ... -> `` `x` ``, `` `C` ``, `` `.x` `` (a code
  span: a role's target is often relative or a lazy name that no page defines, so no link);
* a paragraph ending in ``::`` (a reST literal block follows, indented) -> ending in ``:``; a
  line that is only ``Example::`` keeps its colon escaped so that it is not read as a section;
* a reST simple table (``====  ====`` borders) -> a fenced text block, as it was laid out, its
  inline literals without their backquotes (padded, so the columns stay aligned);
* ``a, b, c: description`` in an ``Args:`` section (one entry for several parameters, which
  griffe would take for one parameter named ``a, b, c``) -> one entry per parameter.

Two short lists name the docstrings that do not follow the rules on purpose, each entry saying
why: in :data:`FREE_FORM` one section is not Google style, and becomes a bulleted list (one
bullet per entry line) that griffe leaves as text; in :data:`ARGS_OF_CALL` the ``Args:`` describe
``__call__``, not the signature shown, so griffe does not check them against it. Every other
griffe warning stays an error of the build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|ref|doc):`([^`]+)`")
_BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")
_INLINE = re.compile(r"``([^`]+)``")  # inline literal; in a table's text block, the text padded to its width
_LONE_TITLE = re.compile(r"^(\s*)([\w][\s\w-]*)::\s*$")
_ARGS = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters):\s*$")
_SECTION = re.compile(r"^(\s*)(Attributes|Args|Arguments|Parameters|Keys):\s*$")
_GROUPED = re.compile(r"^(\s+)(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)+)(\s*(?:\([^)]*\))?:(?:\s.*)?)$")

# object path -> why its docstring's sections are not Google style (their warnings are silenced)
FREE_FORM: dict[str, str] = {
    "hydragnn.train.config_training.TrainingConfig": (
        "its Attributes section lists JSON keys with defaults, several per line "
        "('num_epoch [10], batch_size [32], ...'), not 'name: description' entries"
    ),
}

# object path -> why its Args section does not describe its own signature (not checked against it)
ARGS_OF_CALL: dict[str, str] = {
    "hydragnn.infer.lammps_potentials.LammpsPotential": (
        "a Protocol: its docstring documents the __call__ that implementations provide"
    ),
}


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    explicit = re.match(r"^(.*?)\s*<([^>]+)>$", target)
    if explicit:  # :class:`text <target>`
        return f"`{explicit.group(1)}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _tables(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _BORDER.match(lines[i]):
            # the bottom border is the first one after the top that ends the paragraph (a
            # border below a header row is followed by the first row)
            ends = [
                j
                for j in range(i + 1, len(lines))
                if _BORDER.match(lines[j]) and (j + 1 == len(lines) or not lines[j + 1].strip())
            ]
            if ends:
                end = ends[0]
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                table = [_INLINE.sub(lambda m: m.group(1) + "    ", row) for row in lines[i : end + 1]]
                out += [f"{indent}```text", *table, f"{indent}```"]
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return out


def _split_grouped(lines: list[str]) -> list[str]:
    """One entry per parameter for ``a, b: text`` entries of an ``Args:`` section."""
    out: list[str] = []
    section_indent: int | None = None  # indentation of the Args: header while inside it
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _ARGS.match(line)
        indent = len(line) - len(line.lstrip())
        if header:
            section_indent = len(header.group(1))
        elif line.strip() and section_indent is not None and indent <= section_indent:
            section_indent = None
        grouped = _GROUPED.match(line) if section_indent is not None else None
        if grouped and len(grouped.group(1)) > section_indent:
            item_indent = len(grouped.group(1))
            end = i + 1
            while end < len(lines) and (
                not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > item_indent
            ):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():
                end -= 1
            for name in re.split(r"\s*,\s*", grouped.group(2)):
                out += [f"{grouped.group(1)}{name}{grouped.group(3)}", *lines[i + 1 : end]]
            i = end
            continue
        out.append(line)
        i += 1
    return out


def _section_as_list(lines: list[str]) -> list[str]:
    """A free-form section (``Attributes:`` followed by indented lines) as a Markdown list."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        header = _SECTION.match(lines[i])
        if not header:
            out.append(lines[i])
            i += 1
            continue
        indent = len(header.group(1))
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        body = [line for line in lines[i + 1 : end] if line.strip()]
        item = min(len(line) - len(line.lstrip()) for line in body) if body else 0
        pad = header.group(1)
        out += [f"{pad}**{header.group(2)}**", ""]
        for line in body:
            deeper = len(line) - len(line.lstrip()) > item
            out.append(f"{pad}{'  ' if deeper else '- '}{line.strip()}")
        out.append("")
        i = end
    return out


def markdown_docstring(text: str, free_form: bool = False) -> str:
    """``text`` with the reST constructs above rewritten."""
    text = _ROLE.sub(_role, text)
    lines = []
    for line in text.split("\n"):
        lone = _LONE_TITLE.match(line)
        if lone:
            line = f"{lone.group(1)}{lone.group(2)}\\:"
        elif line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
        lines.append(line)
    lines = _split_grouped(_tables(lines))
    return "\n".join(_section_as_list(lines) if free_form else lines)


class RstToMarkdown(griffe.Extension):
    """Rewrites each docstring once, when its object is created (before it is parsed)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        obj.docstring.value = markdown_docstring(obj.docstring.value, free_form=obj.path in FREE_FORM)
        if obj.path in ARGS_OF_CALL:
            obj.docstring.parser_options = {**obj.docstring.parser_options, "warn_unknown_params": False}
