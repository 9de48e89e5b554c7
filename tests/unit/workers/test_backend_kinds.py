"""The one list of backend kinds, and what is derived from it."""

import importlib
from typing import get_args

import pytest

from schemas.backends import BACKEND_KINDS, BackendKind, backend_kind
from schemas.errors import BackendUnavailable
from schemas.settings import BackendSettings
from streams.routing.registry import ModelEntry
from workers.backends import create_backend


@pytest.mark.parametrize("kind", BACKEND_KINDS.values(), ids=lambda k: k.name)
def test_each_kind_names_a_backend_class_and_a_settings_field(kind: BackendKind) -> None:
    module_name, class_name = kind.target.split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    assert backend_class.kind == kind.name
    if kind.max_batch_field is not None:
        assert kind.max_batch_field in BackendSettings.model_fields
    assert backend_kind(kind.name) is kind


def test_the_configured_names_are_the_registrys() -> None:
    for annotation in (
        BackendSettings.model_fields["light"].annotation,
        BackendSettings.model_fields["heavy"].annotation,
        ModelEntry.model_fields["backend"].annotation,
    ):
        assert set(get_args(annotation)) == set(BACKEND_KINDS)
    assert backend_kind("tpu") is None


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(BackendUnavailable, match=r"choose one of .*'llamacpp'"):
        create_backend("tpu", "m", BackendSettings())
