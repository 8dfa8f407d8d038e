#!/usr/bin/env bash
# Builds the Debian package of Weir: target/deb/weir_<version>_<arch>.deb (or into
# $OUT_DIR). Contents: /usr/bin/weir, the systemd units of deploy/systemd
# (/lib/systemd/system), /etc/weir/weir.toml (a conffile), man pages and shell
# completions generated from the CLI, the Grafana dashboard, README and copyright.
# The package enables nothing: configure /etc/weir/weir.toml, then
#   systemctl enable --now weir-nbd.socket weir-admin.socket
# Purging it keeps the volumes' data (/var/lib/private/weir): VM disks are never
# removed by a package operation.
#
#   deploy/deb/build.sh                  # cargo build --release, then package
#   WEIR_BIN=path/to/weir deploy/deb/build.sh   # package that binary as it is
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in dpkg-deb dpkg objdump gzip; do
  command -v "$tool" >/dev/null || { echo "deb: $tool is missing (Debian: dpkg-dev, binutils, gzip)" >&2; exit 2; }
done
bin=${WEIR_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -p weir </dev/null
  bin=target/release/weir
fi
[ -x "$bin" ] || { echo "deb: no executable at $bin" >&2; exit 2; }
version=$("$bin" --version | awk 'NR == 1 { print $2 }')
case "$version" in [0-9]*) ;; *) echo "deb: cannot read a version from '$bin --version'" >&2; exit 2 ;; esac
arch=$(dpkg --print-architecture)
out=${OUT_DIR:-target/deb}
root=$out/weir_${version}_${arch}
rm -rf "$root"
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/weir" \
  "$root/usr/share/man/man1" "$root/usr/share/doc/weir" "$root/usr/share/weir/grafana" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
  "$root/usr/share/fish/vendor_completions.d"

install -m 0755 "$bin" "$root/usr/bin/weir"
strip --strip-unneeded "$root/usr/bin/weir" 2>/dev/null || true
install -m 0644 deploy/systemd/weir.service deploy/systemd/weir-nbd.socket \
  deploy/systemd/weir-admin.socket "$root/lib/systemd/system/"
install -m 0644 deploy/deb/weir.toml "$root/etc/weir/weir.toml"
install -m 0644 deploy/grafana/weir.json "$root/usr/share/weir/grafana/weir.json"
"$root/usr/bin/weir" man --dir "$root/usr/share/man/man1" >/dev/null
gzip -9n "$root"/usr/share/man/man1/*.1
"$root/usr/bin/weir" completions bash >"$root/usr/share/bash-completion/completions/weir"
"$root/usr/bin/weir" completions zsh >"$root/usr/share/zsh/vendor-completions/_weir"
"$root/usr/bin/weir" completions fish >"$root/usr/share/fish/vendor_completions.d/weir.fish"
install -m 0644 README.md "$root/usr/share/doc/weir/README.md"
gzip -9n "$root/usr/share/doc/weir/README.md"
cat >"$root/usr/share/doc/weir/copyright" <<'COPY'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: weir
Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
COPY

# The newest glibc symbol version the binary needs is its libc6 dependency.
glibc=$(objdump -T "$root/usr/bin/weir" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
size_kib=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CTL
Package: weir
Version: $version
Architecture: $arch
Maintainer: Weir developers <weir@localhost>
Depends: libc6 (>= $glibc)
Recommends: systemd
Suggests: librbd1, nbd-client, qemu-utils
Installed-Size: $size_kib
Section: admin
Priority: optional
Description: storage QoS server, simulator and workload lab for virtualized data centers
 weir serve exports volumes over NBD with per-volume service levels
 (reservations, limits, shares, latency targets) and datastore-wide
 congestion control; weir sim simulates a storage architecture on a
 virtual clock with the same QoS code; weir load drives Iometer-style
 and VDI/OLTP/Exchange workloads against either.
CTL
echo /etc/weir/weir.toml >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/postinst" <<'SH'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
  echo "weir: edit /etc/weir/weir.toml, then: systemctl enable --now weir-nbd.socket weir-admin.socket"
fi
SH
cat >"$root/DEBIAN/prerm" <<'SH'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop weir.service weir-nbd.socket weir-admin.socket >/dev/null 2>&1 || true
fi
SH
cat >"$root/DEBIAN/postrm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
fi
if [ "$1" = purge ] && [ -d /var/lib/private/weir ]; then
  echo "weir: volume data kept in /var/lib/private/weir (remove it by hand if you mean to)"
fi
SH
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
deb="$out/weir_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
rm -rf "$root"
echo "$deb"
