"""A new model version in the registry file: ``laneway models register``.

A version with a LoRA adapter (``ModelEntry.adapter``), most often a
student that ``laneway distill student`` trained, joins its path as a
``shadow`` (or a ``canary`` at share 0): it copies the path's active
version (backend, lanes, capability, cost) with its own name, version,
state and adapter. The student's provenance, ``student.json`` beside its
adapter (``schemas.student``), decides whether it is offered at all: a student whose held-out
agreement did not beat its base model's says ``offered: false`` and is
refused with its reason unless forced.

The registry file is what every process reads at start (workers load every
version it lists that is not retired); the roll-out state in Redis then
moves the version on (``laneway models shadow/canary/promote``). The file
keeps its comments where the new entry can be appended to it as text (a
block-style ``models:`` list at its end), else it is written afresh.

Pure functions, but for ``write_registry`` (an atomic replace of the file).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from schemas.messages import AnswerPath
from schemas.student import PROVENANCE_FILE, ProvenanceError, StudentProvenance
from streams.routing.registry import ModelEntry, ModelRegistry

__all__ = [
    "RegisterError",
    "new_version",
    "provenance_line",
    "read_student",
    "registry_text",
    "student_dir",
    "write_registry",
]

RegisterState = Literal["shadow", "canary"]


class RegisterError(ValueError):
    """A version that cannot be registered; the message says why."""


def student_dir(adapter: Path) -> Path:
    """The directory whose ``student.json`` describes ``adapter`` (a file's
    folder, or the directory itself)."""
    return adapter if adapter.is_dir() else adapter.parent


def read_student(adapter: Path) -> StudentProvenance | None:
    """The provenance beside ``adapter``; ``None`` when there is none.
    A ``student.json`` that cannot be read is a ``RegisterError``."""
    path = student_dir(adapter) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        return StudentProvenance.read(path)
    except ProvenanceError as exc:
        raise RegisterError(str(exc)) from exc


def new_version(
    registry: ModelRegistry,
    path: AnswerPath,
    version: str,
    adapter: Path,
    student: StudentProvenance | None,
    *,
    state: RegisterState = "shadow",
    share: float | None = None,
    model: str | None = None,
    force: bool = False,
) -> ModelEntry:
    """``path``'s new ``version``: its active version's settings, with
    ``adapter``, ``state`` and ``share`` (a canary's default: 0), and the
    model ``model`` (else the student's base model, else the active one's).
    Refused (``RegisterError``): a path the registry lacks, a version it
    has, and, unless ``force``, an adapter without provenance or a student
    not offered for promotion."""
    active = registry.for_path(path)
    if active is None:
        known = [str(p) for p in registry.model_paths]
        raise RegisterError(f"no model path {path!s} in the registry: it has {known}")
    versions = [m.version for m in registry.versions(path)]
    if version in versions:
        raise RegisterError(f"path {path!s} already has version {version!r}: it has {versions}")
    if not force:
        if student is None:
            raise RegisterError(
                f"no {PROVENANCE_FILE} beside {adapter}: nothing says what it learned or whether "
                "it beat its base model (--force registers it all the same)"
            )
        if not student.offered:
            raise RegisterError(
                f"the student at {student_dir(adapter)} is not offered for promotion: "
                f"{student.reason or 'no reason given'} (--force registers it all the same)"
            )
    name = model or (student.base_model if student is not None else None) or active.name
    if state == "canary" and share is None:
        share = 0.0
    try:
        return ModelEntry.model_validate(
            {
                **active.model_dump(),
                "name": name,
                "version": version,
                "state": state,
                "share": share,
                "adapter": adapter,
            }
        )
    except ValidationError as exc:
        raise RegisterError(f"version {version} of {path!s}: {exc}") from exc


def _entry_data(entry: ModelEntry) -> dict[str, Any]:
    """``entry`` as the registry file writes it: only what differs from
    the defaults, paths and enums as strings."""
    data = entry.model_dump(mode="json", exclude_defaults=True)
    data.setdefault("name", entry.name)
    data.setdefault("version", entry.version)
    data["backend"] = entry.backend
    data["path"] = str(entry.path)
    return data


def registry_text(old: str | None, builtin: ModelRegistry, entry: ModelEntry) -> str:
    """The registry file's text with ``entry`` added: ``old`` with the entry
    appended as a block-list item when that parses to ``old``'s models plus
    the entry (comments kept), else the models written afresh. ``old``
    ``None``: no file yet, so ``builtin``'s models and the entry."""
    before = builtin if old is None else ModelRegistry.model_validate(yaml.safe_load(old))
    added = ModelRegistry(models=(*before.models, entry))
    if old is not None:
        item = yaml.safe_dump([_entry_data(entry)], sort_keys=False, default_flow_style=False)
        base = old if old.endswith("\n") else old + "\n"
        for indent in ("  ", "", "    "):
            text = base + "".join(indent + line + "\n" for line in item.splitlines())
            with contextlib.suppress(yaml.YAMLError, ValidationError, TypeError):
                if ModelRegistry.model_validate(yaml.safe_load(text)) == added:
                    return text
    data = {"models": [_entry_data(m) for m in added.models]}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_registry(path: Path, text: str) -> None:
    """Replace the file at ``path`` with ``text`` at once: a process that
    starts meanwhile reads the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def provenance_line(student: StudentProvenance) -> str:
    """One line of what ``laneway models list`` shows under a student's row."""
    base, learned = student.metrics.base_agreement, student.metrics.student_agreement
    agreement = (
        f"agreement {base:.0%} -> {learned:.0%}"
        if base is not None and learned is not None
        else "agreement not measured"
    )
    window = f", traffic {student.window.start}..{student.window.end}" if student.window else ""
    offered = "offered" if student.offered else f"not offered: {student.reason}"
    return (
        f"student of {student.base_model} from {student.teacher}: "
        f"{student.rows.train} rows ({student.rows.held_out} held out)"
        f"{window}, {agreement}; {offered}"
    )
