# Sourced by scripts/*: finds a Python >= 3.12 and keeps .venv up to date.

find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  # pyenv's shims answer only for the selected version, so look at the
  # installed interpreters directly, newest first.
  local root
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in $(ls -d "$root"/versions/3.* 2>/dev/null | sort -t. -k2,2nr -k3,3nr); do
    if [ -x "$candidate/bin/python3" ] \
       && "$candidate/bin/python3" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$candidate/bin/python3"; return 0
    fi
  done
  echo "no Python >= 3.12 found on PATH or under pyenv's versions/" >&2
  return 1
}

# ensure_venv EXTRA: create .venv if missing; (re)install when pyproject.toml
# changed since the last install.
ensure_venv() {
  local extra="$1"
  if [ ! -x .venv/bin/python ]; then
    "$(find_python)" -m venv .venv
  fi
  local stamp=".venv/.installed-$extra"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$extra]"
    touch "$stamp"
  fi
}
