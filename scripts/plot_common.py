"""What the plotting scripts of this folder share: matplotlib without a display, and the rule that
the repository's committed plots (docs/img) are only replaced when asked with --update-docs."""
from __future__ import annotations

import json
import pathlib
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as _e:
    if "-h" not in sys.argv[1:] and "--help" not in sys.argv[1:]:  # the usage needs no matplotlib
        sys.exit(f"{pathlib.Path(sys.argv[0]).name}: error: matplotlib cannot be imported by "
                 f"{sys.executable} ({_e}); run the script with the set-up's python (LOSSFNS_PYTHON "
                 "in build/setup.env), or install matplotlib into this one")
    plt = None

DOCS_IMG = pathlib.Path(__file__).resolve().parent.parent / "docs" / "img"


def refuse_docs_img(out_dir, update_docs: bool) -> None:
    """Exits when out_dir is the repository's docs/img (committed plots) without --update-docs."""
    out = pathlib.Path(out_dir).resolve()
    if not update_docs and (out == DOCS_IMG or DOCS_IMG in out.parents):
        sys.exit(f"{pathlib.Path(sys.argv[0]).name}: refusing to write into {DOCS_IMG} (the committed "
                 "plots of the docs); write elsewhere, or pass --update-docs to replace them")


def _name() -> str:
    return pathlib.Path(sys.argv[0]).name


def file_args(doc: str) -> tuple[list[str], bool]:
    """The positional arguments and whether --update-docs was given; exits with the usage (`doc`)
    for -h/--help, no argument, or an option the script does not know."""
    argv = sys.argv[1:]
    help = "-h" in argv or "--help" in argv
    if help or not argv or any(a.startswith("-") and a != "--update-docs" for a in argv):
        print(doc, file=sys.stdout if help else sys.stderr)
        sys.exit(0 if help else 2)
    return [a for a in argv if a != "--update-docs"], "--update-docs" in argv


def load_json(path, keys: list[str], made_by: str) -> dict:
    """The JSON object in `path` with `keys`; exits with one line naming the file and what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        sys.exit(f"{_name()}: error: cannot read {path}: {e.strerror or e}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        sys.exit(f"{_name()}: error: {path} is not JSON ({e}); give the JSON that {made_by} writes")
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        sys.exit(f"{_name()}: error: {path} has no {', '.join(repr(k) for k in missing)}: not the JSON "
                 f"that {made_by} writes")
    return data


def save_figure(fig, dst) -> None:
    """Writes `fig` to `dst` (its directory made first) and says so; exits with one line where it
    cannot."""
    dst = pathlib.Path(dst)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(dst, dpi=110)
    except ValueError as e:  # an extension matplotlib has no writer for
        sys.exit(f"{_name()}: error: {dst}: {e}")
    except OSError as e:
        sys.exit(f"{_name()}: error: cannot write {dst}: {e}")
    print(f"{_name()}: wrote {dst}")
