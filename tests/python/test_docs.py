"""The Python examples of README.md and docs/python.md run as written."""

from __future__ import annotations

import re

import pytest

from conftest import SOURCE_DIR, Daemon


def python_blocks(path: str) -> list[str]:
    text = (SOURCE_DIR / path).read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.fixture(scope="module")
def big_daemon(tmp_path_factory):
    # The examples use Qwen3-Next's real shape: 16 int8 pages of 20 MiB.
    d = Daemon(tmp_path_factory.mktemp("docs"), pool_capacity="1GiB")
    yield d
    assert d.stop() == 0, d.log()


@pytest.mark.parametrize("path", ["README.md", "docs/python.md"])
def test_examples_run(big_daemon, path):
    blocks = python_blocks(path)
    assert blocks, f"no python block in {path}"
    for code in blocks:
        if "statepool.connect(" not in code:
            continue
        code = code.replace('"/run/statepool/statepool.sock"', repr(big_daemon.socket))
        exec(compile(code, path, "exec"), {})
