"""Entry-point discovery: listing runs no plugin code, a plugin's exit is a
PluginLoadError, discovery order is the same everywhere, clashes are reported."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import optcore
import optcore._plugins as plugins
from optcore import PluginLoadError
from optcore._registry import ShadowedNameWarning

SGD_LIKE = """
import torch
class Opt(torch.optim.SGD):
    supports_flat_params = True
"""


# ------------------------------------------------------------ E: listing and exits
def test_listing_reads_metadata_only(fake_plugins, tmp_path):
    marker = tmp_path / "ran"
    fake_plugins("optcore-marker", "optcore_marker_fake", f"open({str(marker)!r}, 'w').write('x')\n" + SGD_LIKE,
                 {"optcore.optimizers": {"MarkerOpt": "optcore_marker_fake:Opt"}})
    specs = optcore.list_optimizers()
    rows = {s.qualified: (s.describe(), s.known_capabilities, s.loaded) for s in specs}
    assert not marker.exists() and "optcore_marker_fake" not in sys.modules
    row, flags, loaded = rows["optcore-marker:MarkerOpt"]
    assert row["source"] == "plugin" and flags is None and loaded is False
    _, torch_flags, torch_loaded = rows["torch:AdamW"]
    assert torch_loaded and torch_flags.step_with_scale and torch_flags.groups  # torch's need no plugin code
    # Once the class is loaded (built, shown), its flags are known without more imports.
    spec = optcore.resolve("MarkerOpt")
    assert spec.capabilities.flat_params and marker.exists()
    assert spec.loaded and spec.known_capabilities == spec.capabilities


def test_the_default_listing_imports_no_plugin_module():
    code = textwrap.dedent("""
        import sys
        import optcore
        rows = [(s.describe(), s.known_capabilities) for s in optcore.list_optimizers()]
        from optcore.schedulers import list_schedulers
        rows += [(s.describe(), None) for s in list_schedulers()]
        plugin_modules = sorted(m for m in sys.modules if m.split('.')[0].startswith('optcore_'))
        assert not plugin_modules, plugin_modules
        assert any(r["source"] == "plugin" for r, _ in rows)
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("body,cause", [
    ("import sys\nsys.exit(3)", "SystemExit: 3"),
    ("raise SystemExit('plugin gave up')", "SystemExit: plugin gave up"),
    ("class Odd(BaseException): pass\nraise Odd('not an Exception')", "Odd: not an Exception"),
])
def test_a_plugin_that_exits_at_import_is_a_plugin_load_error(fake_plugins, model, body, cause):
    fake_plugins("optcore-quitter", "optcore_quitter_fake", body,
                 {"optcore.optimizers": {"Quitter": "optcore_quitter_fake:Opt"}})
    with pytest.raises(PluginLoadError) as info:
        optcore.build_optimizer("Quitter", model)
    assert cause in str(info.value) and info.value.distribution == "optcore-quitter"
    assert optcore.build_optimizer("AdamW", model).get_lr() == pytest.approx(1e-3)


def test_a_validator_that_exits_is_a_plugin_load_error(fake_plugins):
    source = textwrap.dedent("""
        import sys
        import torch

        class Meta(type):
            @property
            def config_schema(cls):  # read by optcore's check of the entry point's object
                sys.exit(9)

        class Bad(torch.optim.SGD, metaclass=Meta):
            pass
    """)
    fake_plugins("optcore-badschema2", "optcore_badschema2_fake", source,
                 {"optcore.optimizers": {"BadSchema2": "optcore_badschema2_fake:Bad"}})
    with pytest.raises(PluginLoadError, match="SystemExit: 9"):
        optcore.resolve("BadSchema2").target


def test_keyboard_interrupt_is_not_swallowed(fake_plugins):
    fake_plugins("optcore-ctrlc", "optcore_ctrlc_fake", "raise KeyboardInterrupt",
                 {"optcore.optimizers": {"CtrlC": "optcore_ctrlc_fake:Opt"}})
    with pytest.raises(KeyboardInterrupt):
        optcore.resolve("CtrlC").target


# ------------------------------------------------------------ F: name clashes
@pytest.mark.parametrize("reverse", [False, True], ids=["listdir-sorted", "listdir-reversed"])
def test_two_plugins_with_one_name_resolve_the_same_way_and_the_clash_is_reported(fake_plugins, monkeypatch, reverse):
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": sorted(real_listdir(path), reverse=reverse))
    name, tag = f"TwinOpt{int(reverse)}", int(reverse)
    for dist in ("optcore-zzz", "optcore-aaa"):
        module = f"{dist.replace('-', '_')}_twin{tag}"
        fake_plugins(dist, module, SGD_LIKE, {"optcore.optimizers": {name: f"{module}:Opt"}})
    with pytest.warns(ShadowedNameWarning, match=f"optcore-zzz:{name}"):
        spec = optcore.resolve(name)
    assert spec.provider == "optcore-aaa"
    assert [s.qualified for s in spec.shadowed] == [f"optcore-zzz:{name}"]
    assert optcore.resolve(f"optcore-zzz:{name}").provider == "optcore-zzz"
    listed = next(s for s in optcore.list_optimizers() if s.name == name)
    assert listed.provider == "optcore-aaa" and [s.provider for s in listed.shadowed] == ["optcore-zzz"]


# ------------------------------------------------------------ I: discovery rules kept
def _dist(folder, dir_name, name, version, entry_points, module=None, source=""):
    """A distribution as pip leaves it: ``dir_name`` (a .dist-info) with METADATA and entry_points.txt,
    and ``module``.py beside it."""
    info = folder / dir_name
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items())
    )
    if module:
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
    return info


@pytest.fixture
def on_path(monkeypatch):
    """``add(folder, first=True)``: a folder on sys.path (first, or last), with discovery's cache cleared."""
    monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("OPTCORE_PLUGINS", raising=False)

    def add(folder, first=True):
        monkeypatch.setattr(sys, "path", [str(folder), *sys.path] if first else [*sys.path, str(folder)])
        plugins.refresh()

    yield add
    monkeypatch.undo()
    plugins.refresh()


def _marking(marker):
    return f"open({str(marker)!r}, 'w').write('ran')\n" + SGD_LIKE + "Lion = Opt\n"


@pytest.mark.parametrize("first", [True, False], ids=["look-alike-first", "look-alike-last"])
def test_a_look_alike_distribution_is_refused_naming_both_folders_and_runs_nothing(
        tmp_path, on_path, model, first):
    """``Optcore_LookAlike`` and ``optcore-lookalike`` are one normalized name: the one first on
    sys.path used to be taken, its module run and its class built, without a word."""
    real, fake = tmp_path / "site", tmp_path / "pythonpath"
    marker = tmp_path / "marker"
    real_info = _dist(real, "optcore_lookalike-0.1.dist-info", "optcore-lookalike", "0.1",
                      {"optcore.optimizers": {"LookOpt": "optcore_lookalike_real:Opt"}}, "optcore_lookalike_real", SGD_LIKE)
    fake_info = _dist(fake, "Optcore_LookAlike-1.0.dist-info", "Optcore_LookAlike", "1.0",
                      {"optcore.optimizers": {"LookOpt": "optcore_lookalike_evil:Opt"},
                       "optcore.hooks": {"evil": "optcore_lookalike_evil"}},
                      "optcore_lookalike_evil", _marking(marker))
    on_path(real, first=True)
    on_path(fake, first=first)
    # the entry points are the first copy's: the look-alike's hook plugin when it comes first, refused with a warning
    hook = "'optcore.hooks:evil = optcore_lookalike_evil' is not loaded: 2 dist"
    with pytest.warns(RuntimeWarning, match=hook) if first else contextlib.nullcontext():
        for name in ("LookOpt", "optcore-lookalike:LookOpt", "Optcore_LookAlike:LookOpt"):
            with pytest.raises(PluginLoadError) as info:
                optcore.build_optimizer(name, model)
            message = str(info.value)
            assert str(real_info) in message and str(fake_info) in message, message
            assert "Optcore_LookAlike 1.0" in message and "optcore_lookalike 0.1" in message
            assert "pip uninstall" in message and "PYTHONPATH" in message
            assert info.value.distribution == "optcore-lookalike"
        optcore.build_optimizer("AdamW", model).step()  # the hook plugin's refusal is a warning, not a stop
    assert not marker.exists()
    assert "optcore_lookalike_evil" not in sys.modules and "optcore_lookalike_real" not in sys.modules


def test_a_look_alike_of_an_installed_plugin_is_refused(tmp_path, on_path, model):
    """The case of the issue: ``Optcore_Lion`` in a PYTHONPATH folder, taken for ``optcore-lion:Lion``."""
    from importlib import metadata

    try:
        installed = metadata.distribution("optcore-lion")
    except metadata.PackageNotFoundError:
        pytest.skip("optcore-lion is not installed as a distribution here")
    marker = tmp_path / "marker"
    fake_info = _dist(tmp_path, "Optcore_Lion-1.0.dist-info", "Optcore_Lion", "1.0",
                      {"optcore.optimizers": {"Lion": "optcore_lion_evil:Lion"}}, "optcore_lion_evil", _marking(marker))
    on_path(tmp_path)
    with pytest.raises(PluginLoadError) as info:
        optcore.build_optimizer({"type": "optcore-lion:Lion", "lr": 1e-4}, model)
    assert str(fake_info) in str(info.value) and str(installed._path) in str(info.value)
    assert not marker.exists() and "optcore_lion_evil" not in sys.modules


def test_one_folder_reached_twice_through_sys_path_is_one_distribution(tmp_path, on_path, monkeypatch, model):
    _dist(tmp_path, "optcore_twice-1.0.dist-info", "optcore-twice", "1.0",
          {"optcore.optimizers": {"TwiceOpt": "optcore_twice_fake:Opt"}}, "optcore_twice_fake", SGD_LIKE)
    monkeypatch.chdir(tmp_path)
    on_path(tmp_path)
    on_path("", first=False)  # the working directory, spelt as Python spells it
    try:
        assert isinstance(optcore.build_optimizer("TwiceOpt", model), torch.optim.SGD)
        assert plugins.clashes() == []
    finally:
        sys.modules.pop("optcore_twice_fake", None)


@pytest.mark.parametrize("site_first", [True, False], ids=["site-packages-first", "project-first"])
def test_an_editable_install_and_the_egg_info_in_its_project_are_one_distribution(tmp_path, on_path, model, site_first):
    """``pip install -e`` of a setuptools project leaves a .dist-info in site-packages naming the project
    as editable, and an .egg-info inside the project's source folder, which its .pth puts on sys.path."""
    project, site = tmp_path / "optcore-editable", tmp_path / "site"
    src = project / "src"
    eps = {"optcore.optimizers": {"EditableOpt": "optcore_editable_mod:Opt"}}
    _dist(src, "optcore_editable.egg-info", "optcore-editable", "0.3", eps, "optcore_editable_mod", SGD_LIKE)
    info = _dist(site, "optcore_editable-0.3.dist-info", "optcore_editable", "0.3", eps)
    (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": project.as_uri()}))
    on_path(src)
    on_path(site, first=site_first)
    try:
        assert plugins.clashes() == []
        assert isinstance(optcore.build_optimizer("EditableOpt", model), torch.optim.SGD)
        # with other entry points, the same .egg-info beside a dist-info that is not editable (or names another
        # project) is a look-alike
        (src / "optcore_editable.egg-info" / "entry_points.txt").write_text(
            "[optcore.optimizers]\nEditableOpt = optcore_editable_other:Opt\n")
        plugins.refresh()
        assert plugins.clashes() == []
        (info / "direct_url.json").write_text(json.dumps({"dir_info": {}, "url": project.as_uri()}))
        plugins.refresh()
        assert len(plugins.clashes()) == 1
        (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True},
                                                          "url": (tmp_path / "elsewhere").as_uri()}))
        plugins.refresh()
        assert len(plugins.clashes()) == 1
    finally:
        sys.modules.pop("optcore_editable_mod", None)


def test_copies_that_declare_the_same_entry_points_are_one_distribution(tmp_path, on_path, model):
    """A source checkout on PYTHONPATH beside its installed wheel (setuptools leaves an .egg-info in src/):
    each entry point names a module sys.path finds whichever copy declared it, so nothing is ambiguous."""
    eps = {"optcore.optimizers": {"SameOpt": "optcore_same_mod:Opt"}}
    _dist(tmp_path / "src", "optcore_same.egg-info", "optcore-same", "0.2", eps, "optcore_same_mod", SGD_LIKE)
    _dist(tmp_path / "site", "optcore_same-0.2.dist-info", "optcore_same", "0.2", eps)
    on_path(tmp_path / "site")
    on_path(tmp_path / "src", first=False)
    try:
        assert plugins.clashes() == []
        assert isinstance(optcore.build_optimizer("optcore-same:SameOpt", model), torch.optim.SGD)
    finally:
        sys.modules.pop("optcore_same_mod", None)


def test_optcore_list_reports_a_look_alike_and_lists_the_rest(tmp_path, on_path, capsys, monkeypatch):
    from optcore.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)  # the notes' lines whole, as piped

    real, fake = tmp_path / "site", tmp_path / "pythonpath"
    _dist(real, "optcore_listed-0.1.dist-info", "optcore-listed", "0.1", {"optcore.optimizers": {"Listed": "m:Opt"}})
    _dist(fake, "Optcore_Listed-9.dist-info", "Optcore_Listed", "9", {"optcore.optimizers": {"Listed": "evil:Opt"}})
    on_path(real)
    on_path(fake)
    assert main(["list", "--flags"]) == 0
    out = capsys.readouterr().out
    assert "AdamW" in out and "Not loaded: 2 distributions on sys.path have one normalized name" in out
    assert str(real / "optcore_listed-0.1.dist-info") in out and str(fake / "Optcore_Listed-9.dist-info") in out
    assert main(["list", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "Optcore_Listed 9" in captured.err


def test_an_egg_info_without_a_version_in_its_name_reads_its_header(tmp_path, monkeypatch):
    """An editable install's ``pkg.egg-info`` (source tree on sys.path) names
    neither distribution nor version: they come from PKG-INFO's header, not
    its body."""
    info = tmp_path / "optcore_egg_fake.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: optcore-egg-fake\nVersion: 0.3\nSummary: x\n\nName: not the header\n"
    )
    (info / "entry_points.txt").write_text("[optcore.optimizers]\nEggOpt = optcore_egg_fake:Opt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.refresh()
    try:
        (entry,) = [e for e in plugins.entry_points("optcore.optimizers") if e.name == "EggOpt"]
        assert (entry.distribution, entry.version) == ("optcore-egg-fake", "0.3")
    finally:
        monkeypatch.undo()
        plugins.refresh()


def test_missing_path_entries_need_no_importlib_metadata():
    code = textwrap.dedent("""
        import sys
        sys.path.append('/nonexistent/python3xx.zip')
        before = 'importlib.metadata' in sys.modules
        import optcore._plugins as p
        entries = p.entry_points('optcore.optimizers')
        assert entries, 'the installed plugins are found'
        assert before or 'importlib.metadata' not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_switches_still_apply(fake_plugins, monkeypatch):
    fake_plugins("optcore-switch", "optcore_switch_fake", SGD_LIKE, {"optcore.optimizers": {"SwitchOpt": "optcore_switch_fake:Opt"}})
    monkeypatch.setenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert plugins.entry_points("optcore.optimizers") == ()
    monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("OPTCORE_PLUGINS", "optcore-switch")
    assert [e.name for e in plugins.entry_points("optcore.optimizers")] == ["SwitchOpt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert optcore.resolve("SwitchOpt").target.__name__ == "Opt"
    assert isinstance(optcore.resolve("SwitchOpt").target(torch.nn.Linear(2, 2).parameters(), lr=0.1), torch.optim.SGD)
