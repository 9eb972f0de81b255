"""Reference pages for every installed optimizer and scheduler, from the registry.

The mkdocs hook (``docs/hooks.py``) calls :func:`reference_pages` on every
build, so the reference is whatever ``optcore list`` sees in the environment
that builds the site: a new plugin gets its page, a renamed field changes its
table, and nothing is written by hand. To look at the markdown without
building the site::

    python docs/gen_reference.py --out /tmp/reference

What a page holds comes from :func:`optcore.cli.describe` (the data behind
``optcore show``): origin, qualified name, shadowing, capability flags, the
schema's fields with defaults and constraints, and the class docstring.

One page per *name*: a name several providers ship (``Lion`` from lion-pytorch,
pytorch_optimizer, torch-optimi and the optcore-lion plugin) gets one page
with a section per provider, in resolution order, because "which Lion does
``type: Lion`` give me?" is the question the page answers. A package that
ships many optimizers (pytorch_optimizer's ~40) gets one page with a section
each instead of one page per class, unless the name also has a page of its own.
A provider that cannot be imported is left out with a note on the index page.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: a package shipping more optimizers than this gets one page, not one per class
GROUP_THRESHOLD = 6

FLAG_MEANINGS = {
    "supports_memory_efficient_fp16": "steps fp16/bf16 parameters itself, computing in fp32",
    "supports_step_with_scale": "`step(scale=s)` folds `1/s` into the update (no separate unscale pass)",
    "supports_flat_params": "works on one flat contiguous parameter",
    "supports_groups": "`step(groups=...)` steps only the selected param groups",
    "sharding": "how the update couples elements (elementwise, factored, per_tensor, global, unknown): where a shard can step alone",
}

SOURCE_WORDS = {
    "torch": "torch.optim",
    "package": "an installed package",
    "plugin": "a plugin distribution",
    "user": "a `register_optimizer` call",
    "builtin": "optcore's built-in schedules",
}


GENERATED = "<!-- generated from optcore's registry by docs/gen_reference.py; do not edit -->"


@dataclass
class Page:
    """One generated markdown page: where it goes in the docs and the nav."""

    path: str  # relative to docs/, e.g. "reference/optimizers/adamw.md"
    title: str
    markdown: str
    section: str = ""  # nav group under "Optimizers" / "Schedulers"


@dataclass
class Reference:
    pages: list[Page] = field(default_factory=list)
    #: (qualified name, source, error) of providers that could not be described
    skipped: list[tuple[str, str, str]] = field(default_factory=list)

    def nav(self) -> list[Any]:
        """mkdocs ``nav`` entries: Optimizers and Schedulers, each an index then groups."""
        out: list[Any] = []
        for kind, title in (("optimizers", "Optimizers"), ("schedulers", "Schedulers")):
            pages = [p for p in self.pages if p.path.startswith(f"reference/{kind}/")]
            items: list[Any] = [p.path for p in pages if not p.section]
            groups: dict[str, list[Any]] = {}
            for p in pages:
                if p.section:
                    groups.setdefault(p.section, []).append({p.title: p.path})
            items += [{name: entries} for name, entries in groups.items()]
            out.append({title: items})
        return out


# ------------------------------------------------------------------ helpers
def slug(text: str) -> str:
    """A file name / anchor: lower case, runs of other characters become ``-``."""
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-") or "x"


def escape(text: str) -> str:
    """Markdown-escape prose for a table cell, leaving `code spans` alone."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            out.append(re.sub(r"([\\*_\[\]|#])", r"\\\1", part))
    return "".join(out)


def code(text: Any) -> str:
    """An inline code span that survives backticks and pipes inside a table."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def fenced(text: str, lang: str = "text", indent: str = "") -> str:
    """A fenced block whose fence is longer than any backtick run in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = "\n".join((indent + line) if line.strip() else "" for line in text.splitlines())
    return f"{indent}{fence}{lang}\n{body}\n{indent}{fence}"


def _num(x: Any) -> str:
    return repr(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else repr(x)


def constraints(prop: dict[str, Any]) -> str:
    """Human-readable constraints of one JSON Schema property (``[0, 1)``, ``>= 0``, ``one of ...``)."""
    if "anyOf" in prop:
        parts = [constraints(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return "; ".join(p for p in parts if p)
    if "enum" in prop:
        return "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return f"= {json.dumps(prop['const'])}"
    if "prefixItems" in prop:
        items = [constraints(p) for p in prop["prefixItems"]]
        if items and all(i == items[0] for i in items):
            return f"each {items[0]}" if items[0] else ""
        return ", ".join(f"[{i}] {c}" for i, c in enumerate(items) if c)
    if "items" in prop and isinstance(prop["items"], dict):
        inner = constraints(prop["items"])
        return f"each {inner}" if inner else ""
    low = high = None
    for key, bound in (("minimum", "["), ("ge", "["), ("exclusiveMinimum", "("), ("gt", "(")):  # ge/gt: pydantic
        if key in prop:  # writes these where a constraint sits outside the field's own Field(...)
            low = (bound, prop[key])
    for key, bound in (("maximum", "]"), ("le", "]"), ("exclusiveMaximum", ")"), ("lt", ")")):
        if key in prop:
            high = (bound, prop[key])
    if low and high:
        return f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {_num(high[1])}"
    out = []
    if "minLength" in prop:
        out.append(f"length >= {prop['minLength']}")
    if "pattern" in prop:
        out.append(f"matches {prop['pattern']}")
    return ", ".join(out)


_JSON_TYPES = {"number": "float", "integer": "int", "boolean": "bool", "string": "str", "null": "None", "object": "dict"}


def type_name(prop: dict[str, Any], fallback: str) -> str:
    """The field's type as a Python reader expects (``tuple[float, float]``, ``float | None``)."""
    if _ref_name(prop):
        return _ref_name(prop)  # type: ignore[return-value]
    if "anyOf" in prop:
        names = [type_name(p, "") for p in prop["anyOf"]]
        return " | ".join(n for n in names if n) if all(names) else fallback
    if "enum" in prop:
        return "Literal[" + ", ".join(json.dumps(v) for v in prop["enum"]) + "]"
    if prop.get("type") == "array":
        if "prefixItems" in prop:
            return "tuple[" + ", ".join(type_name(p, "Any") for p in prop["prefixItems"]) + "]"
        if isinstance(prop.get("items"), dict):
            return f"list[{type_name(prop['items'], 'Any')}]"
        return "list"
    return _JSON_TYPES.get(prop.get("type", ""), fallback)


def _json_schema(schema: Any) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # defaults such as torch.float32 are left out of the export
            return schema.model_json_schema()
    except Exception:  # noqa: BLE001 - a default pydantic cannot export: fall back to describe()'s text
        return {}


def _ref_name(prop: dict[str, Any]) -> str | None:
    ref = prop.get("$ref") or (prop.get("allOf") or [{}])[0].get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def _props(js: dict[str, Any]) -> dict[str, Any]:
    """The properties of a JSON Schema, with a top-level ``$ref`` (enums) merged in."""
    defs = js.get("$defs", {})
    out = {}
    for name, prop in js.get("properties", {}).items():
        ref = _ref_name(prop)
        if ref and "properties" not in defs.get(ref, {}):
            prop = {**defs.get(ref, {}), **{k: v for k, v in prop.items() if k not in ("$ref", "allOf")}}
        out[name] = prop
    return out


def _nested_models(js: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(field, model name, model schema) for fields whose value is itself a config (``loss_scaler``)."""
    defs = js.get("$defs", {})
    out = []
    for name, prop in js.get("properties", {}).items():
        for option in [prop, *prop.get("anyOf", [])]:
            ref = _ref_name(option)
            if ref and "properties" in defs.get(ref, {}):
                out.append((name, ref, {**defs[ref], "$defs": defs}))
                break
    return out


def _yaml_value(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):  # YAML 1.1 (PyYAML) reads 1e-08 as a string; 1.0e-08 is a float
        text = repr(value)
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        items = [_yaml_value(v) for v in value]
        return None if any(i is None for i in items) else "[" + ", ".join(items) + "]"  # type: ignore[arg-type]
    if isinstance(value, dict) and not value:
        return "{}"
    return None


def example_yaml(key: str, qualified: str, schema: Any, wraps: bool = False) -> str:
    """A YAML config naming ``qualified`` with every field at its default
    (``???``, OmegaConf's missing-value marker, where a field is required)."""
    lines = [f"{key}:", f"  type: {qualified}"]
    if wraps:
        lines += ["  optimizer:                # the optimizer this one wraps", "    type: AdamW"]
    for name, info in schema.model_fields.items():
        if info.is_required():
            lines.append(f"  {name}: ???            # required")
            continue
        value = _yaml_value(info.default)
        lines.append(f"  {name}: {value}" if value is not None else f"  # {name}: {info.default!r} (set it in Python)")
    return "\n".join(lines)


def fields_table(info: dict[str, Any], schema: Any) -> str:
    rows = info.get("fields") or []
    if not rows:
        return "No hyper-parameters."
    js = _json_schema(schema)
    props = _props(js)
    out = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for row in rows:
        prop = props.get(row["field"], {})
        limits = (constraints(prop) if prop else "") or _pretty_constraints(row.get("constraints", ""))
        default = "**required**" if row["default"] == "required" else code(row["default"])
        out.append(
            f"| `{row['field']}` | {code(type_name(prop, row['type']))} | {default} | "
            f"{code(limits) if limits else ''} | {escape(row.get('description', ''))} |"
        )
    for field_name, model, sub in _nested_models(js):
        out += ["", f"`{field_name}` is a `{model}` mapping with these fields:", "",
                "| field | type | default | constraints | description |", "|---|---|---|---|---|"]
        required = set(sub.get("required", []))
        for name, prop in _props(sub).items():
            default = "**required**" if name in required else code(json.dumps(prop.get("default")))
            limits = constraints(prop)
            out.append(f"| `{name}` | {code(type_name(prop, 'Any'))} | {default} | {code(limits) if limits else ''} | "
                       f"{escape(prop.get('description', ''))} |")
    return "\n".join(out)


def _pretty_constraints(text: str) -> str:
    ops = {"Ge": ">=", "Gt": ">", "Le": "<=", "Lt": "<"}
    return re.sub(r"\b(Ge|Gt|Le|Lt)\(\w+=([^)]*)\)", lambda m: f"{ops[m.group(1)]} {m.group(2)}", text)


def flags_table(flags: dict[str, bool]) -> str:
    if not flags:
        return ""
    out = ["| capability flag | value | meaning |", "|---|---|---|"]
    for name, value in flags.items():
        shown = f"`{value}`" if isinstance(value, str) else "**yes**" if value else "no"
        out.append(f"| `{name}` | {shown} | {FLAG_MEANINGS.get(name, '')} |")
    return "\n".join(out)


def own_doc(target: Any) -> str:
    """The target's own docstring: a class without one does not inherit
    ``torch.optim.Optimizer``'s ("Base class for all optimizers")."""
    doc = vars(target).get("__doc__") if isinstance(target, type) else getattr(target, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def summary(target: Any, sentence: bool = False) -> str:
    """The docstring's first paragraph (``sentence``: its first sentence)."""
    text = " ".join(own_doc(target).split("\n\n", 1)[0].split())
    text = re.sub(r":[\w:]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")  # reST roles and literals
    if sentence:
        match = re.match(r"(.+?[.!?])(\s|$)", text)
        text = match.group(1) if match else text
    return text


def docstring_block(target: Any) -> str:
    doc = own_doc(target)
    if not doc.strip():
        return ""
    where = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"
    return f'??? note "Docstring of `{where}`"\n\n' + fenced(doc, "text", indent="    ")


# ------------------------------------------------------------ the sections
def _describe(spec: Any, scheduler: bool) -> dict[str, Any]:
    from optcore.cli import describe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return describe(spec.qualified, scheduler=scheduler)


def spec_section(spec: Any, info: dict[str, Any], *, level: int, winner: Any, scheduler: bool) -> str:
    """Everything about one provider of a name."""
    h = "#" * level
    plain = "resolves the plain name" if spec is winner else f"shadowed by `{winner.qualified}`"
    lines = [f"{h} `{spec.qualified}` {{#{slug(spec.qualified)}}}", ""]
    version = f" {info['version']}" if info.get("version") else ""
    lines.append(
        f"From {SOURCE_WORDS.get(spec.source, spec.source)} (`{spec.provider}`{version}); {plain}. "
        f"Select it explicitly with `type: {spec.qualified}`."
    )
    lines.append("")
    about = summary(spec.target)
    lines += [escape(about) if about else "*No docstring.*", ""]
    if info.get("implementation"):
        lines += [f"**Implementation:** {escape(info['implementation'])}.", ""]
    if info.get("parameters"):
        lines += [f"**Parameters:** {escape('; '.join(info['parameters']))}.", ""]
    if scheduler:
        needs = []
        if info.get("needs_total"):
            needs.append("the run length (`num_training_steps`, in the config or as `build_scheduler(..., num_training_steps=N)`)")
        if info.get("needs_metric"):
            needs.append("a metric at every step (`scheduler.step(metric)`)")
        if needs:
            lines += ["**Needs** " + " and ".join(needs) + ".", ""]
    else:
        table = flags_table(info.get("capabilities") or {})
        if table:
            lines += [table, ""]
    lines += [f"{h}# Hyper-parameters {{#{slug(spec.qualified)}-fields}}", "", fields_table(info, spec.schema), ""]
    key = "lr_scheduler" if scheduler else "optimizer"
    lines += [f"{h}# Example {{#{slug(spec.qualified)}-example}}", "", fenced(example_yaml(key, spec.qualified, spec.schema, wraps=not scheduler and spec.is_wrapper), "yaml"), ""]
    doc = docstring_block(spec.target)
    if doc:
        lines += [doc, ""]
    return "\n".join(lines)


def _shadow_note(winner: Any, providers: list[Any]) -> str:
    if len(providers) < 2:
        return ""
    rows = "\n".join(
        f"| `{s.qualified}` | {s.source} | `{s.provider}` | {'**yes**' if s is winner else 'no'} |" for s in providers
    )
    return (
        f"`type: {winner.name}` resolves to `{winner.qualified}`: it comes first in the resolution order "
        "(torch, then installed packages, then `register_*` calls and plugins). Every provider of this name, "
        "and the qualified name that selects it:\n\n"
        "| select with | source | provider | plain name |\n|---|---|---|---|\n" + rows + "\n"
    )


def name_page(path: str, winner: Any, providers: list[Any], infos: dict[str, dict[str, Any]], *, scheduler: bool,
              section: str, extra: str = "") -> Page:
    kind = "scheduler" if scheduler else "optimizer"
    lines = [f"# {winner.name}", "", GENERATED, ""]
    note = _shadow_note(winner, providers)
    lines += [note] if note else [
        f"The {kind} `{winner.name}` has one provider: `{winner.qualified}` ({winner.source}).", ""
    ]
    if extra:
        lines += [extra, ""]
    level = 2
    for spec in providers:
        if spec.qualified in infos:
            lines.append(spec_section(spec, infos[spec.qualified], level=level, winner=winner, scheduler=scheduler))
    return Page(path=path, title=winner.name, markdown="\n".join(lines), section=section)


# ------------------------------------------------------------ optimizers
def _groups(specs: Iterable[Any]) -> list[tuple[Any, list[Any]]]:
    return [(w, [w, *w.shadowed]) for w in specs]


def _collect(groups: list[tuple[Any, list[Any]]], ref: Reference, scheduler: bool) -> dict[str, dict[str, Any]]:
    infos = {}
    for _, providers in groups:
        for spec in providers:
            try:
                infos[spec.qualified] = _describe(spec, scheduler)
                spec.schema  # noqa: B018 - load it now, so a failure is reported here
            except Exception as exc:  # noqa: BLE001 - any import failure of a provider is reported, not fatal
                infos.pop(spec.qualified, None)
                ref.skipped.append((spec.qualified, spec.source, f"{type(exc).__name__}: {exc}".splitlines()[0]))
    return infos


def optimizer_pages(ref: Reference) -> None:
    import optcore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = _groups(optcore.list_optimizers())
    infos = _collect(groups, ref, scheduler=False)
    counts: dict[str, int] = {}
    for _, providers in groups:
        for s in providers:
            if s.source == "package":
                counts[s.provider] = counts.get(s.provider, 0) + 1
    big = {p for p, n in counts.items() if n > GROUP_THRESHOLD}

    where: dict[str, str] = {}  # qualified -> page path#anchor
    index_rows = []
    for winner, providers in groups:
        documented = [s for s in providers if s.qualified in infos]
        own_page = any(not (s.source == "package" and s.provider in big) for s in documented)
        if own_page:
            path = f"reference/optimizers/{slug(winner.name)}.md"
            if any(s.source in ("plugin", "user") for s in documented):
                section = "Plugins and registrations"
            elif winner.source == "torch":
                section = "torch.optim"
            else:
                section = "Packages"
            ref.pages.append(name_page(path, winner, providers, infos, scheduler=False, section=section))
            for s in documented:
                where[s.qualified] = f"{slug(winner.name)}.md#{slug(s.qualified)}"
        else:
            for s in documented:
                where[s.qualified] = f"packages/{slug(s.provider)}.md#{slug(s.qualified)}"
        if documented:
            index_rows.append((winner, providers))

    for provider in sorted(big):
        specs = [(w, s) for w, providers in groups for s in providers if s.provider == provider and s.qualified in infos]
        ref.pages.append(_package_page(provider, specs, infos, where))

    ref.pages.insert(0, _optimizer_index(index_rows, infos, where, ref.skipped))


def _package_page(provider: str, specs: list[tuple[Any, Any]], infos: dict[str, dict[str, Any]],
                  where: dict[str, str]) -> Page:
    lines = [
        f"# {provider}", "",
        GENERATED, "",
        (f"The optimizers optcore finds in the installed package `{provider}` ({len(specs)}). "
         "Each is selected by its qualified name; the plain name gives it only where nothing earlier "
         "in the resolution order has the same name."), "",
        "| name | select with | plain name resolves to | what it is |", "|---|---|---|---|",
    ]
    for winner, spec in specs:
        target = where[spec.qualified]
        link = f"#{slug(spec.qualified)}" if target.startswith("packages/") else f"../{target}"
        plain = "**this one**" if spec is winner else f"`{winner.qualified}`"
        lines.append(f"| [{spec.name}]({link}) | `{spec.qualified}` | {plain} | {escape(summary(spec.target, sentence=True))} |")
    lines.append("")
    for winner, spec in specs:
        if where[spec.qualified].startswith("packages/"):
            lines.append(spec_section(spec, infos[spec.qualified], level=2, winner=winner, scheduler=False))
    return Page(path=f"reference/optimizers/packages/{slug(provider)}.md", title=f"{provider} (all)",
                markdown="\n".join(lines), section="Packages")


def _optimizer_index(rows: list[tuple[Any, list[Any]]], infos: dict[str, dict[str, Any]], where: dict[str, str],
                     skipped: list[tuple[str, str, str]]) -> Page:
    flag_names = list(FLAG_MEANINGS)
    lines = [
        "# Optimizers", "",
        GENERATED, "",
        ("Every optimizer name `optcore list` resolves in the environment that built these pages, "
         "in resolution order. *Flags* are the capability flags of the provider the plain name gives: "
         "**M** `supports_memory_efficient_fp16`, **S** `supports_step_with_scale`, "
         "**F** `supports_flat_params`, **G** `supports_groups`, then `sharding`. "
         "See [Concepts](../../concepts.md) for what the order and the flags mean."), "",
        "| name | plain name resolves to | also provided by | flags | what it is |", "|---|---|---|---|---|",
    ]
    for winner, providers in rows:
        first = next(s for s in providers if s.qualified in infos)
        info = infos[first.qualified]
        flags = info.get("capabilities") or {}
        mark = " ".join(letter if flags.get(name) else "·" for letter, name in zip("MSFG", flag_names)) if flags else ""
        mark += f" {flags['sharding']}" if flags.get("sharding") else ""
        others = ", ".join(f"[`{s.qualified}`]({where[s.qualified]})" for s in providers[1:] if s.qualified in where)
        lines.append(
            f"| [{winner.name}]({where[first.qualified]}) | `{winner.qualified}` | {others} | `{mark}` | "
            f"{escape(summary(first.target, sentence=True))} |"
        )
    lines.append("")
    if skipped:
        lines += [
            "## Not documented here", "",
            ("These providers are installed but could not be imported or described when the site was built "
             "(usually a third-party package that needs a dependency or a torch version this environment lacks). "
             "`optcore show NAME` on your machine says whether they work there."), "",
            "| provider | source | error |", "|---|---|---|",
        ]
        lines += [f"| `{q}` | {src} | {code(err[:200])} |" for q, src, err in skipped]
        lines.append("")
    return Page(path="reference/optimizers/index.md", title="Optimizers", markdown="\n".join(lines))


# ------------------------------------------------------------ schedulers
def scheduler_pages(ref: Reference, docs_dir: Path) -> None:
    import optcore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = _groups(optcore.list_schedulers())
    before = len(ref.skipped)
    infos = _collect(groups, ref, scheduler=True)
    guide = (docs_dir / "schedulers.md").read_text(encoding="utf-8") if (docs_dir / "schedulers.md").exists() else ""
    sections = {"torch": "torch.optim.lr_scheduler", "builtin": "Named schedules"}
    index = [
        "# Schedulers", "",
        GENERATED, "",
        ("Every LR scheduler name `optcore list --schedulers` resolves, in resolution order "
         "(see the [scheduler guide](../../schedulers.md) for how to use them)."), "",
        "| name | select with | source | needs | what it is |", "|---|---|---|---|---|",
    ]
    for winner, providers in groups:
        documented = [s for s in providers if s.qualified in infos]
        if not documented:
            continue
        extra = []
        plot = docs_dir / "img" / "schedules" / f"{winner.name}.png"
        if plot.exists():
            extra.append(f"![{winner.name}: the learning rate over 1000 steps](../../img/schedules/{winner.name}.png)")
        if f"### `{winner.name}`" in guide:
            extra.append(f"The [scheduler guide](../../schedulers.md#{winner.name}) has the formula and the example the plot was made from.")
        path = f"reference/schedulers/{slug(winner.name)}.md"
        section = sections.get(winner.source, "Plugins and registrations")
        ref.pages.append(name_page(path, winner, providers, infos, scheduler=True, section=section, extra="\n\n".join(extra)))
        info = infos[documented[0].qualified]
        needs = ", ".join(n for n, k in (("run length", "needs_total"), ("metric", "needs_metric")) if info.get(k))
        index.append(f"| [{winner.name}]({slug(winner.name)}.md) | `{winner.qualified}` | {winner.source} | {needs} | "
                     f"{escape(summary(documented[0].target, sentence=True))} |")
    index.append("")
    if len(ref.skipped) > before:
        index += ["## Not documented here", "", "| provider | source | error |", "|---|---|---|"]
        index += [f"| `{q}` | {src} | {code(err[:200])} |" for q, src, err in ref.skipped[before:]]
    ref.pages.append(Page(path="reference/schedulers/index.md", title="Schedulers", markdown="\n".join(index)))


def reference_pages(docs_dir: Path | None = None) -> Reference:
    """Every reference page, built from the registry of this process."""
    ref = Reference()
    optimizer_pages(ref)
    scheduler_pages(ref, docs_dir or Path(__file__).resolve().parent)
    # index pages first within their kind (nav order), the rest as generated
    ref.pages.sort(key=lambda p: (p.path.split("/")[1], not p.path.endswith("index.md")))
    return ref


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="write the markdown pages under this folder")
    args = parser.parse_args()
    ref = reference_pages()
    for page in ref.pages:
        dest = args.out / page.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(page.markdown, encoding="utf-8")
    print(f"{len(ref.pages)} pages under {args.out}; skipped {len(ref.skipped)} providers")
    for q, src, err in ref.skipped:
        print(f"  skipped {q} ({src}): {err}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
