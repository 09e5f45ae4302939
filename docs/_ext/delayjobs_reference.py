"""Reference pages generated from the code when the docs build, so that they cannot rot.

Writes Markdown into ``reference/_generated/`` (included by the reference pages) before
Sphinx reads any page:

- ``settings.md``: every row of ``delayjobs.conf.SETTINGS``: its default, its values and
  what it does;
- ``commands.md``: every management command of delayjobs, from its own argparse parser;
- ``checks.md``: every system check id found in the package's source, with its messages,
  and those of the settings table (one per setting);
- ``http-api.md`` and ``extra/openapi.json``: the HTTP API's OpenAPI document, rendered;

and fails the build if a signal of ``delayjobs.signals`` is missing from its page.
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

DOCS = Path(__file__).resolve().parent.parent
PACKAGE = DOCS.parent / "delayjobs"
GENERATED = DOCS / "reference" / "_generated"
CHECK_ID = re.compile(r"^delayjobs\.[EW]\d{3}$")
#: Options every Django command has; the reference lists each command's own.
BASE_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("env-check-consistency", check_signals_documented)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def generate(app: Sphinx) -> None:
    (GENERATED / "extra").mkdir(parents=True, exist_ok=True)
    write(GENERATED / "settings.md", settings_reference())
    write(GENERATED / "commands.md", commands_reference())
    write(GENERATED / "checks.md", checks_reference())
    document = openapi_document()
    write(GENERATED / "extra" / "openapi.json", json.dumps(document, indent=2) + "\n")
    write(GENERATED / "http-api.md", openapi_reference(document))


def write(path: Path, text: str) -> None:
    # Rewritten only when changed, so that an incremental build does not re-read the pages.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def cell(text: str) -> str:
    """Text fit for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# Settings ------------------------------------------------------------------------------


def settings_reference() -> str:
    """One row per row of ``delayjobs.conf.SETTINGS``: the table the code reads them by."""
    from delayjobs.conf import SETTINGS

    rows = [
        "| setting | default | values | what it does |",
        "| --- | --- | --- | --- |",
    ]
    for setting in SETTINGS:
        rows.append(
            f"| `{setting.name}` | `{show_default(setting.default)}` "
            f"| {cell(setting.kind.expected())} | {cell(setting.doc)} |"
        )
    return "\n".join(rows) + "\n"


def show_default(value: Any) -> str:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if seconds >= 86400:
            return f"{value.days} days"
        return f"{seconds:g} s" if seconds < 60 else f"{seconds / 60:g} min"
    return repr(value)


# Management commands -------------------------------------------------------------------


def commands_reference() -> str:
    from django.core.management import load_command_class

    names = sorted(p.stem for p in (PACKAGE / "management" / "commands").glob("[!_]*.py"))
    parts = []
    for name in names:
        command = load_command_class("delayjobs", name)
        parser = command.create_parser("manage.py", name)
        usage = " ".join(parser.format_usage().split())
        parts.append(f"## `{name}`\n\n{command.help}\n\n```text\n{usage}\n```\n")
        rows = [
            f"| `{', '.join(action.option_strings) or action.dest}` | {cell(describe(action))} |"
            for action in parser._actions
            if action.dest not in BASE_OPTIONS
        ]
        if rows:
            parts.append("| option | meaning |\n| --- | --- |\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def describe(action: Any) -> str:
    text = action.help or ""
    if action.choices:
        text += f" One of: {', '.join(map(str, action.choices))}."
    takes_value = action.nargs != 0  # flags (store_true/store_false) have no default to show
    if takes_value and action.default not in (None, [], "==SUPPRESS==") and action.option_strings:
        text += f" Default: `{action.default}`."
    return text % {"default": action.default, "prog": "manage.py"} if "%(" in text else text


# System checks -------------------------------------------------------------------------


def checks_reference() -> str:
    from delayjobs.conf import SETTINGS

    messages: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    hints: dict[str, str] = {}
    for setting in SETTINGS:
        message = f"DELAYJOBS['{setting.name}'] must be {setting.kind.expected()}; got …."
        messages[setting.check_id].append(("Error", message, setting.hint, "delayjobs.conf"))
        hints.setdefault(setting.check_id, setting.hint)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if found := check_call(node):
                check_id, level, message, hint = found
                if hint == "…":  # a check of settings together gives its row's hint
                    hint = hints.get(check_id, hint)
                module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
                messages[check_id].append((level, message, hint, module))
    if not messages:
        raise ExtensionError("no system check ids found in delayjobs/")
    rows = ["| id | level | message | hint | checked in |", "| --- | --- | --- | --- | --- |"]
    for check_id in sorted(messages):
        for level, message, hint, module in messages[check_id]:
            rows.append(
                f"| `{check_id}` | {level} | {cell(message)} | {cell(hint) or '-'} | `{module}` |"
            )
    return "\n".join(rows) + "\n"


def check_call(node: ast.AST) -> tuple[str, str, str, str] | None:
    """(id, level, message, hint) of a ``checks.Error(...)``-like call with a literal id."""
    if not isinstance(node, ast.Call):
        return None
    keywords = {keyword.arg: keyword.value for keyword in node.keywords}
    check_id = keywords.get("id")
    if not (isinstance(check_id, ast.Constant) and CHECK_ID.match(str(check_id.value))):
        return None
    level = ast.unparse(node.func).rsplit(".", 1)[-1]
    message = literal_text(node.args[0] if node.args else keywords.get("msg"))
    return str(check_id.value), level, message, literal_text(keywords.get("hint"))


def literal_text(node: ast.AST | None) -> str:
    """The text of a string literal; an f-string's holes become "…"."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(literal_text(v) if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp):  # "..." % {...} or "a" + "b"
        right = literal_text(node.right) if isinstance(node.op, ast.Add) else ""
        return literal_text(node.left) + right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # "...".format()
        return literal_text(node.func.value)
    if isinstance(node, ast.Call) and node.args:  # _("...")
        return literal_text(node.args[0])
    return "…"


# HTTP API ------------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    from delayjobs.http.app import api

    # ninja's document, as the API serves it (a round trip through JSON, as a client reads it).
    return json.loads(json.dumps(api.get_openapi_schema()))


def openapi_reference(document: dict[str, Any]) -> str:
    schemas = document.get("components", {}).get("schemas", {})
    info = document["info"]
    parts = [f"OpenAPI {document['openapi']}, {info['title']} {info['version']}.\n"]
    for route, operations in document["paths"].items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            parts.append(f"### `{method.upper()} {route}`\n")
            if summary := operation.get("summary"):
                parts.append(f"**{summary}**\n")
            if description := operation.get("description"):
                parts.append(f"{description}\n")
            if permissions := operation.get("x-permissions"):
                parts.append(f"Needs {' and '.join(f'`{name}`' for name in permissions)}.\n")
            parts.extend(parameters_table(operation.get("parameters", [])))
            parts.extend(request_body_table(operation.get("requestBody"), schemas))
            parts.append("| status | response |\n| --- | --- |")
            for status, response in operation["responses"].items():
                response = resolve(response, document)
                parts.append(f"| {status} | {cell(response.get('description', ''))} |")
            parts.append("")
    return "\n".join(parts)


def parameters_table(parameters: list[dict[str, Any]]) -> list[str]:
    if not parameters:
        return []
    rows = ["| parameter | in | required | type | meaning |", "| --- | --- | --- | --- | --- |"]
    for parameter in parameters:
        schema = parameter.get("schema", {})
        rows.append(
            f"| `{parameter['name']}` | {parameter['in']} | {parameter.get('required', False)} "
            f"| {cell(schema_type(schema))} | {cell(parameter.get('description', ''))} |"
        )
    return [*rows, ""]


def request_body_table(body: dict[str, Any] | None, schemas: dict[str, Any]) -> list[str]:
    if not body:
        return []
    schema = body.get("content", {}).get("application/json", {}).get("schema", {})
    schema = schemas.get(schema.get("$ref", "").rsplit("/", 1)[-1], schema)
    properties = schema.get("properties", {})
    if not properties:
        return [f"Request body: {cell(schema_type(schema))}.\n"]
    required = set(schema.get("required", []))
    rows = ["| body field | required | type | meaning |", "| --- | --- | --- | --- |"]
    for name, field in properties.items():
        rows.append(
            f"| `{name}` | {name in required} | {cell(schema_type(field))} "
            f"| {cell(field.get('description', ''))} |"
        )
    return [*rows, ""]


def schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:  # pydantic's optional fields: the type, or null
        return " or ".join(schema_type(choice) for choice in schema["anyOf"])
    kind = schema.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    limits = ("minimum", "maximum", "maxLength", "maxItems")
    bounds = [f"{k} {schema[k]}" for k in limits if k in schema]
    if "enum" in schema:
        bounds.append("one of " + ", ".join(map(str, schema["enum"])))
    if "format" in schema:
        bounds.append(schema["format"])
    return kind + (f" ({'; '.join(bounds)})" if bounds else "")


def resolve(item: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in item:
        target: Any = document
        for part in item["$ref"].lstrip("#/").split("/"):
            target = target[part]
        item = target
    return item


# Signals -------------------------------------------------------------------------------


def check_signals_documented(app: Sphinx, env: Any) -> None:
    from django.dispatch import Signal

    from delayjobs import signals

    page = (DOCS / "reference" / "signals.md").read_text()
    names = [name for name, value in vars(signals).items() if isinstance(value, Signal)]
    missing = [name for name in names if f"`{name}`" not in page]
    if missing:
        raise ExtensionError(f"reference/signals.md does not document {', '.join(missing)}")
