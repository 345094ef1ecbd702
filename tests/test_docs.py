"""The reference in docs/ covers what the code has: every config key, event type and field, command and option,
client call, `tui/` module and engine sub-package; and the README's links lead somewhere."""
import dataclasses
import importlib.util
import re
from pathlib import Path

import torchherd.client
import torchherd.engine
import torchherd.tui
from torchherd.engine.config.schema import describe_fields
from torchherd.engine.protocol.messages import Event
from torchherd.engine.protocol.records import message_types
from torchherd.tui.cli_parsers import parsers as _parsers

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "config_reference.py"
# Telemetry and heartbeats never reach events.jsonl; the events page says so in a sentence rather than a row.
# `event` is the pipeline events' base class, no event of its own.
OFF_THE_TABLE = {"event", "heartbeat", "telemetry"}


def _page(name: str) -> str:
    return (DOCS / name).read_text()


def _hook():
    spec = importlib.util.spec_from_file_location("config_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_its_config_reference_with_the_hook():
    assert "docs/hooks/config_reference.py" in (ROOT / "mkdocs.yml").read_text()


def test_every_config_table_is_generated_into_the_reference():
    hook = _hook()
    marked = {m["table"] for page in DOCS.rglob("*.md") for m in hook.MARKER.finditer(page.read_text())}
    tables = {hook.NAMES.get(t, t) for t in marked}
    assert tables == set(describe_fields())
    committed = _page("reference/config.md")
    rendered = hook.render(committed)
    # Regression: the page held only markers, filled as the site was built: a reader of the docs folder saw none.
    assert rendered == committed, "docs/reference/config.md is not the schema's: python docs/hooks/config_reference.py"
    missing = [f"{table}.{key}" for table, keys in describe_fields().items() for key in keys
               if f"| `{key}` |" not in rendered]
    assert missing == []


def test_every_config_key_has_a_description():
    # The reference shows the schema's own descriptions: a key without one would be a row that says nothing.
    assert [f"{t}.{k}" for t, keys in describe_fields().items() for k, text in keys.items() if not text] == []


def test_an_unknown_config_table_fails_the_build():
    hook = _hook()
    try:
        hook.render("<!-- config-keys: nosuch -->\n<!-- /config-keys -->")
    except ValueError as exc:
        assert "nosuch" in str(exc)
    else:
        raise AssertionError("an unknown table rendered as nothing")


def test_every_event_type_and_each_field_is_in_the_events_page():
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+)` \|.*$", _page("reference/events.md"), re.MULTILINE)}
    missing = []
    for t, cls in message_types().items():
        if not issubclass(cls, Event) or t in OFF_THE_TABLE:
            continue
        if t not in rows:
            missing.append(t)
            continue
        missing += [f"{t}.{f.name}" for f in dataclasses.fields(cls)
                    if f.name != "time" and f"`{f.name}`" not in rows[t]]
    assert missing == []
    text = _page("reference/events.md")
    assert all(f"`{t}`" in text for t in OFF_THE_TABLE - {"event"})


def test_every_command_and_option_is_in_the_commands_page():
    page = _page("reference/commands.md")
    app, commands = _parsers()
    missing = [f"torchherd {verb}" for verb in commands if f"| `torchherd {verb} " not in page]  # a row each
    for parser in [app, *commands.values()]:
        missing += [f"{parser.prog} {opt}" for action in parser._actions for opt in action.option_strings
                    if opt.startswith("--") and opt != "--help" and opt not in page]
    assert missing == []


def test_every_key_of_the_dashboard_is_in_the_app_page():
    from torchherd.tui.screens.dashboard import DashboardScreen

    page = _page("guide/app.md")
    shown = {"question_mark": "?"}
    keys = [shown.get(b.key, b.key) for b in DashboardScreen.BINDINGS]
    assert [k for k in keys if f"`{k}`" not in page] == []


def test_every_client_call_is_in_the_scripts_page():
    page = _page("guide/scripts.md")
    assert [name for name in torchherd.client.__all__ if f"herd.{name}" not in page] == []


def test_the_architecture_page_names_every_tui_module_and_engine_package_and_module():
    page = _page("develop/architecture.md")
    tui = Path(torchherd.tui.__path__[0])
    modules = [p.relative_to(tui).as_posix() for p in tui.rglob("*.py") if p.name != "__init__.py"]
    assert [m for m in modules if f"`{m}`" not in page] == []
    engine = Path(torchherd.engine.__path__[0])
    packages = [p.parent.relative_to(engine).as_posix() + "/" for p in engine.rglob("__init__.py")
                if p.parent != engine]
    assert [p for p in packages if f"`{p}`" not in page] == []
    modules = [p.relative_to(engine).as_posix() for p in engine.rglob("*.py") if p.name != "__init__.py"]
    assert [m for m in modules if f"`{m.rsplit('/', 1)[-1]}`" not in page] == []  # each in its package's row


def test_the_readme_links_lead_to_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into docs/"
    assert [link for link in local if not (ROOT / link).exists()] == []
