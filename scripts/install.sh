# Sourced by the setup scripts: `venv_install VENV ARGS...` installs into VENV with uv's pip interface (the same
# resolution as pip, several times faster; wheels are byte-compiled as pip does). torch goes in first with pip itself
# (`venv_install_torch VENV`), so pip's configured wheel folders and indexes give the CPU build; the constraints file
# keeps it. Nothing here is needed at run time.
UV_VERSION=0.13.9
venv_bootstrap() {  # venv_bootstrap VENV: a venv with pip and uv, repairing what an interrupted run left
    local venv=$1
    # Ctrl-C during `python -m venv` leaves a python without pip; venv over the same folder finishes the job and
    # keeps what is installed.
    "$venv/bin/python" -m pip --version >/dev/null 2>&1 || python3 -m venv "$venv"
    "$venv/bin/uv" --version >/dev/null 2>&1 || "$venv/bin/python" -m pip install -q --force-reinstall "uv==$UV_VERSION"
}
venv_install_torch() { "$1/bin/python" -m pip install -q -c constraints.txt torch==2.13.0; }
venv_install() {
    local venv=$1; shift
    "$venv/bin/uv" pip install --python "$venv/bin/python" --compile-bytecode -q -c constraints.txt "$@"
}
