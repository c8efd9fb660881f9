"""Where a fixture's separate draft model is (Gemma 4's assistant, `--draft-model`): beside its target.

A leaf: the fixture writers (`mtp_rows`, `assistant_rows`) and the gates' fixture lookup (`specs`, which
also runs on a board) all name the file from here."""

from __future__ import annotations

from pathlib import Path


def draft_model_of(model: Path) -> Path:
    """The assistant file beside `model`."""
    return model.with_name(model.name.removesuffix(".gguf") + "-assistant.gguf")
