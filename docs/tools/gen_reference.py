"""Writes the generated parts of docs/reference/*.md from the code: ``make reference`` (``--check``: only compare).

Each page keeps its hand-written text; what the code knows lies between two markers, and only that is rewritten::

    <!-- generated:NAME start: `make reference` writes this block from the code; edit the code, not the block -->
    ...
    <!-- generated:NAME end -->

* ``cli.md``: every command of ``fleetctl`` and ``fleet-agent`` (the typer apps, walked as click commands: usage,
  help, arguments and options; hidden ones left out), and the exit codes of the error root ``controller.errors``;
* ``configuration.md``: every setting of the pydantic settings models (``[fleet]``, ``[agent]``, ``[controller]``)
  and of the inventory's ``[[module]]``;
* ``metrics.md``: the agent's and the controller's metric catalogs;
* ``http-api.md``: every route of the FastAPI app's OpenAPI schema (the app is built, no server started).

The output depends on the code only: no timestamps, no paths of this machine (a default under the home folder is
written ``~/...``, the host name default "host name"). ``tests/unit/test_reference_docs.py`` regenerates each page in
memory and fails when the file differs. Run with the project's venv (it imports the code).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import pkgutil
import re
import socket
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
HOME = str(Path.home())

# --------------------------------------------------------------------------- Markdown
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def _escape_prose(text: str) -> str:
    text = text.replace("\\", "\\\\")
    for ch in "*[]<>|":
        text = text.replace(ch, "\\" + ch)
    return _LONE_UNDERSCORE.sub(r"\\_", text)


def md(text: str) -> str:
    """Help text as Markdown inline text: code spans kept (a ``|`` in them escaped, for tables), the rest escaped
    so that nothing in it reads as emphasis, a link, HTML or a table's cell border."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_escape_prose(text[pos:m.start()]))
        out.append(m.group(0).replace("|", "\\|"))
        pos = m.end()
    out.append(_escape_prose(text[pos:]))
    return "".join(out)


def code(text: object) -> str:
    """``text`` as a code span (inside a table: a ``|`` escaped)."""
    s = str(text).replace("|", "\\|")
    fence = "``" if "`" in s else "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def one_line(text: str) -> str:
    return " ".join(text.split())


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(one_line(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def paragraphs(text: str | None) -> list[str]:
    """A docstring's paragraphs, each on one line, escaped."""
    if not text:
        return []
    return [md(one_line(p)) for p in re.split(r"\n\s*\n", inspect.cleandoc(text)) if p.strip()]


def first_paragraph(text: str | None) -> str:
    ps = paragraphs(text)
    return ps[0] if ps else ""


def portable(text: str) -> str:
    """A value as it reads on any machine: this one's home folder is ``~``."""
    return text.replace(HOME + "/", "~/") if HOME != "/" else text


def number(v: float) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else repr(v)


# --------------------------------------------------------------------------- blocks and pages
MARK = re.compile(r"<!-- generated:(?P<name>[a-z0-9-]+) start(?P<note>[^>]*)-->\n(?P<body>.*?)"
                  r"<!-- generated:(?P=name) end -->", re.S)
NOTE = ": `make reference` writes this block from the code; edit the code, not the block "


class PageError(Exception):
    """A reference page whose markers do not match what the generator writes (one line: the page and the block)."""


def splice(page: str, text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block replaced by ``blocks[name]``; every block present exactly once."""
    found = [m.group("name") for m in MARK.finditer(text)]
    for name in blocks:
        if found.count(name) != 1:
            raise PageError(f"docs/reference/{page}: block generated:{name} appears {found.count(name)} times "
                            f"(expected once: put back its start and end markers)")
    unknown = sorted(set(found) - set(blocks))
    if unknown:
        raise PageError(f"docs/reference/{page}: unknown block generated:{unknown[0]}")

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        return f"<!-- generated:{name} start{NOTE}-->\n{blocks[name].strip()}\n<!-- generated:{name} end -->"

    return MARK.sub(sub, text)


# --------------------------------------------------------------------------- cli.md
def _click_tree(cmd: Any, ctx: Any) -> Iterable[tuple[Any, Any]]:
    """``(command, context)`` of ``cmd`` and every visible subcommand, depth first, in the order ``--help`` lists."""
    import typer.core

    yield cmd, ctx
    if isinstance(cmd, typer.core.TyperGroup):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _click_tree(sub, type(ctx)(sub, info_name=name, parent=ctx))


def _param_type(p: Any, ctx: Any) -> str:
    if p.param_type_name == "option" and p.is_flag:
        return "flag"
    shown = p.display_type(ctx).strip("<>")
    if "|" in shown:
        return "one of " + ", ".join(code(c) for c in shown.split("|"))
    if p.multiple and shown.startswith("list[") and shown.endswith("]"):
        shown = shown[5:-1]
    if shown.endswith(" range"):
        lo, hi = p.min, p.max
        bounds = " to ".join(number(b) for b in (lo, hi) if b is not None)
        if lo is None:
            bounds = f"≤ {number(hi)}"
        elif hi is None:
            bounds = f"≥ {number(lo)}"
        shown = f"{shown[:-6]}, {bounds}"
    return shown + (", repeatable" if p.multiple else "")


def _param_default(p: Any, ctx: Any) -> str:
    if p.required:
        return "required"
    value = p.get_default(ctx, call=False)
    if p.param_type_name == "option" and p.is_flag:
        if p.secondary_opts and isinstance(value, bool):
            return code((p.opts if value else p.secondary_opts)[0])
        return ""
    if isinstance(value, Enum):
        value = value.value
    if value is None or value == [] or value == ():
        return ""
    if callable(value):
        return "computed"
    if isinstance(value, list | tuple):
        return ", ".join(code(portable(str(v))) for v in value)
    return code(portable(number(value) if isinstance(value, float) else str(value)))


def _param_names(p: Any) -> str:
    if p.param_type_name == "argument":
        return f"{code(p.metavar or p.name)} (argument)"
    return " / ".join(", ".join(code(o) for o in sorted(opts, key=lambda o: o.startswith("--")))
                      for opts in (p.opts, p.secondary_opts) if opts)


def _param_help(p: Any) -> str:
    text = md(one_line(p.help or ""))
    env = p.envvar
    if env:
        names = [env] if isinstance(env, str) else list(env)
        text += f" (environment: {', '.join(code(n) for n in names)})"
    return text.strip()


def command_section(cmd: Any, ctx: Any, level: int) -> str:
    """One command: heading, usage line, help text, arguments and options (``--help`` left out: every command has
    it)."""
    path = ctx.command_path
    out = [f"{'#' * level} `{path}`", "", "```text", f"Usage: {path} {' '.join(cmd.collect_usage_pieces(ctx))}",
           "```", ""]
    for para in paragraphs(cmd.help):
        out += [para, ""]
    rows = [(_param_names(p), _param_type(p, ctx), _param_default(p, ctx), _param_help(p))
            for p in cmd.get_params(ctx) if not p.hidden and p.name != "help"]
    if rows:
        out += [table(("argument or option", "type", "default", "help"), rows), ""]
    return "\n".join(out)


def commands_block(root: Any, prog: str) -> str:
    """Every visible command of one program: an overview table, then a section per command."""
    import typer

    tree = list(_click_tree(root, typer.Context(root, info_name=prog)))
    overview = table(("command", "what it does"),
                     [(f"[{code(ctx.command_path)}](#{_anchor(ctx.command_path)})", first_paragraph(cmd.help))
                      for cmd, ctx in tree[1:]])
    sections = [command_section(cmd, ctx, 3 if i == 0 else 4) for i, (cmd, ctx) in enumerate(tree)]
    return "\n".join([overview, "", *sections])


def _anchor(heading: str) -> str:
    """The anchor MyST gives a heading (GitHub's rule): lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def fleetctl_block() -> str:
    import typer

    from controller.cli.app import build_app

    root = typer.main.get_command(build_app())
    verbs, options = surface(root, "fleetctl")
    count = (f"`fleetctl` has **{verbs} verbs** with **{options} options** (a verb: a command a user runs, a group "
             "that runs by itself as `devices` does counted too; its options: those its help lists but `--help`, "
             "the global ones not counted; the hidden old names of renamed verbs not counted either).")
    return "\n".join([count, "", commands_block(root, "fleetctl")])


def surface(root: Any, prog: str) -> tuple[int, int]:
    """How many verbs a program has and how many options they take, as its help shows them (the surface a user
    learns: issue 50)."""
    import typer
    import typer.core

    verbs = options = 0
    for cmd, _ in list(_click_tree(root, typer.Context(root, info_name=prog)))[1:]:
        if isinstance(cmd, typer.core.TyperGroup) and not cmd.invoke_without_command:
            continue
        verbs += 1
        options += sum(1 for p in cmd.params if p.param_type_name == "option" and not p.hidden and p.name != "help")
    return verbs, options


def fleet_agent_block() -> str:
    import typer

    from agent.cli import app

    return commands_block(typer.main.get_command(app), "fleet-agent")


def controller_error_classes() -> list[type[BaseException]]:
    """Every subclass of the controller's error root, each module of ``controller`` imported first (as
    ``tests/unit/test_error_root.py`` finds them), in the order of their dotted names."""
    import controller
    from controller.errors import FleetctlError

    for info in pkgutil.walk_packages(controller.__path__, "controller."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
    found: dict[str, type[BaseException]] = {}

    def walk(cls: type[BaseException]) -> None:
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        for sub in cls.__subclasses__():
            if sub.__module__.partition(".")[0] == "controller":
                walk(sub)

    walk(FleetctlError)
    return [found[k] for k in sorted(found, key=lambda k: (k != "controller.errors.FleetctlError", k))]


def _doc_line(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    return first_paragraph(doc) if doc else ""


def _public_name(cls: type) -> str:
    """``package.Name`` of a class, private modules of its path left out (``pydantic_core.ValidationError``); a
    built-in by its name alone."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return ".".join([*(part for part in cls.__module__.split(".") if not part.startswith("_")), cls.__qualname__])


def exit_codes_block() -> str:
    from controller.errors import FleetctlError, foreign_user_errors

    rows = []
    for cls in controller_error_classes():
        assert issubclass(cls, FleetctlError)
        parents = ", ".join(code(b.__name__) for b in cls.__bases__)
        rows.append((f"{code(cls.__name__)} ({code(cls.__module__)})", parents, str(cls.exit_code),
                     str(cls.http_status), _doc_line(cls)))
    foreign = [(code(_public_name(kind)),
                "a bug: traceback, exit 2" if exit_code is None else str(exit_code),
                "a bug: 500" if status is None else str(status))
               for kind, exit_code, status in foreign_user_errors()]
    return "\n".join([
        "Every error a user can cause derives from `controller.errors.FleetctlError` and carries its CLI exit code "
        "and its HTTP status (the HTTP API answers `{\"detail\": \"<one line>\"}`):",
        "",
        table(("error", "derives from", "exit code", "HTTP status", "what"), rows),
        "",
        "Errors of other packages a user can cause, mapped once (`controller.errors.foreign_user_errors`, the "
        "first that matches wins):",
        "",
        table(("error", "exit code", "HTTP status"), foreign),
    ])


# --------------------------------------------------------------------------- configuration.md
def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        return f"array of {_type_name(args[0])}s" if args else "array"
    if origin is dict:
        return f"table of {_type_name(get_args(annotation)[1])}s"
    if origin is Literal:
        return " or ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in get_args(annotation))
    names = {str: "string", int: "integer", float: "float", bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _constraints(metadata: Sequence[Any]) -> str:
    import annotated_types as at

    parts = []
    for m in metadata:
        if isinstance(m, at.Gt):
            parts.append(f"> {number(m.gt)}")  # type: ignore[arg-type]
        elif isinstance(m, at.Ge):
            parts.append(f"≥ {number(m.ge)}")  # type: ignore[arg-type]
        elif isinstance(m, at.Lt):
            parts.append(f"< {number(m.lt)}")  # type: ignore[arg-type]
        elif isinstance(m, at.Le):
            parts.append(f"≤ {number(m.le)}")  # type: ignore[arg-type]
        elif isinstance(m, at.MinLen):
            parts.append(f"at least {m.min_length} long")
        elif isinstance(m, at.MaxLen):
            parts.append(f"at most {m.max_length} long")
    return ", ".join(parts)


_SECONDS = ("_limit", "_interval", "_after", "_timeout", "_expires", "_wait", "_grace", "_cooldown", "_warn")


def _human(name: str, description: str, value: int | float) -> str:
    """A large default in the unit a reader thinks in: bytes as KiB/MiB/GiB, seconds as hours or days."""
    if "bytes" in description or name.endswith(("_bytes", "_disk")):
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value >= size and value % size == 0:
                return f" ({int(value // size)} {unit})"
    if name.endswith(_SECONDS) and value >= 3600:
        if value % 86400 == 0:
            return f" ({int(value // 86400)} d)"
        h, rest = divmod(int(value), 3600)
        return f" ({h} h)" if not rest else f" ({h} h {rest // 60} min)" if rest % 60 == 0 else ""
    return ""


def setting_default(name: str, field: Any) -> str:
    from pydantic_core import PydanticUndefined

    from contract.settings import DEFAULT_HOME

    if field.default_factory is not None:
        if field.default_factory is socket.gethostname:
            return "host name"
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "none"
    if value == DEFAULT_HOME:
        return f"{code('~/.local/share/m1000-fleet')} ({code('$XDG_DATA_HOME/m1000-fleet')} when that is set)"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, int | float):
        return code(number(value)) + _human(name, field.description or "", value)
    if isinstance(value, list | tuple | dict) and not value:
        return "empty"
    return code(portable(str(value)))


def settings_table(model: Any, names: Iterable[str], section: str, env: bool = True) -> str:
    from contract.settings import _wants_json

    rows = []
    for name in names:
        field = model.model_fields[name]
        kind = _type_name(field.annotation)
        limits = _constraints(field.metadata)
        variable = ""
        if env:
            variable = code(model.env_var(name)) + (" (JSON)" if _wants_json(field.annotation) else "")
        row = [code(f"{section} {name}" if section else name), kind + (f", {limits}" if limits else ""),
               setting_default(name, field)]
        rows.append((*row, variable, md(one_line(field.description or ""))) if env else
                    (*row, md(one_line(field.description or ""))))
    headers = ("setting", "type", "default", "variable", "meaning") if env else ("key", "type", "default", "meaning")
    return table(headers, rows)


def settings_block() -> str:
    from agent.settings import AgentSettings
    from contract.settings import BrokerSettings
    from controller.settings import ControllerSettings

    out = []
    shared = list(BrokerSettings.model_fields)
    for model, where in ((BrokerSettings, "contract/settings.py"), (AgentSettings, "agent/settings.py"),
                         (ControllerSettings, "controller/settings.py")):
        section = f"[{model.config_section}]"
        names = [n for n in model.model_fields if model is BrokerSettings or n not in shared]
        out += [f"### `{section}`", "", f"{code(model.__name__)} in `{where}`: {_doc_line(model)}", "",
                settings_table(model, names, section), ""]
    return "\n".join(out)


def inventory_block() -> str:
    from controller.inventory import Module

    return "\n".join([f"{code(Module.__name__)} in `controller/inventory.py`: {_doc_line(Module)}", "",
                      settings_table(Module, Module.model_fields, "", env=False)])


# --------------------------------------------------------------------------- metrics.md
def _metrics_table(specs: Iterable[Any], extra: dict[str, str] | None = None) -> str:
    headers = ["metric", "type", "labels", "unit", "meaning"] + (["DCGM exporter field"] if extra is not None else [])
    rows = []
    for s in specs:
        row = [code(s.name), s.type, ", ".join(s.labels) or "-", s.unit, md(s.help)]
        if extra is not None:
            field, _, note = extra[s.name].partition(" ")
            row.append(f"{code(field)} {md(note)}".strip() if field.startswith("DCGM_") else md(extra[s.name]))
        rows.append(row)
    return table(headers, rows)


def agent_metrics_block() -> str:
    from agent.metrics import CATALOG
    from agent.telemetry.exposition import DEVICE_METRICS

    device = {m.name for m in DEVICE_METRICS}
    return _metrics_table(s for s in CATALOG if s.name not in device)


def device_metrics_block() -> str:
    from agent.metrics import SPECS
    from agent.telemetry.exposition import DEVICE_METRICS

    return _metrics_table((SPECS[m.name] for m in DEVICE_METRICS), {m.name: m.dcgm for m in DEVICE_METRICS})


def controller_metrics_block() -> str:
    from controller.serve.metrics import CATALOG

    return _metrics_table(CATALOG)


# --------------------------------------------------------------------------- http-api.md
def openapi() -> tuple[dict[str, Any], str]:
    """The API's OpenAPI schema and its own URL, from an app built with default settings (no server, no token
    file: the schema depends on neither)."""
    from controller.serve.api import create_app
    from controller.serve.tokens import MIN_TOKEN_LENGTH, Identity, Role, Tokens
    from controller.settings import ControllerSettings

    tokens = Tokens.of(("x" * MIN_TOKEN_LENGTH, Identity("x", Role.read)))
    app = create_app(ControllerSettings.model_construct(), tokens)
    return app.openapi(), str(app.openapi_url)


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def schema_type(s: dict[str, Any]) -> str:
    """A JSON schema as a short type: ``string``, ``integer, 1 to 500``, ``array of Run``, ``string or null``..."""
    if "$ref" in s:
        name = _ref_name(s["$ref"])
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in s:
        return " or ".join(schema_type(a) for a in s["anyOf"])
    if "enum" in s:
        return "one of " + ", ".join(code(v) for v in s["enum"])
    kind = s.get("type", "any")
    if kind == "array":
        text = f"array of {schema_type(s.get('items', {}))}"
    elif kind == "object" and isinstance(s.get("additionalProperties"), dict):
        text = f"object of {schema_type(s['additionalProperties'])}"
    else:
        text = str(kind)
    limits = []
    if "minimum" in s or "maximum" in s:
        limits.append(" to ".join(number(s[k]) for k in ("minimum", "maximum") if k in s))
        if "minimum" not in s:
            limits[-1] = f"≤ {limits[-1]}"
        elif "maximum" not in s:
            limits[-1] = f"≥ {limits[-1]}"
    if "exclusiveMinimum" in s:
        limits.append(f"> {number(s['exclusiveMinimum'])}")
    if "exclusiveMaximum" in s:
        limits.append(f"< {number(s['exclusiveMaximum'])}")
    if "minLength" in s or "maxLength" in s:
        limits.append(f"{s.get('minLength', 0)} to {s['maxLength']} long" if "maxLength" in s
                      else f"at least {s['minLength']} long")
    if "pattern" in s:
        limits.append(f"matching {code(s['pattern'])}")
    return text + (f" ({', '.join(limits)})" if limits else "")


def _default(s: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in s:
        return ""
    v = s["default"]
    return code("null" if v is None else str(v).lower() if isinstance(v, bool) else v)


def _media(content: dict[str, Any]) -> str:
    parts = []
    for media, spec in sorted(content.items()):
        schema = spec.get("schema")
        parts.append(f"{code(media)} {schema_type(schema)}" if schema else code(media))
    return "; ".join(parts)


def role_of(op: dict[str, Any]) -> str:
    """The role a route declares (its ``x-role``), and the one another user's work needs where it says."""
    role = f"role {code(op['x-role'])}" if "x-role" in op else ""
    return role + (f" (another user's work: {code(op['x-role-others'])})" if "x-role-others" in op else "")


def route_section(path: str, method: str, op: dict[str, Any], schemas: dict[str, Any]) -> str:
    out = [f"### `{method.upper()} {path}`", "", f"**{md(op.get('summary', ''))}.** "
           + " ".join(paragraphs(op.get("description")))]
    auth = f"bearer token (`Authorization: Bearer <token>`), {role_of(op)}" if op.get("security") else "none"
    out += ["", f"Auth: {auth}.", ""]
    params = op.get("parameters", [])
    if params:
        out += [table(("parameter", "in", "type", "default", "meaning"),
                      [(code(p["name"]), p["in"], schema_type(p.get("schema", {})),
                        _default(p.get("schema", {}), p.get("required", False)),
                        md(one_line(p.get("description", p.get("schema", {}).get("description", "")))))
                       for p in params]), ""]
    body = op.get("requestBody")
    if body:
        for media, spec in sorted(body["content"].items()):
            ref = spec["schema"].get("$ref")
            out += [f"Request body ({code(media)}, {schema_type(spec['schema'])}"
                    f"{', required' if body.get('required') else ''}):", ""]
            if ref:
                out += [fields_table(schemas[_ref_name(ref)]), ""]
    out += [table(("status", "meaning", "body"),
                  [(code(status), md(r.get("description", "")), _media(r.get("content", {})))
                   for status, r in sorted(op.get("responses", {}).items())]), ""]
    return "\n".join(out)


def fields_table(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", ()))
    return table(("field", "type", "default", "meaning"),
                 [(code(name), schema_type(s), _default(s, name in required), md(one_line(s.get("description", ""))))
                  for name, s in schema.get("properties", {}).items()])


def http_block() -> str:
    spec, schema_url = openapi()
    schemas = spec.get("components", {}).get("schemas", {})
    routes = [(path, method, op) for path, ops in spec["paths"].items() for method, op in ops.items()]
    overview = [(f"[{code(f'{m.upper()} {p}')}](#{_anchor(f'{m.upper()} {p}')})",
                 f"bearer token, {role_of(op)}" if op.get("security") else "none",
                 first_paragraph(op.get("description")))
                for p, m, op in routes]
    overview.append((code(f"GET {schema_url}"), "none", "The OpenAPI schema of these routes."))
    out = [f"{md(spec['info']['title'])}, version {code(spec['info']['version'])}: "
           + " ".join(paragraphs(spec["info"].get("description"))), "",
           table(("route", "auth", "what"), overview), ""]
    out += [route_section(p, m, op, schemas) for p, m, op in routes]
    out += ["### Schemas", ""]
    for name in sorted(schemas):
        s = schemas[name]
        out += [f"#### {name}", ""]
        if "properties" in s:
            out += [fields_table(s), ""]
        else:
            out += [schema_type(s), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- the pages
PAGES: dict[str, dict[str, Callable[[], str]]] = {
    "cli.md": {"exit-codes": exit_codes_block, "fleetctl": fleetctl_block, "fleet-agent": fleet_agent_block},
    "configuration.md": {"settings": settings_block, "inventory": inventory_block},
    "metrics.md": {"agent-metrics": agent_metrics_block, "device-metrics": device_metrics_block,
                   "controller-metrics": controller_metrics_block},
    "http-api.md": {"routes": http_block},
}


def render(page: str, text: str) -> str:
    """``text`` (the page as it is) with its generated blocks written afresh from the code."""
    return splice(page, text, {name: make() for name, make in PAGES[page].items()})


def generate(root: Path = REFERENCE) -> dict[str, tuple[str, str]]:
    """Each page as it is and as the code gives it."""
    out = {}
    for page in PAGES:
        text = (root / page).read_text(encoding="utf-8")
        out[page] = (text, render(page, text))
    return out


def stale_message(page: str, text: str, fresh: str) -> str:
    """The one line that says a page is stale, then a unified diff of what the code would change in it."""
    diff = "".join(difflib.unified_diff(text.splitlines(True), fresh.splitlines(True), f"docs/reference/{page}",
                                        "generated", n=1))
    return f"docs/reference/{page} is stale: run `make reference`\n{diff}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    try:
        pages = generate()
    except PageError as exc:
        print(f"gen_reference: error: {exc}", file=sys.stderr)
        return 2
    changed = [page for page, (text, fresh) in pages.items() if fresh != text]
    for page in changed:
        text, fresh = pages[page]
        if args.check:
            print(stale_message(page, text, fresh), file=sys.stderr)
        else:
            (REFERENCE / page).write_text(fresh, encoding="utf-8")
            print(f"wrote docs/reference/{page}")
    if not changed:
        print("docs/reference: every generated block is up to date")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
