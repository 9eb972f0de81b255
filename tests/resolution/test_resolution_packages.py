"""Packages with registries of their own: asked for a name optcore's tables
lack, and only then imported."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import optcore
from optcore import ConfigError, OptimizerNotFoundError
from optcore._registry import OPTIMIZERS

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")


@pytest.mark.parametrize("name,cls", [("Shampoo", "Shampoo"), ("SophiaH", "SophiaH"), ("A2Grad", "A2Grad"),
                                      ("a2_grad", "A2Grad"), ("accsgd", "AccSGD")])
def test_names_only_pytorch_optimizers_registry_has_resolve_to_it(name, cls, model):
    spec = optcore.resolve(name)
    assert (spec.source, spec.provider, spec.name) == ("package", "pytorch_optimizer", cls)
    assert spec.target is getattr(pytorch_optimizer, cls)
    assert spec.qualified == f"pytorch_optimizer:{cls}"
    assert optcore.resolve(spec.qualified).target is spec.target
    assert pickle.loads(pickle.dumps(spec)).target is spec.target


@pytest.mark.filterwarnings("ignore::optcore._registry.ShadowedNameWarning")
def test_every_name_of_the_registry_resolves_to_the_packages_class():
    from optcore._names import normalize

    in_tables = {normalize(s.name) for s in optcore.list_optimizers()}
    names = pytorch_optimizer.get_supported_optimizers()
    assert len(names) > 100
    for name in names:
        spec = optcore.resolve(name)
        if normalize(name) in in_tables:  # optcore's tables come first (torch's AdamW, lion-pytorch's Lion)
            assert spec.source != "package" or spec.provider != "pytorch_optimizer" or spec.target is pytorch_optimizer.load_optimizer(name)
        else:
            assert (spec.provider, spec.target) == ("pytorch_optimizer", pytorch_optimizer.load_optimizer(name)), name


def test_the_registry_builds_an_optimizer(model):
    opt = optcore.build_optimizer({"type": "Shampoo", "lr": 0.5}, model)
    assert isinstance(opt, pytorch_optimizer.Shampoo) and opt.get_lr() == 0.5


def test_a_qualified_name_asks_the_named_packages_registry_even_with_import_paths_off():
    assert optcore.resolve("pytorch_optimizer:shampoo", allow_import_paths=False).target is pytorch_optimizer.Shampoo


def test_listing_asks_the_registries_only_when_told():
    for all_ in (False, True):
        plain = {s.qualified for s in optcore.list_optimizers(all=all_)}
        everything = {s.qualified for s in optcore.list_optimizers(all=all_, ask_packages=True)}
        assert "pytorch_optimizer:Shampoo" not in plain
        assert {"pytorch_optimizer:Shampoo", "pytorch_optimizer:SophiaH", "pytorch_optimizer:A2Grad"} <= everything
        assert len([q for q in everything if q.startswith("pytorch_optimizer:")]) >= 100
        assert plain <= everything


def test_listing_imports_no_third_party_package():
    code = textwrap.dedent("""
        import sys
        import optcore
        specs = optcore.list_optimizers()
        rows = [s.describe() for s in specs]
        flags = [s.known_capabilities for s in specs]
        optcore.resolve("AdamW")
        bad = sorted({m.split('.')[0] for m in sys.modules} & {'pytorch_optimizer', 'timm', 'transformers',
                                                                 'lion_pytorch', 'optimi', 'schedulefree'})
        assert not bad, bad
        assert any(r["provider"] == "pytorch_optimizer" for r in rows)
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


TIMM_FAKE = '''
import torch

CALLS = []

class FakeTimmOpt(torch.optim.SGD):
    """A timm-only optimizer."""

_REGISTRY = {"faketimmopt": FakeTimmOpt, "momentumish": torch.optim.SGD}

def list_optimizers(filter="", exclude_filters=None, with_description=False):
    return sorted([*_REGISTRY, "needsgpu", "notaclass"])

def get_optimizer_class(name, bind_defaults=True):
    CALLS.append((name, bind_defaults))
    if name == "needsgpu":
        raise AssertionError("CUDA required for bitsandbytes optimizers")
    if name == "notaclass":
        return print
    return _REGISTRY[name]
'''


@pytest.fixture
def fake_timm(tmp_path, monkeypatch):
    """A stand-in ``timm`` (not installed here) with timm's registry functions."""
    pkg = tmp_path / "timm"
    (pkg / "optim").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "optim" / "__init__.py").write_text(TIMM_FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    OPTIMIZERS.asked.forget()
    yield
    for m in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
        del sys.modules[m]
    OPTIMIZERS.asked.forget()


def test_timms_registry_is_asked_the_same_way(fake_timm):
    import timm.optim

    spec = optcore.resolve("FakeTimmOpt")
    assert (spec.source, spec.provider, spec.qualified) == ("package", "timm", "timm.optim:FakeTimmOpt")
    assert spec.target is timm.optim.FakeTimmOpt
    assert ("faketimmopt", False) in timm.optim.CALLS, "the class itself, not a partial with timm's defaults"
    other = optcore.resolve("momentumish")  # timm's name for a torch class keeps timm's name
    assert (other.name, other.qualified, other.target) == ("momentumish", "timm.optim:momentumish", torch.optim.SGD)
    assert optcore.resolve("timm:momentumish").target is torch.optim.SGD
    with pytest.raises(ConfigError, match="CUDA required"):
        optcore.resolve("needsgpu")
    with pytest.raises(ConfigError, match="the builtin_function_or_method builtins.print, not a class"):
        optcore.resolve("notaclass")
    qualified = {s.qualified for s in optcore.list_optimizers(ask_packages=True)}
    assert "timm.optim:FakeTimmOpt" in qualified and "timm.optim:needsgpu" not in qualified


def test_a_name_no_registry_has_is_still_not_found():
    with pytest.raises(OptimizerNotFoundError) as info:
        optcore.resolve("Shampooo")
    assert "shampoo" in [s.lower() for s in info.value.suggestions]
