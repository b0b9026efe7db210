# Sourced by the setup scripts: `venv_install VENV ARGS...` installs into VENV with uv's pip interface (the same
# resolution as pip, several times faster; wheels are byte-compiled as pip does). torch goes in first with pip itself
# (`venv_install_torch VENV`), so pip's configured wheel folders and indexes give the CPU build; the constraints file
# keeps it. Nothing here is needed at run time.
UV_VERSION=0.13.9
venv_bootstrap() {  # venv_bootstrap VENV: a venv with pip and uv
    local venv=$1
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    [ -x "$venv/bin/uv" ] || "$venv/bin/python" -m pip install -q "uv==$UV_VERSION"
}
venv_install_torch() { "$1/bin/python" -m pip install -q -c constraints.txt torch==2.13.0; }
venv_install() {
    local venv=$1; shift
    "$venv/bin/uv" pip install --python "$venv/bin/python" --compile-bytecode -q -c constraints.txt "$@"
}
