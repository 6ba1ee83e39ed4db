# The Heddle API server. Built by docker/build-images.sh from the release binary compiled
# on the host; several replicas may share one Postgres.
# build-images.sh passes the base: debian:bookworm-slim by digest, or a local debootstrap.
ARG BASE_IMAGE=debian:bookworm-slim@sha256:abd67ffcfa541b485a3dff59865ab629aa048a6c613e639d36e7456b0b229241
FROM ${BASE_IMAGE}
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home --uid 10001 heddle
COPY dashboard /usr/share/heddle/dashboard
COPY heddle-server /usr/local/bin/heddle-server
ENV HEDDLE_LISTEN=0.0.0.0:8080 \
    HEDDLE_DASHBOARD_DIR=/usr/share/heddle/dashboard \
    HEDDLE_LOG_JSON=true
USER heddle
EXPOSE 8080
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/heddle-server"]
