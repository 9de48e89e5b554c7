import os

import pytest


@pytest.fixture(autouse=True)
def _no_ambient_laneway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests see the documented defaults, not the shell's LANEWAY_* variables."""
    for name in list(os.environ):
        if name.startswith("LANEWAY_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _no_users_stack_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A `laneway up` the user runs on this machine is not the tests' stack:
    commands run here read (and `up`/`demo` write) a stack file of their own."""
    folder = tmp_path_factory.mktemp("stack-file")
    monkeypatch.setenv("LANEWAY_STACK_FILE", str(folder / "stack.json"))
