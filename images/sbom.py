"""Writes the CycloneDX SBOM of one of Sluice's images: the image as the described component, holding the
binary's crates (from `cargo cyclonedx`, dev-dependencies excluded) and the Debian packages of the runtime
base (from the control files images/assemble-base.sh leaves in /var/lib/dpkg/status.d).

Run by images/build.sh:

  python3 images/sbom.py --crates target/images/sbom/crates/sluice-operator_bin.cdx.json --workspace "$PWD" \
    --image localhost/sluice-operator:0.1.0 --rootfs target/images/rootfs \
    --out target/images/sbom/sluice-operator.cdx.json

The crates' part is reproducible (SOURCE_DATE_EPOCH set: no random serial number, a fixed timestamp);
the Debian part follows the archive's security updates, so SBOMs are build artifacts, not checked in.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import urllib.parse


def deb_components(rootfs: pathlib.Path, distro: str):
    """One component per Debian package unpacked into the base, with its purl."""
    out = []
    for control in sorted((rootfs / "var/lib/dpkg/status.d").iterdir()):
        fields = {}
        for line in control.read_text().splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
        purl = (
            f"pkg:deb/debian/{name}@{urllib.parse.quote(version, safe='')}"
            f"?arch={arch}&distro={distro}"
        )
        component = {
            "type": "library",
            "bom-ref": purl,
            "name": name,
            "version": version,
            "purl": purl,
            "properties": [{"name": "dev.sluice:layer", "value": "runtime-base"}],
        }
        if "Source" in fields:
            component["properties"].append({"name": "debian:source", "value": fields["Source"].split()[0]})
        out.append(component)
    return out


def os_release(rootfs: pathlib.Path):
    fields = {}
    for line in (rootfs / "usr/lib/os-release").read_text().splitlines():
        key, _, value = line.partition("=")
        fields[key] = value.strip('"')
    return fields


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crates", required=True, type=pathlib.Path, help="cargo cyclonedx JSON of the binary's package")
    ap.add_argument("--workspace", required=True, help="the checkout's root: its path is left out of bom-refs")
    ap.add_argument("--image", required=True, help="the image's name (repository:tag)")
    ap.add_argument("--rootfs", required=True, type=pathlib.Path, help="the runtime base's root filesystem")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    args = ap.parse_args()

    # Workspace crates are referenced by absolute path (`path+file:///home/you/sluice/crds#...`): made
    # relative to the checkout, so the SBOM does not depend on where it was built.
    text = args.crates.read_text().replace(f"path+file://{args.workspace.rstrip('/')}/", "path+file:./")
    bom = json.loads(text)
    binary = bom["metadata"]["component"]
    # The manifest digest of the image as built (a push may recompress layers, giving another digest).
    digest = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Digest}}", args.image],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    repository, _, tag = args.image.rpartition(":")
    osr = os_release(args.rootfs)
    distro = f"{osr.get('ID', 'debian')}-{osr.get('VERSION_ID', '')}"
    image_ref = (
        f"pkg:oci/{repository.rsplit('/', 1)[-1]}@{urllib.parse.quote(digest, safe='')}"
        f"?repository_url={urllib.parse.quote(repository, safe='/')}&tag={tag}"
    )

    debs = deb_components(args.rootfs, distro)
    os_component = {
        "type": "operating-system",
        "bom-ref": f"os:{distro}",
        "name": osr.get("ID", "debian"),
        "version": osr.get("VERSION_ID", ""),
        "description": osr.get("PRETTY_NAME", ""),
    }
    bom["metadata"]["component"] = {
        "type": "container",
        "bom-ref": image_ref,
        "name": repository,
        "version": tag,
        "purl": image_ref,
        "hashes": [{"alg": "SHA-256", "content": digest.removeprefix("sha256:")}],
        "description": f"{binary['name']} on a runtime base of Debian packages",
    }
    bom["components"] = [binary, os_component, *debs, *bom.get("components", [])]
    deps = bom.setdefault("dependencies", [])
    deps.insert(0, {"ref": image_ref, "dependsOn": [binary["bom-ref"], os_component["bom-ref"]]})
    deps.insert(1, {"ref": os_component["bom-ref"], "dependsOn": [d["bom-ref"] for d in debs]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(bom, indent=2, sort_keys=False) + "\n")
    print(
        f"sbom: {args.out} ({len(bom['components']) - len(debs) - 1} crates, {len(debs)} Debian packages)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
