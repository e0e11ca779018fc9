# Container images for Sluice's two binaries, from one multi-stage build. With a registry to pull from
# (Docker with BuildKit, Podman or Buildah):
#
#   docker build --target operator -t ghcr.io/sluice-dev/sluice-operator:0.1.0 .
#   docker build --target sidecar  -t ghcr.io/sluice-dev/sluice-sidecar:0.1.0 .
#
# The binaries are compiled in the `compile` stage (the toolchain rust-toolchain.toml pins) and copied onto
# distroless `cc` (glibc, libgcc, CA certificates, zone data; no shell, no package manager), running as
# the `nonroot` user, UID/GID 65532: the UID the Helm chart and the webhook's injected sidecar set in
# `runAsUser`, with `readOnlyRootFilesystem: true` (neither binary writes to disk). TLS is rustls, so no
# OpenSSL is needed.
#
# Without a registry (how `make images` builds them), two build arguments replace the two pulls:
#
#   RUNTIME_BASE=localhost/sluice-runtime-base:debian12   a base assembled from Debian packages by
#                                                         images/assemble-base.sh (same contents as above)
#   BINARIES=prebuilt                                     take the binaries from the build context instead
#                                                         of compiling them: the context is a directory
#                                                         holding only `sluice-operator` and `sluice-sidecar`
#                                                         (built with `cargo build --release` on a host of
#                                                         the same Debian release as the base, stripped)
#
#   podman build --build-arg RUNTIME_BASE=... --build-arg BINARIES=prebuilt --target sidecar \
#     -t sluice-sidecar:dev -f Dockerfile target/images/context
#
# The stage BINARIES does not name is never built (BuildKit, and Buildah ≥ 1.27, skip unused stages).

ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARIES=compile

# ---- binaries, compiled here ---------------------------------------------------------------------
FROM docker.io/library/rust:1.95.0-slim-bookworm AS compile
WORKDIR /src
COPY . .
# Cache the registry and target dir between builds; copy the binaries out of the cache, stripped (the
# release profile keeps line tables for backtraces: four times the size).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice-operator -p sluice-sidecar \
    && mkdir -p /out \
    && strip --strip-all -o /out/sluice-operator target/release/sluice-operator \
    && strip --strip-all -o /out/sluice-sidecar target/release/sluice-sidecar

# ---- binaries, built beforehand and given as the build context ------------------------------------
FROM scratch AS prebuilt
# Names this stage's image, so a build script can prune the copies older binaries left behind.
LABEL dev.sluice.stage=prebuilt-binaries
COPY sluice-operator sluice-sidecar /out/

# ---- the binaries of whichever stage BINARIES names ----------------------------------------------
FROM ${BINARIES} AS binaries

# ---- sluice-operator -----------------------------------------------------------------------------
FROM ${RUNTIME_BASE} AS operator
LABEL org.opencontainers.image.title="sluice-operator" \
      org.opencontainers.image.description="Sluice's Kubernetes operator: RateLimitPolicy and JobQueue controllers, sidecar injection webhook, external metrics API" \
      org.opencontainers.image.source="https://github.com/sluice-dev/sluice" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binaries /out/sluice-operator /usr/local/bin/sluice-operator
USER 65532:65532
# The chart passes `run`; `probe URL` serves the helm test hook (no shell in this image).
ENTRYPOINT ["/usr/local/bin/sluice-operator"]
CMD ["run"]

# ---- sluice-sidecar ------------------------------------------------------------------------------
FROM ${RUNTIME_BASE} AS sidecar
LABEL org.opencontainers.image.title="sluice-sidecar" \
      org.opencontainers.image.description="Sluice's sidecar: rate-limiting reverse proxy with limits in Redis, and job-queue worker" \
      org.opencontainers.image.source="https://github.com/sluice-dev/sluice" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binaries /out/sluice-sidecar /usr/local/bin/sluice-sidecar
USER 65532:65532
# Proxy role by default (`--config /etc/sluice/config.yaml`, set by the webhook); workers run
# `sluice-sidecar worker --config ...` (set by the JobQueue controller).
ENTRYPOINT ["/usr/local/bin/sluice-sidecar"]
