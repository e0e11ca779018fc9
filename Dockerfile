# Container images for Sluice's two binaries, from one multi-stage build:
#
#   docker build --target operator -t ghcr.io/sluice-dev/sluice-operator:0.1.0 .
#   docker build --target sidecar  -t ghcr.io/sluice-dev/sluice-sidecar:0.1.0 .
#
# NOT BUILT OR TESTED HERE: the machines Sluice is developed on have no container engine. The e2e tests
# and the sandbox run the same binaries as local processes instead (see e2e/README.md).
#
# Runtime images are distroless `cc` (glibc, libgcc, CA certificates; no shell, no package manager)
# running as the `nonroot` user, UID/GID 65532 — the UID the Helm chart and the webhook's injected
# sidecar set in `runAsUser`, with `readOnlyRootFilesystem: true`: neither binary writes to disk.
# TLS is rustls throughout (kube, fred, sqlx), so no OpenSSL is needed.

# ---- build ---------------------------------------------------------------------------------------
# The toolchain rust-toolchain.toml pins.
FROM docker.io/library/rust:1.95.0-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cache the registry and target dir between builds (BuildKit); copy the binaries out of the cache.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice-operator -p sluice-sidecar \
    && mkdir -p /out \
    && cp target/release/sluice-operator target/release/sluice-sidecar /out/

# ---- sluice-operator -----------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
LABEL org.opencontainers.image.title="sluice-operator" \
      org.opencontainers.image.source="https://github.com/sluice-dev/sluice" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/sluice-operator /usr/local/bin/sluice-operator
USER 65532:65532
# The chart passes `run`; `probe URL` serves the helm test hook (no shell in this image).
ENTRYPOINT ["/usr/local/bin/sluice-operator"]
CMD ["run"]

# ---- sluice-sidecar ------------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot AS sidecar
LABEL org.opencontainers.image.title="sluice-sidecar" \
      org.opencontainers.image.source="https://github.com/sluice-dev/sluice" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/sluice-sidecar /usr/local/bin/sluice-sidecar
USER 65532:65532
# Proxy role by default (`--config /etc/sluice/config.yaml`, set by the webhook); workers run
# `sluice-sidecar worker --config ...` (set by the JobQueue controller).
ENTRYPOINT ["/usr/local/bin/sluice-sidecar"]
