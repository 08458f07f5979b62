"""Torch sources: a site-packages dir, the torch package dir, a checkout, a wheel read in place."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from reader.source.anchors import Resolver
from reader.source.index import IndexCache
from reader.source.torch_source import DirSource, SourceError, WheelSource, installed_root, open_source
from tests.reader.reader_support import TorchTree

SYMBOL = "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard"


def test_site_packages_and_torch_package_dir(torch_tree: TorchTree):
    for given in (torch_tree.root, torch_tree.root / "torch"):
        source = open_source(given)
        assert isinstance(source, DirSource) and source.kind == "site-packages"
        assert source.location == torch_tree.root
        assert source.version == "2.13.0+cpu"
        assert source.git_version == "0123456789abcdef0123456789abcdef01234567"
        assert source.module_file("torch.distributed.fsdp._flat_param") == "torch/distributed/fsdp/_flat_param.py"
        assert source.module_file("torch.distributed.fsdp") == "torch/distributed/fsdp/__init__.py"
        assert source.module_file("torch.distributed.nothing") is None
        assert "_runtime_utils.py" in source.list_dir("torch/distributed/fsdp")


def test_checkout_reads_version_txt_and_git_head(torch_tree: TorchTree):
    torch_tree.path("torch/version.py").unlink()  # generated at build time: a fresh checkout has none
    torch_tree.write("version.txt", "2.14.0a0\n")
    torch_tree.write(".git/HEAD", "ref: refs/heads/main\n")
    torch_tree.write(".git/packed-refs", "# pack-refs\n" + "ab" * 20 + " refs/heads/main\n")
    source = open_source(torch_tree.root)
    assert source.kind == "checkout"
    assert (source.version, source.git_version) == ("2.14.0a0", "ab" * 20)


def test_wheel_is_read_in_place(torch_tree: TorchTree, tmp_path: Path):
    wheel = torch_tree.wheel(tmp_path / "torch-2.99.0-cp311-none-any.whl")
    torch_tree.path("torch/version.py").unlink()
    wheel_no_version_py = torch_tree.wheel(tmp_path / "torch-2.99.1-cp311-none-any.whl", version="2.99.1")
    before = sorted(p.name for p in tmp_path.iterdir())
    source = open_source(wheel)
    assert isinstance(source, WheelSource)
    assert source.version == "2.13.0+cpu"  # torch/version.py inside the wheel wins
    assert open_source(wheel_no_version_py).version == "2.99.1"  # else the dist-info METADATA
    assert source.list_dir("torch/distributed/fsdp") == ["__init__.py", "_flat_param.py", "_runtime_utils.py"]
    resolved = Resolver(source, IndexCache()).resolve(SYMBOL)
    assert resolved.display_path.endswith("!/torch/distributed/fsdp/_flat_param.py")
    assert resolved.relpath == "torch/distributed/fsdp/_flat_param.py"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing was extracted
    source.close()


def test_wheel_and_directory_resolve_identically(torch_tree: TorchTree, tmp_path: Path):
    wheel = open_source(torch_tree.wheel(tmp_path / "t.whl"))
    directory = open_source(torch_tree.root)
    a = Resolver(wheel, IndexCache()).resolve(SYMBOL)
    b = Resolver(directory, IndexCache()).resolve(SYMBOL)
    assert (a.text, a.start, a.end, a.fingerprints) == (b.text, b.start, b.end, b.fingerprints)


def test_bad_sources_are_explained(tmp_path: Path):
    with pytest.raises(SourceError, match="no such file"):
        open_source(tmp_path / "missing")
    with pytest.raises(SourceError, match="expected a torch wheel"):
        open_source(tmp_path)
    not_zip = tmp_path / "x.whl"
    not_zip.write_text("not a zip")
    with pytest.raises(SourceError, match="not a readable wheel"):
        open_source(not_zip)
    other = tmp_path / "numpy.whl"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("numpy/__init__.py", "")
    with pytest.raises(SourceError, match=r"no torch/__init__\.py"):
        open_source(other)


def test_installed_torch_is_found_without_importing_it():
    root = installed_root()
    assert (root / "torch" / "__init__.py").is_file()
    source = open_source()
    assert source.kind == "installed" and source.version
