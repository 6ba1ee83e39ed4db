# The Heddle node agent, with the user-space RDMA stack (rdma-core: libibverbs, librdmacm
# and the mlx5/efa/... providers), perftest (ib_write_bw, ...) and UCX (ucx_perftest).
#
# NVIDIA libraries (libnvidia-ml, libcuda, libnccl) are not in the image: the NVIDIA
# container runtime mounts the host's into the container; the agent loads them at run time
# and reports their absence otherwise. Run it with the host's network and devices:
#
#   docker run -d --name heddle-agent --net=host --runtime=nvidia --gpus all \
#     --device=/dev/infiniband --cap-add=IPC_LOCK --ulimit memlock=-1 \
#     -v /sys:/sys:ro -v /var/lib/heddle-agent:/var/lib/heddle-agent \
#     -e HEDDLE_SERVER=http://heddle:8080 -e HEDDLE_ENROLL_TOKEN=hde_... heddle-agent:dev
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
      ca-certificates tini iproute2 pciutils \
      rdma-core libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils perftest ucx-utils \
 && rm -rf /var/lib/apt/lists/*
COPY heddle-agent /usr/local/bin/heddle-agent
ENV HEDDLE_STATE_DIR=/var/lib/heddle-agent \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
VOLUME /var/lib/heddle-agent
# Root: registering RDMA memory and reading every sysfs attribute need it (with IPC_LOCK).
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/heddle-agent"]
CMD ["run"]
