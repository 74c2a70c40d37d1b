#!/usr/bin/env bash
# Makes a virtualenv of your own that sees the packages of another Python (by default the set-up's
# shared virtualenv, $LOSSFNS_PYTHON of build/setup.env: torch 2.11, scikit-build-core, ...)
# without a second 2.7 GB torch: `python -m venv DIR`, then a .pth file in it naming that Python's
# site-packages. What you pip-install goes into DIR, and comes first; the shared virtualenv is
# left as it is.
#
#   bash scripts/venv_with_torch.sh ~/venvs/kd             # then: ~/venvs/kd/bin/python -m pip install --no-build-isolation .
#   bash scripts/venv_with_torch.sh ~/venvs/kd /path/to/python   # share that Python's packages instead
#
# (`python -m venv --system-site-packages` does not do this when the python is itself a
# virtualenv's: it shares the base interpreter's packages, not the virtualenv's.)
set -euo pipefail

usage="usage: bash scripts/venv_with_torch.sh DIR [PYTHON]"
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
dir="$1"
py="${2:-}"
if [ -z "$py" ]; then
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  env_file="$root/build/setup.env"
  [ -f "$env_file" ] || {
    echo "venv_with_torch.sh: $env_file does not exist; run \`bash scripts/setup.sh\` (or make) first, or name a python: $usage" >&2
    exit 1
  }
  py="$(sed -n 's/^LOSSFNS_PYTHON=//p' "$env_file")"
  [ -n "$py" ] || {
    echo "venv_with_torch.sh: $env_file names no LOSSFNS_PYTHON; run \`bash scripts/setup.sh\` again, or name a python: $usage" >&2
    exit 1
  }
fi
{ [ -e "$dir" ] || [ -L "$dir" ]; } && {
  echo "venv_with_torch.sh: $dir already exists; choose a new directory (nothing was changed)" >&2
  exit 1
}
"$py" -c 'import torch' 2>/dev/null || {
  echo "venv_with_torch.sh: $py cannot import torch; name a python that has torch 2.11: $usage" >&2
  exit 1
}
"$py" -m venv "$dir"
site_dir="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# One "import" line: site.addsitedir also runs the .pth files of those directories (editable
# installs, ...), which plain path lines would not.
"$py" -c 'import site; print("import site; " + "; ".join("site.addsitedir(%r)" % d for d in site.getsitepackages()))' \
  > "$site_dir/lossfns_shared_packages.pth"
torch_at="$("$dir/bin/python" -c 'import torch; print(torch.__version__, torch.__file__)')"
echo "$dir: a virtualenv that sees torch $torch_at"
echo "install the package into it with: $dir/bin/python -m pip install --no-build-isolation ."
