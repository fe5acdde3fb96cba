"""gpuserve/data/gates: the shipped pins and expectations load, and bad data is refused
with an error naming the file and the field."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
import yaml

from gpuserve.errors import InputError
from gpuserve.measure import gates


def test_shipped_sources_are_pinned():
    sources = gates.load_sources()
    nccl, samples = sources["nccl-tests"], sources["cuda-samples"]
    # The commit the reference notes built (gpu-gates.md: NVIDIA/nccl-tests@a0b82b2260cf).
    assert nccl.commit == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432" and nccl.tag == "v2.19.6"
    assert samples.commit == "3f1c50965017932fc81e6d94a3fc9e04c105b312" and samples.tag == "v13.0"
    assert {"all_reduce_perf", "all_gather_perf", "alltoall_perf"} <= set(nccl.binaries)
    assert samples.binaries == ("p2pBandwidthLatencyTest",)
    notes = " ".join(nccl.build["notes"])
    assert "libnccl.so -> libnccl.so.2" in notes and "cannot find -lcudadevrt" in notes
    assert samples.build["subdir"] == "Samples/5_Domain_Specific/p2pBandwidthLatencyTest"


def test_commit_check_after_checkout():
    nccl = gates.load_sources()["nccl-tests"]
    nccl.check_commit("a0b82b2260cf5152b9f8c061bbf7eaf0ba096432\n")
    with pytest.raises(InputError, match=r"tools.nccl-tests.commit: checkout is at '5bcd45d"):
        nccl.check_commit("5bcd45d2ee8365e37895e118c9d11b0ebc15aa69", "/opt/gpuserve/nccl-tests")
    with pytest.raises(InputError, match="no pinned sha256"):
        nccl.check_archive(b"")


def test_mirror_override_keeps_the_pin():
    sources = gates.load_sources(overrides={"nccl-tests": {"url": "http://mirror.lan/nccl-tests.git"}})
    assert sources["nccl-tests"].url == "http://mirror.lan/nccl-tests.git"
    assert sources["nccl-tests"].commit == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"
    assert sources["cuda-samples"].url == "https://github.com/NVIDIA/cuda-samples.git"
    with pytest.raises(InputError, match="gates_sources.nccl: unknown tool"):
        gates.load_sources(overrides={"nccl": {"url": "http://mirror.lan/x.git"}})
    with pytest.raises(InputError, match="may only set 'url'"):
        gates.load_sources(overrides={"nccl-tests": {"commit": "0" * 40}})


def _write(tmp_path: Path, doc: dict, name: str) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _sources_doc() -> dict:
    return yaml.safe_load(gates.SOURCES_PATH.read_text())


def test_archive_sha256_mismatch_is_refused(tmp_path):
    data = b"cuda-samples-13.0.tar.gz bytes"
    doc = _sources_doc()
    doc["tools"]["cuda-samples"].pop("commit")
    doc["tools"]["cuda-samples"]["url"] = "https://example.org/cuda-samples-13.0.tar.gz"
    doc["tools"]["cuda-samples"]["sha256"] = hashlib.sha256(data).hexdigest()
    src = gates.load_sources(_write(tmp_path, doc, "sources.yaml"))["cuda-samples"]
    src.check_archive(data)
    with pytest.raises(InputError, match=r"tools.cuda-samples.sha256: archive sha256 is "):
        src.check_archive(data + b"x", "cuda-samples-13.0.tar.gz")


@pytest.mark.parametrize(("edit", "field", "words"), [
    (lambda d: d["tools"]["nccl-tests"].update(commit="a0b82b2260cf"), "tools.nccl-tests.commit",
     "full 40-hex"),
    (lambda d: d["tools"]["nccl-tests"].pop("commit"), "tools.nccl-tests", "needs a pinned"),
    (lambda d: d["tools"]["cuda-samples"].update(sha256="ABC"), "tools.cuda-samples.sha256",
     "64 lowercase hex"),
    (lambda d: d["tools"]["nccl-tests"].pop("source"), "tools.nccl-tests.source", "where"),
    (lambda d: d["tools"]["nccl-tests"].update(url="github.com/x"), "tools.nccl-tests.url",
     "must be a URL"),
    (lambda d: d.update(schema="v0"), "schema", "gpuserve.gate-sources/1"),
])
def test_bad_sources(tmp_path, edit, field, words):
    doc = _sources_doc()
    edit(doc)
    path = _write(tmp_path, doc, "sources.yaml")
    with pytest.raises(InputError) as info:
        gates.load_sources(path)
    assert f"{path}: {field}: " in str(info.value) and words in str(info.value)


# ---------------------------------------------------------------- expectations


def test_shipped_expectations():
    exp = gates.load_expectations()
    assert set(exp.classes) == set(gates.TOPOLOGY_CLASSES)
    for name, checks in exp.classes.items():
        assert checks, name
        busbw = [c for c in checks if c.metric == "all_reduce_busbw"]
        assert len(busbw) == 1 and busbw[0].size_bytes >= 2**30, name  # a fixed large size
        for c in checks:
            assert c.source.strip() and 0 <= c.tolerance <= 1
            assert (c.expected is None) == c.baseline
    nv = {c.key: c for c in exp.classes["nvlink4"]}
    assert nv["all_reduce_busbw@4294967296"].expected == 475
    pcie = {c.key: c for c in exp.classes["pcie5-x16-p2p"]}
    assert 37 <= pcie["all_reduce_busbw@2147483648"].expected <= 41
    assert pcie["p2p_unidir_best"].expected == 53
    no_p2p = exp.classes["pcie-no-p2p"][0]
    assert no_p2p.baseline and no_p2p.floor == 10 and no_p2p.tolerance == 0.3
    assert exp.p2p_margin == 0.1 and exp.latency_ratio_max == 0.5


def _exp_doc() -> dict:
    return yaml.safe_load(gates.EXPECTATIONS_PATH.read_text())


def _first_check(d: dict) -> dict:
    return d["classes"]["nvlink4"]["checks"][0]


@pytest.mark.parametrize(("edit", "field", "words"), [
    (lambda d: d["classes"].update({"pcie7-x32": copy.deepcopy(d["classes"]["pcie-p2p"])}),
     "classes.pcie7-x32", "unknown topology class"),
    (lambda d: d["classes"].pop("pcie-no-p2p"), "classes", "missing topology class"),
    (lambda d: _first_check(d).update(unit="Gbit/s"), "classes.nvlink4.checks[0].unit",
     "unknown unit 'Gbit/s'"),
    (lambda d: _first_check(d).update(metric="busbw"), "classes.nvlink4.checks[0].metric",
     "unknown metric"),
    (lambda d: _first_check(d).update(tolerance=1.5), "classes.nvlink4.checks[0].tolerance",
     "from 0 to 1"),
    (lambda d: _first_check(d).update(tolerance=-0.1), "classes.nvlink4.checks[0].tolerance",
     "from 0 to 1"),
    (lambda d: _first_check(d).pop("source"), "classes.nvlink4.checks[0].source",
     "needs a source"),
    (lambda d: _first_check(d).update(baseline=True), "classes.nvlink4.checks[0]",
     "not both"),
    (lambda d: _first_check(d).pop("size_bytes"), "classes.nvlink4.checks[0].size_bytes",
     "fixed size"),
    (lambda d: d["choice"].update(p2p_margin=2), "choice.p2p_margin", "from 0 to 1"),
    (lambda d: d["classes"]["nvlink4"]["checks"][2].update(floor=5),
     "classes.nvlink4.checks[2].floor", "only bandwidths have a floor"),
])
def test_bad_expectations(tmp_path, edit, field, words):
    doc = _exp_doc()
    edit(doc)
    path = _write(tmp_path, doc, "expectations.yaml")
    with pytest.raises(InputError) as info:
        gates.load_expectations(path)
    assert f"{path}: {field}: " in str(info.value) and words in str(info.value)
