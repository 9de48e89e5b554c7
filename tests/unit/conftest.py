import os

import pytest


@pytest.fixture(autouse=True)
def _no_ambient_laneway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests see the documented defaults, not the shell's LANEWAY_* variables."""
    for name in list(os.environ):
        if name.startswith("LANEWAY_"):
            monkeypatch.delenv(name)
