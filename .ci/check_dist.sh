#!/usr/bin/env bash
# What a user installing mcp-handles from the package index gets. Builds the sdist and, from it, the wheel
# (from a copy of the checkout, so nothing is written into it); checks their metadata as the index will;
# installs the wheel into a fresh virtual environment outside the checkout; and there checks
# `handles --version`, the py.typed marker, that no `example_server` is installed, and runs the example's
# demo end to end with the sdist's example_server next to it and the wheel's handles.
#
# Usage: .ci/check_dist.sh [PYTHON]   PYTHON has build and twine (the dev extra); default .venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
python=${1:-.venv/bin/python}
[[ $python == /* ]] || python=$checkout/$python
unset PYTHONPATH
started=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src" "$work/dist" "$work/sdist" "$work/run"
version=$("$python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

step() { printf '\n== %s (%ss)\n' "$1" "$((SECONDS - started))"; }

step "build the sdist, then the wheel from it"
git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$work/src"
"$python" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
sdist=$work/dist/mcp_handles-$version.tar.gz
wheel=$work/dist/mcp_handles-$version-py3-none-any.whl
ls "$sdist" "$wheel"

step "check the metadata as the package index will"
"$python" -m twine check --strict "$work"/dist/*

step "check what each archive holds"
"$python" - "$wheel" "$sdist" "$version" <<'EOF'
import sys
import tarfile
import zipfile

wheel, sdist, version = sys.argv[1:]
in_wheel = set(zipfile.ZipFile(wheel).namelist())
info = f"mcp_handles-{version}.dist-info"
top_level = {name.split("/")[0] for name in in_wheel} - {info}
assert top_level == {"handles"}, f"the wheel installs {sorted(top_level)}; only handles belongs there"
for wanted in ("handles/py.typed", "handles/migrations/versions/0001_initial.py", "handles/console/static/live.js",
               "handles/console/static/console.css", f"{info}/licenses/LICENSE"):
    assert wanted in in_wheel, f"the wheel lacks {wanted}"
in_sdist = {name.split("/", 1)[-1] for name in tarfile.open(sdist).getnames()}
for wanted in ("example_server/demo.py", "example_server/__main__.py", "LICENSE", "CHANGELOG.md", "handles/py.typed"):
    assert wanted in in_sdist, f"the sdist lacks {wanted}"
print(f"wheel: handles only, with py.typed and LICENSE ({len(in_wheel)} files); sdist: example_server, LICENSE, CHANGELOG.md")
EOF

step "install the wheel into a fresh virtual environment outside the checkout"
"$python" -m venv --without-pip "$work/venv"  # pip below is PYTHON's, installing into it
"$python" -m pip --python "$work/venv/bin/python" install --no-compile "$wheel" >"$work/install.log" 2>&1 \
    || { cat "$work/install.log"; exit 1; }
cd "$work/run"  # outside the checkout: nothing here but what the steps below put
mkdir "$work/tmp"  # the demo's state goes here, removed with the rest
user=(env -i "HOME=$HOME" "PATH=$work/venv/bin:/usr/bin:/bin" "LANG=C.UTF-8" "TMPDIR=$work/tmp")  # no HANDLES_*

step "handles --version, py.typed, and no example_server installed"
printed=$("${user[@]}" handles --version)
[[ $printed == "handles $version" ]] || { echo "handles --version printed '$printed', not 'handles $version'"; exit 1; }
echo "$printed"
"${user[@]}" python -c '
import sys, sysconfig
from pathlib import Path
import handles
package = Path(handles.__file__).parent
assert package.parent == Path(sysconfig.get_path("purelib")), f"handles imported from {package}, not the wheel"
assert (package / "py.typed").is_file(), "py.typed is not installed"
assert handles.__version__ == sys.argv[1], handles.__version__
print(f"handles {handles.__version__} from the wheel, with py.typed")
' "$version"
if "${user[@]}" python -c 'import example_server' 2>/dev/null; then
    echo "the wheel installed a top-level example_server"; exit 1
fi
echo "import example_server fails: the example is not installed"

step "run the example's demo from the sdist's copy, on the wheel's handles"
tar -xzf "$sdist" -C "$work/sdist"
cp -r "$work/sdist/mcp_handles-$version/example_server" .
"${user[@]}" python -c '
from pathlib import Path
import handles, example_server
assert Path(example_server.__file__).parent == Path.cwd() / "example_server", example_server.__file__
assert "site-packages" in Path(handles.__file__).parts, handles.__file__
'
"${user[@]}" python -m example_server.demo --job-seconds 2

rm -rf "$work"
trap - EXIT
echo
echo "check_dist: the wheel and the sdist of mcp-handles $version are what a user needs ($((SECONDS - started))s)"
