#!/bin/sh
# ompi_info sees the component and every parameter it registers.
. "$(dirname "$0")/common.sh"

out="$scratch/info.txt"
"$TB_OMPI_INFO" > "$out" 2>&1
major=$(echo "$TB_OMPI_BTL_VERSION" | cut -c1)
minor=$(echo "$TB_OMPI_BTL_VERSION" | cut -c2)
if grep -q "MCA btl: tbrdma (MCA v2.1.0, API v$major.$minor.0" "$out"; then
    ok "ompi_info lists btl tbrdma with API v$major.$minor.0"
else
    not_ok "ompi_info does not list btl tbrdma"; grep -i btl "$out"
fi

"$TB_OMPI_INFO" --param btl tbrdma --level 9 > "$out" 2>&1
for p in verbs_library if_include if_exclude lanes small_frame_size bulk_frame_size recv_depth \
         qps_per_device peer_timeout stall_timeout rto_min checksum free_list_num free_list_max free_list_inc \
         eager_limit max_send_size exclusivity; do
    if grep -q "parameter \"btl_tbrdma_$p\"" "$out"; then
        ok "parameter btl_tbrdma_$p registered"
    else
        not_ok "parameter btl_tbrdma_$p missing"
    fi
done
if grep -A1 'btl_tbrdma_recv_depth"' "$out" | grep -q "Receives kept posted"; then
    ok "parameters carry help text"
else
    not_ok "btl_tbrdma_recv_depth has no help text"
fi
finish
