# Shared by the guest-side scripts (sourced). The cluster's description lives in
# $VC_STATE: config (hosts, topology, loss), hostfile, cables (one line per cable end:
# host, interface, rdma device, peer host, peer interface, IPv4, peer IPv4), uts/hK.
# shellcheck shell=bash

VC_STATE=/run/tbrdma-vc

vc_fail() {
    printf 'tbrdma-vc: error: %s\n' "$*" >&2
    exit 1
}

vc_mgmt_ip() { printf '10.99.0.%d\n' "$(($1 + 1))"; }

# Cable C is the /30 subnet 10.100.C.0; its ends are .1 and .2.
vc_cable_ip() { printf '10.100.%d.%d\n' "$1" "$2"; }

# Frame loss (and, through the jitter of a small delay, some reordering) on one cable
# end; nothing when PCT is 0.
vc_apply_loss() {
    local h=$1 ifc=$2 pct=$3
    if [ "$pct" = 0 ]; then
        ip netns exec "$h" tc qdisc del dev "$ifc" root 2>/dev/null || true
        return 0
    fi
    ip netns exec "$h" tc qdisc replace dev "$ifc" root netem loss "$pct%" \
        delay 50us reorder 10% ||
        vc_fail "tc netem on $h:$ifc failed (is sch_netem loaded?)"
}

vc_config() { sed -n "s/^$1=//p" "$VC_STATE/config"; }

vc_check_host() {
    if ! [[ $1 =~ ^h[0-9]+$ ]] || ! ip netns list | grep -qw "$1"; then
        vc_fail "no host '$1' (hosts are h0..h$(($(vc_config hosts) - 1)))"
    fi
}

# Runs a command in host H: its network namespace (with its own /sys view, hence only
# its own RDMA devices) and its UTS namespace (hostname H).
vc_on() {
    local h=$1
    shift
    exec nsenter --uts="$VC_STATE/uts/$h" ip netns exec "$h" "$@"
}
