"""Choosing where episodes are played (``rollout.backend``): here, or on Ray actors. Apart from
``backend.py`` so that the backend protocol and the Ray backend never import each other."""

from __future__ import annotations

from typing import Any, Callable, Literal

from streamrl.policy.protocols import ChatCodec, InferenceEngine
from streamrl.rollout.backend import EpisodeBackend, LocalBackend, WorkerSpec

BackendKind = Literal["local", "ray"]


def make_backend(
    kind: BackendKind,
    spec: WorkerSpec,
    *,
    concurrency: int,
    engine: InferenceEngine,
    codec: ChatCodec,
    weights: Callable[[], dict[str, Any]],
    workers: int = 1,
) -> EpisodeBackend:
    """The backend of ``rollout.backend``: ``local`` plays on ``engine`` in this process; ``ray``
    starts ``workers`` actors built from ``spec``, serving ``weights()`` (read at start and at each
    publish, put into the object store once per version) from ``engine.version`` on."""
    if kind == "local":
        return LocalBackend(engine, codec, spec.make_env, spec.make_parser(codec), spec.make_prompt_builder(),
                            spec.episode, concurrency)
    if kind == "ray":
        from streamrl.rollout.ray_backend import RayBackend

        return RayBackend(spec, workers=workers, concurrency=concurrency, weights=weights, version=engine.version)
    raise ValueError(f"rollout.backend must be 'local' or 'ray', got {kind!r}")
