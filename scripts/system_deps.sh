#!/usr/bin/env bash
# Installs the system packages the node side needs, from Debian's archive, if missing:
# gVisor's runsc, nftables, iproute2, busybox-static (the workload images' shell) and a
# C compiler with static libc (the counter workload). Needs root; without root it only
# says what is missing (the suites that need these then skip with the reason printed).
set -euo pipefail

want=()
command -v runsc >/dev/null 2>&1 || want+=(runsc)
command -v nft >/dev/null 2>&1 || want+=(nftables)
command -v ip >/dev/null 2>&1 || want+=(iproute2)
[ -x /usr/bin/busybox ] || [ -x /bin/busybox ] || want+=(busybox-static)
command -v gcc >/dev/null 2>&1 || want+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || want+=(libc6-dev)
command -v zstd >/dev/null 2>&1 || want+=(zstd)

if [ ${#want[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "system_deps: missing ${want[*]} (install them as root: apt-get install -y ${want[*]});" \
         "the suites that need them will skip" >&2
    exit 0
fi
echo "system_deps: installing ${want[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
