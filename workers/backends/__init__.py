"""Model backends behind one small interface (``workers.backends.base.Backend``)."""

from workers.backends.base import (
    Backend,
    Generation,
    GenerationInput,
    Outcome,
    create_backend,
    errors_of,
    map_backend_exception,
)

__all__ = [
    "Backend",
    "Generation",
    "GenerationInput",
    "Outcome",
    "create_backend",
    "errors_of",
    "map_backend_exception",
]
