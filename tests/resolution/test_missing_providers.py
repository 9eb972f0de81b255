"""A name whose provider is not installed says what to install: a plugin
distribution named in a qualified type (``optcore-sophia:Sophia``), and a plain
name that one of optcore's shipped plugins provides."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import optcore
import optcore._plugins as plugins
import optcore.missing
from optcore._names import normalize
from optcore._packages import KNOWN_PACKAGES
from optcore.missing import SHIPPED_PLUGINS, missing_provider

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def _message(name: str) -> str:
    with pytest.raises(optcore.OptimizerNotFoundError) as caught:
        optcore.resolve(name)
    return str(caught.value)


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """``without(dist)``: discovery as if plugin distribution ``dist`` were not installed."""
    monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("OPTCORE_PLUGINS", raising=False)
    gone: set[str] = set()
    scan = plugins._scan

    def scan_without(path):
        return {g: tuple(e for e in items if normalize(e.distribution or "") not in gone) for g, items in scan(path).items()}

    monkeypatch.setattr(plugins, "_scan", scan_without)

    def drop(dist: str) -> None:
        gone.add(normalize(dist))
        plugins._discover.cache_clear()

    yield drop
    plugins._discover.cache_clear()


def test_the_shipped_plugins_table_is_what_each_plugin_declares():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = {}
    for project in sorted(PLUGINS.glob("*/pyproject.toml")):
        meta = tomllib.loads(project.read_text())["project"]
        declared[meta["name"]] = tuple(meta.get("entry-points", {}).get("optcore.optimizers", {}))
    assert declared == SHIPPED_PLUGINS


@pytest.mark.parametrize("text", ["optcore-sophia:Sophia", "Optcore_Sophia-Extra:Sophia"])
def test_a_plugin_distribution_that_is_not_installed_is_named(text):
    dist = text.partition(":")[0]
    message = _message(text)
    first = message.splitlines()[0]
    assert first == f"No distribution {dist!r} is installed, so nothing provides 'Sophia' under that name."
    assert "No optimizer named" not in message
    assert f"`pip install {dist}`" in message


def test_a_distribution_spelt_as_a_module_that_neither_is_says_both():
    message = _message("optcore_sophia:Sophia")
    assert message.startswith("No distribution or module 'optcore_sophia' is installed")
    assert "`pip install optcore_sophia`" in message


def test_an_installed_plugin_that_declares_other_names_lists_them(fake_plugins):
    fake_plugins("optcore-sophia", "fake_sophia", "X = 1", {"optcore.optimizers": {"SophiaG": "fake_sophia:X"}})
    message = _message("optcore-sophia:SophiaH")
    assert message.startswith("Distribution 'optcore-sophia' declares no optimizer named 'SophiaH'.")
    assert "entry points: SophiaG" in message


def test_an_installed_plugin_left_out_by_the_switch_says_which_switch(fake_plugins, monkeypatch):
    fake_plugins("optcore-sophia", "fake_sophia", "X = 1", {"optcore.optimizers": {"Sophia": "fake_sophia:X"}})
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-other")
    message = _message("optcore-sophia:Sophia")
    assert message.startswith("Distribution 'optcore-sophia' is installed, but its optcore.optimizers entry points")
    assert "add optcore-sophia to it" in message


ONLY_PLUGINS = [
    (dist, name)
    for dist, names in SHIPPED_PLUGINS.items()
    for name in names
    if not any(normalize(name) in map(normalize, p.classes) for p in KNOWN_PACKAGES) and not hasattr(torch.optim, name)
]


@pytest.mark.parametrize(("dist", "name"), ONLY_PLUGINS)
def test_a_plain_name_of_a_shipped_plugin_that_is_not_installed_names_the_plugin(without, dist, name):
    without(dist)
    message = _message(name)
    assert f"optcore's plugin {dist}, which is not installed: `pip install {dist}`" in message
    assert f"`pip install ./plugins/{dist}`" in message


@pytest.mark.parametrize(("dist", "name"), ONLY_PLUGINS)
def test_a_plain_name_of_a_shipped_plugin_switched_off_names_the_switch(monkeypatch, dist, name):
    if not plugins.declared(dist, plugins.OPTIMIZERS_GROUP):
        pytest.skip(f"{dist} is not installed")
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-nothing")
    message = _message(name)
    assert f"{name!r} is an optimizer of {dist}, which is installed, but OPTCORE_PLUGINS=" in message


def test_lion_without_its_plugin_or_a_package_suggests_both(monkeypatch):
    """Where neither optcore-lion nor lion-pytorch (nor any other Lion) is installed."""
    monkeypatch.setattr(optcore.missing, "is_installed", lambda top: False)
    hint = missing_provider("Lion", ["optcore-lion"])
    assert "optcore's plugin optcore-lion, which is not installed: `pip install optcore-lion`" in hint
    assert "It is also an optimizer of lion-pytorch" in hint and "`pip install lion-pytorch`" in hint
    assert "'optcore-lion:Lion' the plugin's" in hint


def test_a_plain_name_nobody_ships_keeps_the_general_message():
    message = _message("SophiaNobodyShips")
    assert message.startswith("No optimizer named 'SophiaNobodyShips'.") and "pip install" not in message
