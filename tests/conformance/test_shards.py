"""The sharded full run: parts are disjoint and cover the selection, and the merge refuses
a missing or mixed set instead of writing a summary that silently lacks samples."""

from __future__ import annotations

import json
import os

import pytest

from . import conftest
from .conftest import Results
from .harness import Outcome
from .summary import merge_shards, write_shard


def test_shards_partition_the_selection():
    ids = [f"op{i}-float32" for i in range(500)]
    parts = []
    for i in (1, 2, 3):
        conftest.SHARD = (i, 3)
        parts.append({t for t in ids if conftest.in_shard(t)})
    conftest.SHARD = None
    assert set().union(*parts) == set(ids)
    assert sum(map(len, parts)) == len(ids)
    assert all(parts)


def _shard(tmp_path, i, n, rows, failed=()):
    r = Results()
    for row in rows:
        r.add(*row)
    write_shard(r, str(tmp_path), (i, n), list(failed), 1 if failed else 0, part="test_opinfo")


def test_merge_adds_every_shard(tmp_path):
    _shard(tmp_path, 1, 2, [("abs", "float32", 0, Outcome("pass", "fn"), None)])
    _shard(
        tmp_path,
        2,
        2,
        [
            ("sin", "float32", 0, Outcome("wrong", "fn", "values"), None),
            ("sin", "float32", 1, Outcome("pass", "out"), None),
        ],
        failed=["t::sin"],
    )
    merge_shards(str(tmp_path))
    with open(os.path.join(tmp_path, "conformance.json")) as f:
        meta = json.load(f)["meta"]
    assert meta["samples"] == 3
    assert meta["counts"]["wrong"] == 1 and meta["counts"]["pass"] == 2
    assert meta["failed_tests"] == ["t::sin"]
    assert "failed tests: t::sin" in open(os.path.join(tmp_path, "conformance.md")).read()


def test_merge_refuses_a_missing_shard(tmp_path):
    _shard(tmp_path, 1, 3, [("abs", "float32", 0, Outcome("pass", "fn"), None)])
    _shard(tmp_path, 3, 3, [("abs", "float64", 0, Outcome("pass", "fn"), None)])
    with pytest.raises(SystemExit, match=r"shards \[2\] of 3"):
        merge_shards(str(tmp_path))
    assert not os.path.exists(os.path.join(tmp_path, "conformance.json"))


def test_merge_refuses_mixed_splits(tmp_path):
    _shard(tmp_path, 1, 2, [("abs", "float32", 0, Outcome("pass", "fn"), None)])
    _shard(tmp_path, 1, 3, [("abs", "float32", 0, Outcome("pass", "fn"), None)])
    with pytest.raises(SystemExit, match="different splits"):
        merge_shards(str(tmp_path))


def test_merge_asks_which_part(tmp_path):
    _shard(tmp_path, 1, 1, [("abs", "float32", 0, Outcome("pass", "fn"), None)])
    write_shard(Results(), str(tmp_path), (1, 1), [], 0, part="test_cross_sample")
    with pytest.raises(SystemExit, match="name the part"):
        merge_shards(str(tmp_path))
    assert merge_shards(str(tmp_path), "test_opinfo")["failed_tests"] == []


def test_collecting_a_shard_writes_no_rows(tmp_path, monkeypatch):
    # (a collect-only run once left an empty shard, which make conformance-resume took as done)
    import types

    monkeypatch.setattr(conftest, "SHARD", (1, 64))
    plugins = types.SimpleNamespace(get_plugin=lambda name: None)

    def finish(collectonly):
        opt = types.SimpleNamespace(keyword="", markexpr="", collectonly=collectonly, lf=False)
        config = types.SimpleNamespace(option=opt, args=[], rootpath=tmp_path / str(collectonly), pluginmanager=plugins)
        conftest.pytest_sessionfinish(types.SimpleNamespace(config=config, items=[]), 0)
        return list((tmp_path / str(collectonly)).rglob("*-of-64.json"))

    assert not finish(collectonly=True)
    assert finish(collectonly=False)  # (the control: a run's shard is written)


def test_a_shard_names_the_commit_its_run_started_at(tmp_path):
    # a long run's checkout moved on before its shard was written: the shard named the later commit
    r = Results()
    assert r.commit  # read at the start, from the checkout
    r.commit = "abc1234"
    write_shard(r, str(tmp_path), (1, 1), [], 0, part="test_opinfo")
    with open(tmp_path / "shards" / "test_opinfo" / "1-of-1.json") as f:
        assert json.load(f)["commit"] == "abc1234"
