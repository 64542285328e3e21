# The operator image: build the release binary, then copy it alone into a distroless image that
# runs as the unprivileged "nonroot" user (65532), as the Helm chart's securityContext expects.
#   docker build -t <registry>/valkey-operator:0.1.0 .
# (Not built in this repository's CI: there is no container engine on the build machines.)

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin valkey-operator \
    && cp target/release/valkey-operator /valkey-operator

# glibc and libgcc only (ring's assembly needs nothing more); no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /valkey-operator /usr/local/bin/valkey-operator
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/valkey-operator"]
CMD ["serve", "--listen", "0.0.0.0:8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"]
