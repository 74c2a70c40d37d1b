"""What the plotting scripts of this folder share: matplotlib without a display, and the rule that
the repository's committed plots (docs/img) are only replaced when asked with --update-docs."""
from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")

DOCS_IMG = pathlib.Path(__file__).resolve().parent.parent / "docs" / "img"


def refuse_docs_img(out_dir, update_docs: bool) -> None:
    """Exits when out_dir is the repository's docs/img (committed plots) without --update-docs."""
    out = pathlib.Path(out_dir).resolve()
    if not update_docs and (out == DOCS_IMG or DOCS_IMG in out.parents):
        sys.exit(f"{pathlib.Path(sys.argv[0]).name}: refusing to write into {DOCS_IMG} (the committed "
                 "plots of the docs); write elsewhere, or pass --update-docs to replace them")
