"""Slurm host lists, as `scontrol show hostnames` and SLURM_JOB_NODELIST write them."""

from __future__ import annotations

import pytest

from mgpu.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node001", ["node001"]),
        ("node[001-003]", ["node001", "node002", "node003"]),
        ("node[1-2,5],login", ["node1", "node2", "node5", "login"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("h-1,h-2", ["h-1", "h-2"]),
        ("", []),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize(
    ("hosts", "text"),
    [
        (["node001", "node002", "node003", "node004"], "node[001-004]"),
        (["node1", "node2", "node4"], "node[1-2,4]"),
        (["gpu01"], "gpu01"),
        (["login", "node1", "node2"], "login,node[1-2]"),
        (["node9", "node10"], "node[9-10]"),
        (["node08", "node09", "node10"], "node[08-10]"),
        (["h1", "h1", "h2"], "h[1-2]"),
        (["a.b.c", "myhost"], "a.b.c,myhost"),
    ],
)
def test_compress(hosts: list[str], text: str) -> None:
    assert compress(hosts) == text


def test_compress_then_expand_is_the_same_hosts() -> None:
    hosts = ["n01", "n02", "n07", "x", "n10", "m3"]
    assert sorted(expand(compress(hosts))) == sorted(hosts)


@pytest.mark.parametrize("text", ["node[1-", "node]1[", "node[a-b]", "node[5-2]", "n[0-999999]"])
def test_bad_lists_are_refused_in_a_sentence(text: str) -> None:
    with pytest.raises(HostlistError, match=r"node list|node range|host list"):
        expand(text)
