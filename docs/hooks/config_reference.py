"""The config reference's key tables, generated from the pydantic schema: committed in the page, checked as
the site is built (an MkDocs hook), rewritten by `python docs/hooks/config_reference.py`.

Between a line `<!-- config-keys: TABLE -->` and the next `<!-- /config-keys -->` stands the table of TABLE's
keys (type, default, meaning) as `describe_fields()` and the models of engine/config/schema.py give them; a
reader of the docs folder sees it as the site does, and tests/test_docs.py fails when it drifts from the code.
"""
from __future__ import annotations

import enum
import html
import re
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"^<!-- config-keys: (?P<table>[\w ]+) -->\n(?P<body>.*?)^<!-- /config-keys -->$",
                    re.MULTILINE | re.DOTALL)
END = "<!-- /config-keys -->"
PAGE = "docs/reference/config.md"
# A marker's short name -> describe_fields()'s name of the table, where they differ.
NAMES = {"top": "(top level)", "pipelines": "pipelines / defaults"}
CODE_SPAN = re.compile(r"(`[^`]*`)")


def models() -> dict[str, type[BaseModel]]:
    """Each table of describe_fields() (by its marker name) and the pydantic model that defines its keys."""
    from torchherd.engine.config.schema import TABLES, Pipeline, RunConfig

    nested = {k: m for k, m in TABLES.items() if k not in ("pipelines", "defaults")}  # [defaults]: pipelines' keys
    return {"top": RunConfig, "pipelines": Pipeline, **nested}


def render(markdown: str) -> str:
    """`markdown` with every marked table as the schema gives it now; an unknown table name is an error,
    never a gap."""
    return MARKER.sub(lambda m: f"<!-- config-keys: {m['table']} -->\n\n{key_table(m['table'])}\n\n{END}", markdown)


def key_table(table: str) -> str:
    """The markdown table of one config table's keys: key, type, default, meaning."""
    from torchherd.engine.config.schema import describe_fields

    described = describe_fields().get(NAMES.get(table, table))
    if described is None or table not in models():
        raise ValueError(f"config-keys: no config table {table!r} (tables: {', '.join(models())})")
    fields = {f.alias or name: f for name, f in models()[table].model_fields.items()}
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, description in described.items():
        field = fields[key]
        rows.append(f"| `{key}` | {type_of(field.annotation, field.metadata)} | {default_of(field)} | "
                    f"{prose(description)} |")
    return "\n".join(rows)


def type_of(annotation: Any, metadata: list[Any] = ()) -> str:
    """A key's type as TOML sees it, with its bounds: int ≥ 1, `"min"` or `"max"`, table."""
    bounds = [b for b in map(_bound, metadata) if b]
    return " ".join([_type(annotation), ", ".join(bounds)]).strip().replace(" at least", ", at least")


def _type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(f'`{_toml(a)}`' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args if a is not type(None))
    if origin is list:
        return f"array of {_type(args[0])}s" if args else "array"
    if origin is dict:
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(f'`{_toml(m)}`' for m in annotation)
    names = {bool: "bool", int: "int", float: "float", str: "string"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bound(meta: Any) -> str:
    for kind, sign in ((annotated_types.Ge, "≥"), (annotated_types.Gt, ">"), (annotated_types.Le, "≤"),
                       (annotated_types.Lt, "<"), (annotated_types.MinLen, "at least")):
        if isinstance(meta, kind):
            value = getattr(meta, next(iter(kind.__dataclass_fields__)))
            return html.escape(f"{sign} {value}")
    return ""


def default_of(field: Any) -> str:
    """The key's default as it would be written in TOML; "required" when it has none, "unset" for None."""
    if field.default_factory is not None:
        value = field.default_factory()
        return "table" if isinstance(value, BaseModel) else f"`{_toml(value)}`"
    if field.default is PydanticUndefined:
        return "required"
    return "unset" if field.default is None else f"`{_toml(field.default)}`"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def prose(text: str) -> str:
    """A description as one table cell: outside code spans, `<`, `>` and `*` are text, never HTML or emphasis;
    `|` never ends the cell."""
    parts = CODE_SPAN.split(text)
    out = [p if p.startswith("`") else html.escape(p, quote=False).replace("*", r"\*") for p in parts]
    return "".join(out).replace("|", r"\|").replace("\n", " ")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs' event for each page's markdown, before it is rendered: a page whose tables are not the schema's
    fails the build, naming the command that rewrites them."""
    rendered = render(markdown)
    if rendered != markdown:
        page = kwargs.get("page")
        where = getattr(getattr(page, "file", None), "src_path", "a page")
        raise ValueError(f"{where}: its config-keys tables differ from the schema; "
                         "`python docs/hooks/config_reference.py` rewrites them")
    return markdown


if __name__ == "__main__":  # rewrite the committed tables from the schema
    import pathlib

    page = pathlib.Path(__file__).resolve().parents[2] / PAGE
    before = page.read_text()
    after = render(before)
    page.write_text(after)
    print(f"{PAGE}: {'rewritten' if after != before else 'already the schema'}")
