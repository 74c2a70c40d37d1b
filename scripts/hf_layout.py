"""config.json layouts of transformers 5 and 4.x, shared by the scripts in this folder.

transformers 5 writes `dtype` and a `rope_parameters` block (with `rope_theta` inside); 4.x and
most published models write `torch_dtype`, a top-level `rope_theta` and `rope_scaling`. 4.x
silently ignores `rope_parameters` (falling back to rope_theta 10000, i.e. wrong logits), so the
scripts write and read the older layout where it matters. The C++ reader accepts both.
"""
from __future__ import annotations

from typing import Any


def legacy_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 config.json dict -> the 4.x layout (keys sorted, as save_pretrained does)."""
    out = dict(cfg)
    if "dtype" in out:
        out["torch_dtype"] = out.pop("dtype")
    rope = out.pop("rope_parameters", None)
    if rope is not None:
        rope_theta, scaling = split_rope_parameters(rope)
        if rope_theta is not None:
            out["rope_theta"] = rope_theta
        out["rope_scaling"] = scaling
    return dict(sorted(out.items()))


def split_rope_parameters(rope: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """transformers 5's `rope_parameters` -> (rope_theta, rope_scaling or None for the default type)."""
    rope = dict(rope)
    rope_theta = rope.pop("rope_theta", None)
    return rope_theta, (rope if rope.get("rope_type", "default") != "default" else None)
