"""Slurm hostlist expansion (hypocenter/collector/hostlist.py)."""

from __future__ import annotations

import pytest

from hypocenter.collector.hostlist import MAX_HOSTS, HostlistError, expand, expand_hostlist
from hypocenter.server import attempts


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node01", ["node01"]),
        ("gpu-a[01-03,07]", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07"]),
        ("gpu-a[01-16,20]", [f"gpu-a{i:02d}" for i in range(1, 17)] + ["gpu-a20"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("rack[1,3]-n[1-2,5]", ["rack1-n1", "rack1-n2", "rack1-n5", "rack3-n1", "rack3-n2", "rack3-n5"]),
        ("a[1-2],b,c[5]", ["a1", "a2", "b", "c5"]),
        ("a[1-2] b[7]", ["a1", "a2", "b7"]),
        ("nid[00098-00101]", ["nid00098", "nid00099", "nid00100", "nid00101"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[98-100]", ["n98", "n99", "n100"]),
        ("n[1-3]x", ["n1x", "n2x", "n3x"]),
        ("[1-2]n", ["1n", "2n"]),
        ("gpu-b[14-15],gpu-c[01,03],login1", ["gpu-b14", "gpu-b15", "gpu-c01", "gpu-c03", "login1"]),
        ("n[1-2],n[2-3]", ["n1", "n2", "n3"]),
        ("h1.example.com,h[2-3].example.com", ["h1.example.com", "h2.example.com", "h3.example.com"]),
        ('["x1", "x2"]', ["x1", "x2"]),
        ("", []),
        ("(null)", []),
        ("None assigned", []),
        (" node[1-2] ", ["node1", "node2"]),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("n[1-3", "'[' without ']'"),
        ("n1-3]", "']' without '['"),
        ("n[[1-2]]", "nested"),
        ("n[a-c]", "not a number"),
        ("n[5-3]", "backwards"),
        ("n[1-]", "not a number"),
        ("n[]", "not a number"),
        (f"n[0-{MAX_HOSTS}]", "more than"),
        ("a[1-300]-b[1-300]", "more than"),
    ],
)
def test_malformed_is_a_clear_error(text: str, problem: str) -> None:
    with pytest.raises(HostlistError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        expand(text)


def test_lenient_expansion_keeps_malformed_parts() -> None:
    assert expand_hostlist("n[1-2],bad[x],m3") == ["n1", "n2", "bad[x]", "m3"]
    assert expand_hostlist("n[1-3") == ["n[1-3"]


def test_attempts_still_exports_expand_hostlist() -> None:
    assert attempts.expand_hostlist is expand_hostlist
    assert attempts.expand_hostlist("node[01-03,07],gpu-a1") == [
        "node01",
        "node02",
        "node03",
        "node07",
        "gpu-a1",
    ]
