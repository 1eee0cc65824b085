#!/usr/bin/env bash
# Prints the home of the first JDK (with javac) whose version is at least $1, from JAVA_HOME,
# java on PATH, or /usr/lib/jvm/*; prints nothing when there is none.
min=${1:-17}
version() { "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1; }
candidates=("${JAVA_HOME:-}")
if command -v javac >/dev/null; then
  candidates+=("$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")")
fi
for d in /usr/lib/jvm/*; do candidates+=("$d"); done
for home in "${candidates[@]}"; do
  if [ -n "$home" ] && [ -x "$home/bin/javac" ] && [ "$(version "$home")" -ge "$min" ] 2>/dev/null; then
    echo "$home"
    exit 0
  fi
done
