#!/usr/bin/env bash
# Assembles the runtime base of Sluice's images from Debian packages, without a container registry, and
# imports it into the local container storage:
#
#   images/assemble-base.sh OUT_DIR IMAGE     e.g. target/images localhost/sluice-runtime-base:debian12
#
# The base holds what distroless `cc` holds for a Rust binary: glibc (libc6), libgcc-s1, the CA bundle
# (ca-certificates), zone data (tzdata), /etc/services and /etc/protocols (netbase), the os-release files
# and licence texts (base-files), and passwd/group entries for `nonroot`, UID/GID 65532. No shell, no
# package manager, no other program. The packages are fetched with `apt-get download` from the machine's
# own apt sources (checked against the archive's signed indexes), so the base is the host's Debian release
# and matches the glibc that binaries built on the host link against.
#
# Each package is unpacked with `dpkg-deb -x` (no maintainer scripts run); what a maintainer script would
# have generated is written here (the CA bundle). A package's control fields go to
# /var/lib/dpkg/status.d/<package>, where SBOM and vulnerability scanners look for them in distroless
# images. The root filesystem is packed as a reproducible tar (sorted, fixed owners and times): when the
# packages have not changed, the tar's digest is the same and the image already imported is kept, so
# image builds on top of it stay cached.
#
# Needs root (file owners), dpkg-deb, apt-get and podman.
set -euo pipefail

out=${1:?usage: assemble-base.sh OUT_DIR IMAGE}
image=${2:?usage: assemble-base.sh OUT_DIR IMAGE}
packages=(libc6 libgcc-s1 ca-certificates tzdata netbase base-files)
label=dev.sluice.base.rootfs-sha256

if [ "$(id -u)" != 0 ]; then
  echo "assemble-base: must run as root (the root filesystem's files are owned by root and UID 65532)" >&2
  exit 1
fi

debs="$out/debs"
rootfs="$out/rootfs"
tarball="$out/runtime-base.tar"
mkdir -p "$debs"
rm -rf "$rootfs" "$debs"/*.deb
mkdir -p "$rootfs"

# The sandboxed `_apt` user cannot write to a directory owned by root; the download is verified by apt.
download() { (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "${packages[@]}"); }
if ! download; then
  echo "assemble-base: apt-get download failed; refreshing the package lists with apt-get update" >&2
  apt-get update -qq
  download
fi

mkdir -p "$rootfs/var/lib/dpkg/status.d"
for pkg in "${packages[@]}"; do
  deb=$(ls "$debs/${pkg}"_*.deb)
  if [ "$pkg" = base-files ]; then
    # Only the files that say what the system is, and the licence texts copyright files refer to; the
    # rest of base-files is a shell's profile, motd and an empty FHS tree.
    tmp=$(mktemp -d)
    dpkg-deb -x "$deb" "$tmp"
    mkdir -p "$rootfs/etc" "$rootfs/usr/lib" "$rootfs/usr/share/doc/base-files"
    cp -a "$tmp/etc/os-release" "$tmp/etc/debian_version" "$rootfs/etc/"
    cp -a "$tmp/usr/lib/os-release" "$rootfs/usr/lib/"
    cp -a "$tmp/usr/share/common-licenses" "$rootfs/usr/share/"
    cp -a "$tmp/usr/share/doc/base-files/copyright" "$rootfs/usr/share/doc/base-files/"
    rm -rf "$tmp"
  else
    dpkg-deb -x "$deb" "$rootfs"
  fi
  { dpkg-deb -f "$deb" Package; echo "Status: install ok installed"; dpkg-deb -f "$deb" | sed 1d; } \
    | sed '1s/^/Package: /' >"$rootfs/var/lib/dpkg/status.d/$pkg"
done

# What ca-certificates' postinst (update-ca-certificates) would generate: every certificate of the
# package in one PEM bundle, at the path OpenSSL and rustls-native-certs read. Then the package's
# sources and its script go.
find "$rootfs/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat >"$rootfs/etc/ssl/certs/ca-certificates.crt"
grep -q 'BEGIN CERTIFICATE' "$rootfs/etc/ssl/certs/ca-certificates.crt"
rm -rf "$rootfs/usr/share/ca-certificates" "$rootfs/etc/ca-certificates" "$rootfs/usr/sbin"

# Pruned: iconv modules (nothing here calls iconv), manuals, lintian overrides, documentation other
# than the copyright files.
rm -rf "$rootfs"/usr/lib/*/gconv "$rootfs/usr/share/man" "$rootfs/usr/share/info" "$rootfs/usr/share/lintian"
find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
find "$rootfs/usr/share/doc" -depth -type d -empty -delete

# Users: root, nobody and nonroot (65532), as in distroless; no login shell exists.
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
# /etc/hosts before DNS (glibc's default without this file asks DNS first).
cat >"$rootfs/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
shadow: files
hosts: files dns
networks: files
protocols: files
services: files
EOF
chmod 644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
install -d -m 0700 "$rootfs/root"
install -d -m 0700 -o 65532 -g 65532 "$rootfs/home/nonroot"
install -d -m 1777 "$rootfs/tmp"

if find "$rootfs" \( -name sh -o -name bash -o -name dash -o -name busybox \) | grep -q .; then
  echo "assemble-base: a shell is in the root filesystem" >&2
  exit 1
fi

# Reproducible: files newer than the newest packaged file get its time; owners stay numeric.
epoch=$(find "$rootfs/usr/lib" "$rootfs/usr/share/zoneinfo" -type f -printf '%T@\n' | sort -n | tail -1 | cut -d. -f1)
tar --sort=name --format=gnu --numeric-owner --mtime="@$epoch" --clamp-mtime -C "$rootfs" -cf "$tarball" .
sum=$(sha256sum "$tarball" | cut -d' ' -f1)

if [ "$(podman image inspect --format "{{ index .Labels \"$label\" }}" "$image" 2>/dev/null || true)" = "$sum" ]; then
  echo "assemble-base: $image is up to date (root filesystem sha256:$sum)"
  exit 0
fi
podman import --quiet \
  --change "USER=65532:65532" \
  --change "WORKDIR=/home/nonroot" \
  --change "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
  --change "LABEL=$label=$sum" \
  "$tarball" "$image" >/dev/null
echo "assemble-base: imported $image ($(du -m "$tarball" | cut -f1) MB; $(for p in "${packages[@]}"; do
  printf '%s=%s ' "$p" "$(sed -n 's/^Version: //p' "$rootfs/var/lib/dpkg/status.d/$p")"; done))"
