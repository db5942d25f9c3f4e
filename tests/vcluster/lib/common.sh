# Host-side helpers shared by run, selftest and build-image (sourced, not run).
# shellcheck shell=bash

VC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC2034 # used by the scripts that source this file
VC_CACHE=${TBRDMA_VC_CACHE:-/var/tmp/tbrdma-vcluster}
# shellcheck disable=SC2034
VC_RELEASES="trixie bookworm"

vc_die() {
    printf 'tbrdma-vcluster: error: %s\n' "$*" >&2
    exit "${VC_DIE_STATUS:-125}"
}

vc_log() {
    printf 'tbrdma-vcluster: %s\n' "$*" >&2
}

# The Debian mirror: $TBRDMA_VC_MIRROR, else the first plain Debian archive URI in the
# host's apt sources (CI machines are set up to reach only that mirror).
vc_mirror() {
    if [ -n "${TBRDMA_VC_MIRROR:-}" ]; then
        printf '%s\n' "${TBRDMA_VC_MIRROR%/}"
        return
    fi
    local url
    url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
              /etc/apt/sources.list.d/*.sources 2>/dev/null |
          sed -n -e 's/^URIs:[[:space:]]*//p' \
                 -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' |
          tr ' ' '\n' | grep -E '^https?://.*/debian/?$' | head -n 1 || true)
    [ -n "$url" ] || vc_die "no Debian mirror in /etc/apt/sources.list*; set TBRDMA_VC_MIRROR"
    printf '%s\n' "${url%/}"
}

# Cache key of a release's image: what built it (scripts, package list, PID 1) plus
# release and mirror. Any change gives a new key, hence a rebuild.
vc_image_key() {
    local release=$1 mirror=$2
    {
        cat "$VC_DIR/lib/build-image" "$VC_DIR/lib/packages.list" "$VC_DIR/guest/pid1"
        printf 'release=%s\nmirror=%s\n' "$release" "$mirror"
    } | sha256sum | cut -c1-16
}

# Host tools needed to build and boot images; installed when missing (CI starts clean).
vc_host_deps() {
    local missing=() tool
    for tool in qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap \
                mkfs.ext4:e2fsprogs; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
    done
    [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || vc_die "missing host packages (${missing[*]}); install them as root"
    vc_log "installing host packages: ${missing[*]}"
    apt-get update -qq >&2 || vc_die "apt-get update failed; check the host's apt sources"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2 || vc_die "apt-get install ${missing[*]} failed"
}
